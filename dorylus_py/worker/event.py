"""What a tensor worker is invoked with (:class:`LeaseEvent`) and how a task is named (:class:`TaskRef`),
typed on both sides.

A worker is invoked for a *lease*, not for one task: it connects to its graph server, says which
lease it is, and runs the tasks the server sends it, one after another, until the server releases
it, it has waited ``idle_ms`` for a task, or its time runs out (``worker/handler.py``). The graph
server builds the event (``graph_servers/wire.py``); a platform hands it to the worker as it is
(threads in the graph server) or as JSON (the local Lambda emulator, AWS Lambda), and the worker reads
it back with :meth:`LeaseEvent.from_dict`, which checks every field and raises
:class:`~dorylus_py.protocol.ProtocolError` naming the first wrong one. It carries no secret: the job
key comes from the worker's environment, the CURVE key is the server's public one, the nonce is public.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from dorylus_py.pipeline.events import TaskKey
from dorylus_py.protocol import ProtocolError, integer
from dorylus_py.protocol.quantize import WIRE_DTYPES

MAX_LEASE_ID = 32  # characters of a lease id (ours: 16 hex digits)


@dataclass(frozen=True)
class TaskRef:
    """A copy of a task as the graph server names it in a ``task`` message and the worker in its
    ``result``: the scheduler's key and what this copy needs besides. On the wire its fields are flat."""

    key: TaskKey
    server: int  # the graph server's rank
    version: int | None  # the weights' version to pull (None: the newest)
    hold: tuple[int, ...] | None  # async forward: the key its weights are held under for the backward
    attempt: int

    def to_wire(self) -> dict:
        return self.key._asdict() | {"server": self.server, "version": self.version,
                                     "hold": list(self.hold) if self.hold is not None else None,
                                     "attempt": self.attempt}

    @classmethod
    def from_wire(cls, value) -> TaskRef:
        """A task as a ``task`` message names it, every field checked."""
        names = set(TaskKey._fields) | {f.name for f in fields(cls)} - {"key"}
        if not isinstance(value, dict) or set(value) != names:
            raise ProtocolError(f"task must name {', '.join(sorted(names))}, got {value!r:.200}")
        if not isinstance(value["kind"], str) or len(value["kind"]) > 16:
            raise ProtocolError(f"bad task kind {value['kind']!r:.20}")
        if not isinstance(value["train"], bool):
            raise ProtocolError(f"bad task train {value['train']!r:.20}")
        for name in ("epoch", "layer", "chunk", "server", "attempt"):
            integer(value[name], f"task {name}")
        if value["version"] is not None:
            integer(value["version"], "task version")
        hold = value["hold"]
        if hold is not None and not (isinstance(hold, list) and len(hold) <= 8
                                     and all(isinstance(h, int) and not isinstance(h, bool) for h in hold)):
            raise ProtocolError(f"bad task hold {hold!r:.100}")
        return cls(TaskKey(*(value[name] for name in TaskKey._fields)), value["server"], value["version"],
                   tuple(hold) if hold is not None else None, value["attempt"])


@dataclass(frozen=True)
class LeaseEvent:
    job: str  # the job's nonce, hex: every message is bound to it
    curve_public_key: str | None  # the graph server's CURVE public key (None: no encryption)
    graph_server: str
    server: int  # the graph server's rank
    lease: str  # this invocation's id: the server sends tasks to the worker that says it
    weight_servers: tuple[str, ...]  # every weight server; a task names those holding its layer
    model: str
    dropout: float
    attn_dropout: float
    negative_slope: float
    seed: int
    num_train: int
    row_cache_mb: int  # static rows a warm container may keep (0: none)
    idle_ms: int  # the lease ends after waiting this long for a task
    device: str = "cpu"  # where the kernels run (a graph server's own threads may name its GPU)
    wire_dtype: str = "float32"  # what its result rows travel as (``protocol/quantize.py``)

    def to_dict(self) -> dict:
        """The event as JSON takes it (what a Lambda is invoked with)."""
        return {f.name: getattr(self, f.name) for f in fields(self)} | {"weight_servers": list(self.weight_servers)}

    @classmethod
    def from_dict(cls, event) -> LeaseEvent:
        """The event a worker was invoked with, every field checked (ProtocolError names the first wrong one)."""
        if isinstance(event, LeaseEvent):
            return event
        if not isinstance(event, dict):
            raise ProtocolError(f"a lease event must be an object, got {type(event).__name__}")
        names = {f.name for f in fields(cls)}
        if unknown := sorted(set(event) - names):
            raise ProtocolError(f"lease event: unknown field {unknown[0]!r}")
        ev = {"device": "cpu", "wire_dtype": "float32"} | event
        if missing := sorted(names - set(ev)):
            raise ProtocolError(f"lease event: missing {missing[0]!r}")
        _check(ev, "job", str, lambda v: len(v) % 2 == 0 and all(c in "0123456789abcdef" for c in v))
        _check(ev, "curve_public_key", (str, type(None)))
        _check(ev, "graph_server", str)
        _check(ev, "lease", str, lambda v: 0 < len(v) <= MAX_LEASE_ID)
        ws = ev["weight_servers"]
        if not isinstance(ws, list) or not all(isinstance(a, str) for a in ws):
            raise ProtocolError(f"lease event: weight_servers must be a list of addresses, got {ws!r:.100}")
        _check(ev, "model", str)
        for name in ("dropout", "attn_dropout"):
            _check(ev, name, (int, float), lambda v: 0 <= v < 1)
        _check(ev, "negative_slope", (int, float))
        for name in ("server", "seed", "num_train", "row_cache_mb"):
            integer(ev[name], f"lease event: {name}")
        integer(ev["idle_ms"], "lease event: idle_ms", low=1)
        _check(ev, "device", str)
        _check(ev, "wire_dtype", str, lambda v: v in WIRE_DTYPES)
        return cls(**(ev | {"weight_servers": tuple(ws)}))


def _check(ev: dict, name: str, types, ok=lambda v: True) -> None:
    v = ev[name]
    if not isinstance(v, types) or isinstance(v, bool) or not ok(v):
        raise ProtocolError(f"lease event: bad {name} {v!r:.100}")
