"""What a tensor worker is invoked with: :class:`TaskEvent`, typed on both sides of the invocation.

The graph server builds one per copy of a task (``graph_servers/wire.py``); a platform hands it to the
worker as it is (threads in the graph server) or as JSON (the local Lambda emulator, AWS Lambda), and
the worker reads it back with :meth:`TaskEvent.from_dict`, which checks every field and raises
:class:`~dorylus_py.protocol.ProtocolError` naming the first wrong one. It carries no secret: the job
key comes from the worker's environment, the CURVE key is the server's public one, the nonce is public.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from dorylus_py.pipeline.events import TaskKey
from dorylus_py.protocol import ProtocolError, integer
from dorylus_py.protocol.quantize import WIRE_DTYPES


@dataclass(frozen=True)
class TaskRef:
    """The task a copy runs, as its requests name it to the graph server (``wire.task_of`` reads it):
    the scheduler's key and what this copy needs besides. On the wire its fields are flat."""

    key: TaskKey
    server: int  # the graph server's rank
    version: int | None  # the weights' version to pull (None: the newest)
    hold: tuple[int, ...] | None  # async forward: the key its weights are held under for the backward
    attempt: int

    def to_wire(self) -> dict:
        return self.key._asdict() | {"server": self.server, "version": self.version,
                                     "hold": list(self.hold) if self.hold is not None else None,
                                     "attempt": self.attempt}


@dataclass(frozen=True)
class Stream:
    """A streamed task (``--stream-rows``): the chunk's ``rows``, worked on ``block`` rows at a time."""

    rows: int
    block: int


@dataclass(frozen=True)
class TaskEvent:
    job: str  # the job's nonce, hex: every request is bound to it
    curve_public_key: str | None  # the graph server's CURVE public key (None: no encryption)
    graph_server: str
    weight_servers: tuple[str, ...]  # those holding the task's layer, its lead first; none without weights
    model: str
    dropout: float
    attn_dropout: float
    negative_slope: float
    seed: int
    num_train: int
    row_cache_mb: int  # static rows a warm container may keep (0: none)
    stream: Stream | None
    task: TaskRef
    device: str = "cpu"  # where the kernels run (a graph server's own threads may name its GPU)
    wire_dtype: str = "float32"  # what its result rows travel as (``protocol/quantize.py``)

    def to_dict(self) -> dict:
        """The event as JSON takes it (what a Lambda is invoked with)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        return out | {"weight_servers": list(self.weight_servers), "task": self.task.to_wire(),
                      "stream": {"rows": self.stream.rows, "block": self.stream.block} if self.stream else None}

    @classmethod
    def from_dict(cls, event) -> TaskEvent:
        """The event a worker was invoked with, every field checked (ProtocolError names the first wrong one)."""
        if isinstance(event, TaskEvent):
            return event
        if not isinstance(event, dict):
            raise ProtocolError(f"a task event must be an object, got {type(event).__name__}")
        names = {f.name for f in fields(cls)}
        if unknown := sorted(set(event) - names):
            raise ProtocolError(f"task event: unknown field {unknown[0]!r}")
        ev = dict(event)
        ev.setdefault("device", "cpu")
        ev.setdefault("wire_dtype", "float32")
        if missing := sorted(names - set(ev)):
            raise ProtocolError(f"task event: missing {missing[0]!r}")
        _check(ev, "job", str, lambda v: len(v) % 2 == 0 and all(c in "0123456789abcdef" for c in v))
        _check(ev, "curve_public_key", (str, type(None)))
        _check(ev, "graph_server", str)
        ws = ev["weight_servers"]
        if not isinstance(ws, list) or not all(isinstance(a, str) for a in ws):
            raise ProtocolError(f"task event: weight_servers must be a list of addresses, got {ws!r:.100}")
        _check(ev, "model", str)
        for name in ("dropout", "attn_dropout"):
            _check(ev, name, (int, float), lambda v: 0 <= v < 1)
        _check(ev, "negative_slope", (int, float))
        for name in ("seed", "num_train", "row_cache_mb"):
            integer(ev[name], f"task event: {name}")
        _check(ev, "device", str)
        _check(ev, "wire_dtype", str, lambda v: v in WIRE_DTYPES)
        return cls(**(ev | {"weight_servers": tuple(ws), "stream": _stream(ev["stream"]), "task": _task(ev["task"])}))


def _check(ev: dict, name: str, types, ok=lambda v: True) -> None:
    v = ev[name]
    if not isinstance(v, types) or isinstance(v, bool) or not ok(v):
        raise ProtocolError(f"task event: bad {name} {v!r:.100}")


def _stream(value) -> Stream | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"rows", "block"}:
        raise ProtocolError(f"task event: stream must be {{rows, block}}, got {value!r:.100}")
    for name in ("rows", "block"):
        integer(value[name], f"task event: stream {name}", low=1)
    return Stream(value["rows"], value["block"])


def _task(value) -> TaskRef:
    names = set(TaskKey._fields) | {f.name for f in fields(TaskRef)} - {"key"}
    if not isinstance(value, dict) or set(value) != names:
        raise ProtocolError(f"task event: task must name {', '.join(sorted(names))}, got {value!r:.200}")
    _check(value, "kind", str)
    if not isinstance(value["train"], bool):
        raise ProtocolError(f"task event: bad train {value['train']!r:.20}")
    for name in ("epoch", "layer", "chunk", "server", "attempt"):
        integer(value[name], f"task event: task {name}")
    if value["version"] is not None:
        integer(value["version"], "task event: task version")
    hold = value["hold"]
    if hold is not None and not (isinstance(hold, list) and len(hold) <= 8
                                 and all(isinstance(h, int) and not isinstance(h, bool) for h in hold)):
        raise ProtocolError(f"task event: bad hold {hold!r:.100}")
    return TaskRef(TaskKey(*(value[name] for name in TaskKey._fields)), value["server"], value["version"],
                   tuple(hold) if hold is not None else None, value["attempt"])
