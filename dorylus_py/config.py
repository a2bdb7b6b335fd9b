"""Typed settings: a training run's (in sections, passed everywhere and saved in the run record) and
`dorylus synth`'s. Each field is declared once, with its default and help (``settings.py``), and the
CLI's flags are generated from it. Only the standard library is imported here, so the CLI parses flags
(and answers ``--help``) without loading numpy or torch.

A :class:`TrainConfig` is made of sections (``sections.py``), each checking its own values: :class:`RunSettings` (data,
epochs, seed), :class:`ModelSettings`, :class:`PipelineSettings` (backend, servers, chunks, modes),
:class:`PoolSettings` (the Lambda pool and its emulation), :class:`AwsSettings`,
:class:`RecoverySettings` (timeouts, checkpoints, restarts) and :class:`GossipSettings`; the checks that
relate sections are :meth:`TrainConfig.check`'s. Field names are unique across sections: a
``TrainConfig`` is made from them flat (``TrainConfig(epochs=4, chunks=2)``), reads them flat
(``cfg.hidden``) or by section (``cfg.gnn.hidden``), and writes them flat (:meth:`TrainConfig.to_dict`).
"""

from __future__ import annotations

import numbers
import os
from dataclasses import asdict, dataclass, replace

from dorylus_py import settings_doc
from dorylus_py.devices import cuda_devices, device_for, device_list
from dorylus_py.errors import ConfigError
from dorylus_py.models.architectures import architecture
from dorylus_py.sections import (  # noqa: F401  (re-exported: what a run's settings are made of)
    DECENTRAL_MODES,
    FIELD_TYPES,
    INPROC_BACKENDS,
    LAMBDA_BACKENDS,
    SECTION_OF,
    SECTIONS,
    AwsSettings,
    GossipSettings,
    ModelSettings,
    PipelineSettings,
    PoolSettings,
    RecoverySettings,
    RunSettings,
    ScaleSettings,
    at_least,
)
from dorylus_py.settings import AUTO, check_number, check_split, fits
from dorylus_py.spelling import nearest, python_words

# The keywords of the Python ``train()`` that are not settings (api.py): named when a TrainConfig is given one.
TRAIN_KEYWORDS = ("out", "overwrite", "sources", "cluster", "resume", "no_data_copy", "progress")


@dataclass(frozen=True, init=False)
class TrainConfig:
    """A training run's settings: its sections, made flat (``TrainConfig(epochs=4)``) or by section."""

    run: RunSettings
    gnn: ModelSettings
    pipeline: PipelineSettings
    pool: PoolSettings
    aws: AwsSettings
    recovery: RecoverySettings
    gossip: GossipSettings
    scale: ScaleSettings

    def __init__(self, **values):
        """Settings by name, flat (``lambdas="auto"`` is :data:`AUTO`), or whole sections by section name;
        each value's type and range checked here (a ConfigError naming the setting)."""
        with python_words():
            by_section: dict[str, dict] = {name: {} for name in SECTIONS}
            for name, value in values.items():
                if name in SECTIONS:
                    continue
                section = SECTION_OF.get(name) or _unknown(name)
                by_section[section][name] = _typed(name, value)
            for name, cls in SECTIONS.items():
                base = values.get(name) or cls()
                object.__setattr__(self, name, replace(base, **by_section[name]) if by_section[name] else base)
            for name in SECTIONS:  # each section's numbers finite and within bounds first, then its own checks
                getattr(self, name).check_limits()
                getattr(self, name).check()

    def __getattr__(self, name: str):
        section = SECTION_OF.get(name)
        if section is None:
            raise AttributeError(f"TrainConfig has no setting {name!r}")
        return getattr(object.__getattribute__(self, section), name)

    def to_dict(self) -> dict:
        """Every setting by name, flat, as JSON takes it (``auto`` as the string)."""
        return {k: ("auto" if v is AUTO else v) for name in SECTIONS for k, v in asdict(getattr(self, name)).items()}

    @classmethod
    def from_dict(cls, values: dict) -> "TrainConfig":
        """The settings :meth:`to_dict` wrote, each checked against its field as any TrainConfig's are;
        ``auto`` back to :data:`AUTO`. Every name must be a setting."""
        if not isinstance(values, dict):
            raise ConfigError("the settings must be an object")
        unknown = sorted(set(values) - set(SECTION_OF))
        if unknown:
            raise ConfigError(f"unknown settings {unknown[:5]}")
        return cls(**values)

    def check(self) -> None:
        """What relates the sections (each section's own values were checked when it was made)."""
        with python_words():
            self._check_related()

    def _check_related(self) -> None:
        p, pool = self.pipeline, self.pool
        if pool.lambdas is AUTO and p.backend not in LAMBDA_BACKENDS:
            raise ConfigError(f"--lambdas auto sizes Lambda pools (--backend local or lambda); --backend {p.backend} "
                              "has none")
        if p.mode in DECENTRAL_MODES:
            self._check_decentral()
        elif p.backend != "reference":
            self._check_distributed()
        if p.local_barrier is True and p.mode != "async":
            raise ConfigError("--local-barrier is for --mode async (in sync mode every stage waits for every chunk; "
                              "gossip and allreduce have no graph servers)")
        stale = [f for f, on in (("--stale-smoothing", p.stale_smoothing not in (AUTO, 0)),
                                 ("--stale-step", p.stale_step != "none"),
                                 ("--predict-weights", p.predict_weights),
                                 ("--fresh-wait-ms", p.fresh_wait_ms not in (AUTO, 0))) if on]
        if stale and (p.mode != "async" or not p.distributed):
            raise ConfigError(f"{stale[0]} is for --mode async on the distributed backends (sync mode reads no stale "
                              "rows or gradients)")
        if p.sync_epochs and (p.mode != "async" or not p.distributed):
            raise ConfigError("--sync-epochs is for --mode async on the distributed backends (in sync mode every epoch "
                              "has its barriers)")
        if p.remat and not p.distributed or p.remat and p.mode != "sync":
            raise ConfigError("--remat is for --mode sync on the distributed backends (local, lambda, cpu, gpu): "
                              "asynchronous chunks read each other's rows at different stages, so no buffer is free")
        if (self.recovery.resume or self.recovery.checkpoint_every) and not p.distributed:
            raise ConfigError("--checkpoint-every and --resume are for the distributed backends (local, lambda, cpu, gpu)")

    def _check_distributed(self) -> None:
        p, pool = self.pipeline, self.pool
        if p.switch_threshold and (p.mode != "async" or not self.run.target_acc):
            raise ConfigError("--switch-threshold needs --mode async and --target-acc")
        if p.switch_threshold and p.async_update != "epoch":
            raise ConfigError("--switch-threshold needs --async-update epoch (weight versions then count epochs)")
        if pool.lambda_bandwidth_mbps and p.backend != "local":
            raise ConfigError(f"--lambda-bandwidth-mbps caps the links of emulated Lambdas (--backend local), not "
                              f"--backend {p.backend}")
        if pool.row_cache_mb and p.backend not in LAMBDA_BACKENDS:
            raise ConfigError(f"--row-cache-mb is for Lambda containers (--backend local or lambda); --backend "
                              f"{p.backend} runs tensor tasks inside the graph server, which has the rows")
        streams = pool.stream_rows is not AUTO and pool.stream_rows > 0  # given; auto streams only where it can
        if streams and p.backend not in LAMBDA_BACKENDS:
            raise ConfigError(f"--stream-rows streams a Lambda's transfers (--backend local or lambda); --backend "
                              f"{p.backend} runs tensor tasks inside the graph server, which transfers nothing")
        if streams and not architecture(self.gnn.model).streams:
            raise ConfigError(f"--stream-rows streams GCN and GraphSAGE tasks, not --model {self.gnn.model} (GAT's vertex "
                              "forward returns a bias row with the rows, which no block owns)")
        if len(devices := device_list(p.device)) > 1 and len(devices) != p.graph_servers:
            raise ConfigError(f"--device lists {len(devices)} devices for {p.graph_servers} graph servers (give one "
                              "for all, or one per graph server)")
        if p.backend == "lambda" and not self.aws.lambda_function:
            raise ConfigError("--backend lambda needs --lambda-function NAME (or \"lambda_function\" in the cluster file)")

    def _check_decentral(self) -> None:
        if self.pipeline.backend != "reference":
            raise ConfigError(f"--mode {self.pipeline.mode} starts its own workers (--workers, --device); drop --backend "
                              f"{self.pipeline.backend}")
        if self.gossip.average_every and self.pipeline.mode != "gossip":
            raise ConfigError(f"--average-every is for --mode gossip (all-reduce workers always hold one model), "
                              f"got {self.gossip.average_every} with --mode {self.pipeline.mode}")
        if len(device_list(self.pipeline.device)) > 1:
            raise ConfigError(f"--mode {self.pipeline.mode}: --device names one device for every worker, not a list")
        self.check_device()

    def check_devices_here(self) -> None:
        """Where the driver starts the graph servers on its own host (no ``--cluster``): each one's device
        exists here (``devices.py``), checked before anything starts."""
        p = self.pipeline
        if p.backend in INPROC_BACKENDS and p.mode not in DECENTRAL_MODES:
            gpus = cuda_devices()
            for k in range(p.graph_servers):
                device_for(p.device, p.backend, k, k, gpus)

    def check_device(self) -> None:
        """A CUDA device that is not there is a configuration error, not a silent CPU fallback (gossip and
        all-reduce workers, which run on the driver's host; graph servers' devices: ``devices.py``)."""
        device = self.pipeline.resolved_device()
        if device.startswith("cuda") and not cuda_devices():
            raise ConfigError(f"--mode {self.pipeline.mode} wants device {device}, but torch sees no CUDA device "
                              "(use --device cpu, or --backend cpu)")

    def attention_dropout(self) -> float:
        return self.gnn.attention_dropout()

    def widths(self, features: int, classes: int) -> list[int]:
        return self.gnn.widths(features, classes)

    def resolved_device(self) -> str:
        return self.pipeline.resolved_device()

    def checkpoint_interval(self) -> int:
        """Epochs between checkpoints (0: none): every 10 for distributed runs unless set."""
        if not self.pipeline.distributed:
            return 0
        every = self.recovery.checkpoint_every
        return 10 if every is None else every

    def resolved_row_cache_mb(self) -> int:
        return row_cache_mb(self.pipeline.backend, self.pool.lambda_memory_mb, self.pool.row_cache_mb)


def _unknown(name: str):
    """A name that is no setting: the nearest setting, or the train() keyword it is."""
    if name in TRAIN_KEYWORDS:
        raise ConfigError(f"{name} is a keyword of train(), not a setting: train(config, {name}=...)")
    near = nearest(name, SECTION_OF)
    raise ConfigError(f"TrainConfig has no setting {name!r}" + (f" (did you mean {near}?)" if near else
                                                                 " (help(TrainConfig) lists them)"))


def _typed(name: str, value):
    """``value`` as the setting ``name`` holds it: ``auto`` as :data:`AUTO`, a numpy number as Python's, a
    ``pathlib.Path`` as its string. A value of another type is a ConfigError in Python's words wherever it
    comes from (the command's flags are parsed to their types: only a caller's value, or a record's
    ``config.json``, meets this)."""
    kind = FIELD_TYPES[name]
    if value == "auto" and "Auto" in kind:  # as JSON and the flags spell it
        return AUTO
    if isinstance(value, os.PathLike) and kind.startswith("str"):
        return _typed(name, os.fspath(value))
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, int)):
        value = int(value)  # numpy.int64 from a sweep's grid
    elif isinstance(value, numbers.Real) and not isinstance(value, (bool, int, float)):
        value = float(value)
    if not fits(kind, value):
        raise ConfigError(f"{name} must be {_described(kind)}, got {value!r}")
    return value


def _described(kind: str) -> str:
    words = {"int": "an integer", "float": "a number", "str": "a string", "bool": "True or False", "None": "None",
             "Auto": "'auto'"}
    options = [words.get(o, o) for o in kind.replace(" ", "").split("|")]
    return options[0] if len(options) == 1 else ", ".join(options[:-1]) + " or " + options[-1]


TrainConfig.__doc__ = settings_doc.docstring()  # help(TrainConfig): every setting, its default and meaning
TrainConfig.__signature__ = settings_doc.signature()


MAX_SYNTH_EDGES = 2**36  # about 1 TB of edge buckets on disk


@dataclass(frozen=True)
class SynthConfig:
    """A generated graph (``data/synth.py``)."""

    nodes: int = 10_000
    edges: int = 200_000  # directed edges; every undirected edge appears in both directions
    features: int = 128
    classes: int = 10
    homophily: float = 0.4  # chance that an edge stays inside its block
    degree_exponent: float = 2.5  # Pareto tail of the degree distribution (> 1; smaller = heavier tail)
    feature_signal: float = 0.1  # centroid scale against unit noise: how much features alone reveal
    train_frac: float = 0.1
    val_frac: float = 0.1
    seed: int = 0

    def check(self) -> None:
        for flag, value, most in (("--nodes", self.nodes, 2**31 - 1), ("--edges", self.edges, MAX_SYNTH_EDGES),
                                  ("--features", self.features, 65_536), ("--classes", self.classes, 65_536),
                                  ("--degree-exponent", self.degree_exponent, 100.0),
                                  ("--feature-signal", self.feature_signal, 1e6)):
            check_number(flag, value, most)
        at_least("--feature-signal", self.feature_signal, 0)
        check_split(self.train_frac, self.val_frac, self.seed, "--seed")
        at_least("--nodes", self.nodes, 2)
        at_least("--classes", self.classes, 2)
        at_least("--features", self.features, 1)
        if self.classes > self.nodes:
            raise ConfigError(f"--classes ({self.classes}) cannot exceed --nodes ({self.nodes})")
        if not 0 <= self.edges <= self.nodes * (self.nodes - 1) // 2:
            raise ConfigError(f"--edges {self.edges} is impossible for {self.nodes} vertices without duplicates")
        if not 0.0 <= self.homophily <= 1.0:
            raise ConfigError(f"--homophily must be in [0, 1], got {self.homophily}")
        if self.degree_exponent <= 1.0:
            raise ConfigError(f"--degree-exponent must be > 1, got {self.degree_exponent}")


def row_cache_mb(backend: str, lambda_memory_mb: int, asked: int | None) -> int:
    """What each tensor worker may keep of the static rows it pulled (0: no cache): only Lambda
    containers (local, lambda) cache; by default (``asked`` None) a quarter of their memory."""
    if backend not in ("local", "lambda"):
        return 0
    return lambda_memory_mb // 4 if asked is None else asked
