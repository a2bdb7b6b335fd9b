"""The job spec: what the driver tells every server in ``start``, typed on both ends.

It is the run's :class:`~dorylus_py.config.TrainConfig` plus what the driver worked out for this
start of the job (addresses, the model's widths, the vertex numbering, where training resumes). On the
wire it is plain JSON; :meth:`JobSpec.from_wire` rebuilds the dataclasses and refuses anything that
does not fit them, so no server reads an untyped dict.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from dorylus_py.config import TrainConfig
from dorylus_py.errors import ConfigError
from dorylus_py.protocol import ProtocolError
from dorylus_py.settings import fits


@dataclass(frozen=True)
class JobSpec:
    config: TrainConfig
    data_dir: str  # the prepared partition store (folder or s3://)
    feature_norm: str  # resolved: row | none
    dims: list[int]  # layer widths: features, hidden..., classes
    id_offsets: list[int]  # partition k numbers its vertices id_offsets[k] .. id_offsets[k+1] - 1
    chunk_counts: list[int]  # chunks of each graph server
    edge_offsets: list[int] = field(default_factory=list)  # partition k numbers its in-edges (self loops included;
    # its local block's in CSR order, then its ghost block's) from edge_offsets[k]: attention dropout is keyed by that id
    graph_servers: list[str] = field(default_factory=list)  # addresses, by rank
    weight_servers: list[str] = field(default_factory=list)
    num_train: int = 0  # training vertices in the whole graph (the loss is their mean)
    first_epoch: int = 1  # 1, or one past the checkpoint this start resumes from
    mode: str = "sync"  # sync | async: the config's mode, or sync after a switch before the checkpoint
    restart: int = 0  # how many times the driver restarted the job's servers before this start
    lambda_share: list[int] = field(default_factory=lambda: [1, 1, 1])  # a graph server's tensor workers: start,
    # fewest, most (plan.py)
    forward_only: bool = False  # dorylus predict: only the evaluation forward, its outputs sent to the driver

    @property
    def layers(self) -> int:
        return len(self.dims) - 1

    @property
    def total_chunks(self) -> int:
        return sum(self.chunk_counts)

    def to_wire(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "config"} | {"config": self.config.to_dict()}

    @classmethod
    def from_wire(cls, raw) -> "JobSpec":
        if not isinstance(raw, dict):
            raise ProtocolError("job spec must be an object")
        values = _typed(cls, {k: v for k, v in raw.items() if k != "config"}, skip={"config"})
        try:
            config = TrainConfig.from_dict(raw.get("config"))
        except ConfigError as e:
            raise ProtocolError(f"job spec: {e}") from None
        return cls(config=config, **values)


def _typed(cls, raw, skip=frozenset()) -> dict:
    """``raw``'s values for the fields of dataclass ``cls``, each checked against its annotation."""
    if not isinstance(raw, dict):
        raise ProtocolError(f"{cls.__name__} must be an object")
    known = {f.name: f for f in fields(cls) if f.name not in skip}
    unknown = set(raw) - set(known)
    if unknown:
        raise ProtocolError(f"{cls.__name__}: unknown fields {sorted(unknown)}")
    out = {}
    for name, value in raw.items():
        if not fits(known[name].type, value):
            raise ProtocolError(f"{cls.__name__}.{name}: {value!r} is not {known[name].type}")
        out[name] = value
    return out
