"""dorylus-py: GNN training on CPU graph servers with serverless tensor workers.

After *Dorylus* (Thorpe et al., OSDI 2021). The package is organised one concept per module; see
``docs/architecture.md`` for the map.

The Python API (``api.py``)::

    from dorylus_py import train, predict, TrainConfig
    run = train(TrainConfig(data="graph.npz", epochs=50), out="runs/demo")
    probabilities = predict(run.run_dir).probabilities

Its names are loaded when first used, so ``import dorylus_py`` (and the CLI's ``--help``) stays light.
"""

__version__ = "0.1.0"

_API = {"train": "dorylus_py.api", "predict": "dorylus_py.api", "TrainRun": "dorylus_py.api",
        "TrainConfig": "dorylus_py.config", "DorylusError": "dorylus_py.errors",
        "ConfigError": "dorylus_py.errors", "DataError": "dorylus_py.errors"}
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'dorylus_py' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_API[name]), name)
