"""dorylus-py: GNN training on CPU graph servers with serverless tensor workers.

After *Dorylus* (Thorpe et al., OSDI 2021). The package is organised one concept per module; see
``docs/architecture.md`` for the map.
"""

__version__ = "0.1.0"
