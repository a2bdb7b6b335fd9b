"""Hostile messages for one receiving role of a live job, made by an insider: it has the job key and the
job's nonce (a Lambda container has both), and knows the job's shapes.

Kinds (about equal shares): random bytes; valid messages cut short; valid messages with one bit
flipped; messages signed with another key, for another process, or for another job; replays of valid
messages; and, with a valid MAC for this job, hostile bodies: nesting past the limit, huge and
non-finite numbers, non-objects, tensor specs whose sizes overflow or are negative, and the role's own
ops with realistic values (true task kinds, layers and chunks, tensors of the job's true widths, ghost
rows of a real peer, gradients of the model's true block shapes, streamed parts) in which one thing is
wrong: an epoch no job reaches, a key that names no task, a lease that is not the sender's (lease ids are
random, and each worker knows only its own), a position out of range, a row too many.

Every authentic message is malformed for its role by construction, so none can change what the job
computes: a key holder who sends well-formed results is not what a MAC can stop (docs/architecture.md,
threat model). The corpus is a function of its seed, which the test prints, so a failure replays.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

import numpy as np
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from dorylus_py.config import TrainConfig
from dorylus_py.models import spec_of
from dorylus_py.protocol import Message, ProtocolError, Session
from dorylus_py.weights.blocks import weight_blocks
from tests.protocol.forge import header, packed, signed

FAR = 10**6  # an epoch no test job reaches
OPS = {
    "graph-server": ["lease", "result", "leave", "ghosts", "progress"],
    "weight-server": ["pull_weights", "push_grad", "pull_state", "ping"],
    "driver": ["hello", "heartbeat", "epoch_stats", "tasks", "switch"],
    "worker": ["steal", "mix", "snapshot", "ping", "report", "row", "average", "dead"],  # decentral peers
}
NOT_AN_INDEX = [-1, 99, FAR, 1.5, "1", None, [1], {"a": 1}, True]  # no epoch, batch or rank of a small job
BAD_EPOCHS = [FAR, 0, -1, 2**53, 1.5, "1", None]
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)


@dataclass(frozen=True)
class Job:
    """What an insider knows of the job it attacks: its model, widths and layout, its nonce."""

    model: str = "gcn"
    widths: tuple = (1433, 16, 7)  # Cora, 2 layers
    rows: tuple = (677, 677)  # a chunk's rows at each graph server (about)
    ghosts: int = 400  # ghost rows a graph server holds of a peer (about)
    chunks: int = 2
    servers: int = 2
    nonce: bytes = b""

    @functools.cached_property
    def grad_blocks(self) -> dict[int, dict[str, tuple]]:
        """Layer -> the weight server's block names and true shapes (one weight server)."""
        tensors = spec_of(TrainConfig(model=self.model, layers=len(self.widths) - 1), list(self.widths)).tensors()
        out: dict[int, dict[str, tuple]] = {}
        for b in weight_blocks(tensors, 1):
            shape = next(t.shape for t in tensors if t.name == b.tensor)
            out.setdefault(b.layer, {})[b.name] = (b.stop - b.start, *shape[1:])
        return out


@functools.lru_cache(maxsize=4)
def hypothesis_values(count: int, of_seed: int = 0) -> list:
    """``count`` JSON-like values drawn by hypothesis (NaN, infinities, huge integers included), the same
    ones for the same ``of_seed`` in every process (hypothesis draws from its own seed otherwise, and a
    failing corpus could not be replayed)."""
    values: list = []

    @seed(of_seed)
    @settings(max_examples=count, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(JSON)
    def draw(value):
        values.append(value)

    draw()
    return values


def _array(rng: random.Random, forbidden: set = frozenset()) -> np.ndarray:
    """A tensor of a shape the role does not expect, or of a dtype it must refuse."""
    while True:
        shape = tuple(rng.choice([0, 1, 3, 5, 13]) for _ in range(rng.choice([0, 1, 2, 2, 3])))
        if shape not in forbidden:
            break
    dtype = rng.choice([np.float32, np.float64, np.int64, np.int32, np.uint8, np.bool_])
    arr = np.zeros(shape, dtype)
    if dtype == np.float32 and arr.size and rng.random() < 0.5:
        arr.flat[0] = rng.choice([np.nan, np.inf, 1e38])
    return arr


def _true(rng: random.Random, shape: tuple, finite: bool = True) -> np.ndarray:
    """float32 values of a true shape; one of them NaN or infinite unless ``finite``."""
    arr = np.full(shape, rng.random(), np.float32)
    if not finite and arr.size:
        arr.flat[rng.randrange(arr.size)] = rng.choice([np.nan, np.inf, -np.inf])
    return arr


def _task(rng: random.Random, job: Job, values: list) -> dict:
    """A task of a true kind, layer and chunk whose epoch no job reaches (or, now and then, another field wrong)."""
    task = {"kind": rng.choice(["fwd", "bwd", "loss", "fused", "eval"]), "train": rng.choice([True, False]),
            "epoch": rng.choice(BAD_EPOCHS) if rng.random() < 0.3 else FAR + rng.randrange(1000),
            "layer": rng.randrange(len(job.widths) - 1), "chunk": rng.randrange(job.chunks), "attempt": 1}
    if rng.random() < 0.2:  # another field wrong too; the epoch stays one no job reaches
        task[rng.choice(["kind", "train", "layer", "chunk", "attempt"])] = rng.choice([*NOT_AN_INDEX, rng.choice(values), "rm"])
    return task


def _graph_server(op: str, rng: random.Random, job: Job, values: list) -> Message:
    v = lambda: rng.choice(values)  # noqa: E731
    rows, (_, hidden, classes) = rng.choice(job.rows), job.widths
    lease = rng.choice(["0" * 16, "f" * 16, "", "x" * 33, None, 7, v()])  # no lease of this job's (ids are random)
    if op in ("lease", "leave"):
        fields = {"lease": lease, "reason": rng.choice(["idle", v()])}
        if rng.random() < 0.5:
            fields["have"] = rng.choice([["f" * 32], ["t" * 65], ["t"] * 65, v()])
        return Message(op, fields)
    if op == "result":
        span = rng.choice([[0, rows], [0, 64], [64, 128], [-1, 5], [5, 5], [0, rows + 1], [rows, rows + 64], None, v()])
        fields = {"lease": lease, "task": _task(rng, job, values), "version": rng.choice([0, 3, v()]), "part": span,
                  "last": rng.choice([True, 1, None]), "loss_sum": rng.choice([1.0, float("nan"), v()]),
                  "correct": rng.choice([[1, 2, 3], [-1, 0, 0], v()]), "failed": rng.choice([None, "x", v()])}
        whole = not (isinstance(span, list) and len(span) == 2 and all(type(x) is int for x in span))
        n = rows if whole else max(0, min(rows, span[1] - span[0]))
        tensors = rng.choice([{"Z": _true(rng, (n, hidden), rng.random() < 0.5)}, {"dG": _true(rng, (n, classes))},
                              {"Z": _true(rng, (n + 1, hidden))}, {"grad:W0": _true(rng, job.grad_blocks[0]["W0.0"])},
                              {"Z": _array(rng)}])
        return Message(op, fields, tensors)
    src = rng.choice([1, 1, 1, 0, 2, 99, -1, "1", None])  # the real peer of graph server 0, mostly
    if op == "progress":
        return Message(op, {"src": src, "min_epoch": rng.choice([FAR, 2**53, 0, -1, v()]), "req": None})
    # ghosts: rows of a true width and a true count, and one thing wrong
    phase = rng.choice(["fwd", "efwd", "bwd", "ebwd", "up", v()])
    count = rng.choice([job.ghosts, 50, 2])
    positions = np.arange(count, dtype=np.int64)
    epoch, chunk, rows_n = rng.choice([3, 4, 5]), rng.randrange(job.chunks), count
    wrong = rng.randrange(6)
    if wrong == 0:
        epoch = rng.choice(BAD_EPOCHS)
    elif wrong == 1:
        positions[rng.randrange(count)] = rng.choice([-1, -2**40, 10**9, 2**62])
    elif wrong == 2:  # a repeated contribution (forward rows may repeat a position: they are only written)
        positions[-1], phase = positions[0], rng.choice(["bwd", "ebwd"])
    elif wrong == 3:
        rows_n = count + rng.choice([1, -1 if count else 1])
    elif wrong == 4:
        chunk = rng.choice([99, -5, "0", None])
    else:
        positions = positions.astype(rng.choice([np.int32, np.float64, np.uint8]))
    width = rng.choice([hidden, classes])
    tensors = {"positions": positions, "rows": _true(rng, (max(rows_n, 0), width))}
    return Message(op, {"phase": phase, "epoch": epoch, "layer": rng.randrange(2), "src": src, "chunk": chunk,
                        "min_epoch": rng.choice([1, 2, FAR]), "req": None}, tensors)


def _weight_server(op: str, rng: random.Random, job: Job, values: list) -> Message:
    v = lambda: rng.choice(values)  # noqa: E731
    layer = rng.choice([0, 1, 0, 1, 2, 9, -1, "0", None, v()])
    bad_key = rng.choice([[FAR, 0, 0], [0, 0, 0], [2, job.servers, 0], [2, 0, job.chunks], [2, -1, 0], [1, 0, 0],
                          [2, 0], ["2", 0, 0], None])
    if op in ("pull_weights", "pull_state", "ping"):
        fields = {"layer": layer, "version": rng.choice([None, 0, FAR, -1, 1.5, v()]), "req": "r",
                  "hold": rng.choice([None, bad_key, [[1], 0, 0], v()])}
        tensors = {"g": _array(rng)} if rng.random() < 0.2 else {}  # a pull carries no tensors
        return Message(op, fields, tensors)
    true_layer = layer if type(layer) is int and layer in job.grad_blocks else 0
    grads = {name: _true(rng, shape, finite=rng.random() < 0.7) for name, shape in job.grad_blocks[true_layer].items()}
    if rng.random() < 0.2:
        grads = {rng.choice(["W0.0", "W1.0", "x"]): _array(rng, {(1433, 16), (16, 7)})}
    # a true-shaped finite gradient only ever under a key of no task, or of epoch 1, whose gradients came already
    return Message(op, {"layer": true_layer if rng.random() < 0.7 else layer, "version": rng.choice([0, 1, v()]),
                        "key": bad_key, "req": "r"}, grads)


def _driver(op: str, rng: random.Random, job: Job, values: list) -> Message:
    v = lambda: rng.choice(values)  # noqa: E731
    fields = {"role": rng.choice(["graph-server", "weight-server", "x", v()]), "rank": rng.choice([0, 1, 7, v()]),
              "address": v(), "turns": v(), "epoch": rng.choice([*BAD_EPOCHS, 2, v()]), "loss_sum": v(),
              "correct": rng.choice([[1, 2, 3], v()]), "counts": v(), "finished": v(), "frozen_at": v()}
    tensors = {"jsonl": np.frombuffer(rng.choice([b"{}\n", b"[" * 100_000, b'{"kind": 1}\n' * 100]), np.uint8)} \
        if op == "tasks" else {}
    return Message(op, fields, tensors)


def _authentic(role: str, rng: random.Random, job: Job, values: list) -> Message:
    """A message of the role's own ops, malformed for it (or, now and then, an op it does not serve)."""
    op = rng.choice(OPS[role])
    if rng.random() < 0.1:
        return Message(rng.choice(["format_disk", "start", "rows", "weights", "ok", "stop"]), {"req": "r"})
    if role == "graph-server":
        return _graph_server(op, rng, job, values)
    if role == "weight-server":
        return _weight_server(op, rng, job, values)
    if role == "driver":
        return _driver(op, rng, job, values)
    return _worker(op, rng, values)


def _worker(op: str, rng: random.Random, values: list) -> Message:
    """A decentralised peer's message: a peer's rank (so the handler sees it), every other field unusable."""
    v = lambda: rng.choice(values)  # noqa: E731
    bad = lambda: rng.choice(NOT_AN_INDEX + [x for x in values if type(x) is not int])  # noqa: E731
    fields = {"rank": rng.choice([0, 2, 2, 7, "0"]), "id": rng.choice([1, 2, None]), "epoch": bad(), "cycle": bad(),
              "dead": bad(), "batches": rng.choice([[99], [bad()], bad()]), "row": rng.choice([{"epoch": "1"}, bad()]),
              "left": v(), "loss_sum": v(), "count": bad(), "exchanges": bad(), "keep": v()}
    tensors = {name: _array(rng, {(4,)}) for name in rng.sample(["params", "grad", "tasks", "best"], rng.randrange(3))}
    if op == "report" and rng.random() < 0.3:
        tensors["tasks"] = np.frombuffer(b"[" * rng.choice([10, 100_000]), np.uint8)  # deep JSON in a tensor
    return Message(op, fields, tensors)


def _hostile_header(rng: random.Random, values: list) -> bytes:
    choice = rng.randrange(7)
    if choice == 0:
        depth = rng.choice([17, 100, 5000, 30000])
        return header("ping")[:-1] + b"\x81\xa1x" + b"\x91" * depth + b"\xc0"  # ping {x: [[[...]]]}
    if choice == 1:
        return header("ping", n=rng.choice([float("inf"), float("nan"), -float("inf"), 2**53 + 1, 2**64 - 1, -(2**63)]))
    if choice == 2:
        return rng.choice([packed([1, 2]), packed("op"), packed(None), b"\xc1", b"\x93", header("ping")[:-1],
                           packed({"op": "ping"}), b"\x93\xa4ping\x90\x81\xa1s\xa2\xff\xfe"])  # the last: not UTF-8
    if choice == 3:
        return header("ping", s="a" * rng.choice([1000, 60000]))
    if choice == 4:  # tensor specs that do not match the frames: sizes that overflow int64, negative, zero
        shape = rng.choice([[2, 2], [-1], [65536] * 4, [2**31 - 1] * 4, [2**16, 2**16, 2**16, 2**16 + 1], [0, 7],
                            [2**40, 2**40], [3, -5], [1] * 5])
        specs = rng.choice([[["grad", "float32", shape]], [["grad", "object", [1]]], {"Z": 1}])
        return packed([rng.choice(["push_grad", "ghosts", "result"]), specs, {}])
    return header("ping", **{f"k{i}": rng.choice(values) for i in range(3)})


def _sign(session: Session, msg: Message, to: str) -> list[bytes]:
    """``msg`` signed for ``to``; a header with NaN, infinities or numbers past 2**53, which encode
    refuses, is signed as it is."""
    try:
        return [bytes(f) for f in session.encode(msg, to)]
    except ProtocolError:  # a field no receiver would accept
        specs = [[n, a.dtype.name, list(a.shape)] for n, a in msg.tensors.items()]
        return signed(session, header(msg.op, specs, **msg.fields), *[a.tobytes() for a in msg.tensors.values()], to=to)


def corpus(role: str, key: bytes, to: str, count: int, seed: int = 0, job: Job = Job()) -> list[list[bytes]]:
    """``count`` hostile messages for the process of ``role`` listening at ``to`` (made now: a receiver
    accepts nothing stamped before it started)."""
    rng = random.Random(seed)
    values = hypothesis_values(300, seed)
    me = Session(key, job=job.nonce)
    strangers = [Session(b"a key that is not the job's key.", job=job.nonce), Session(key, job=b"\x00" * 16)]
    sent: list[list[bytes]] = []
    out: list[list[bytes]] = []
    for i in range(count):
        kind = i % 8
        if kind == 0:
            frames = [rng.randbytes(rng.choice([0, 1, 67, 68, 69, 300])) for _ in range(rng.randrange(1, 6))]
            if rng.random() < 0.5 and frames:
                frames[0] = b"DRY1" + frames[0][4:]
        elif kind in (1, 2):
            frames = _sign(me, _authentic(role, rng, job, values), to)
            if kind == 1:
                frames = frames[: rng.randrange(len(frames))] or [frames[0][: rng.randrange(68)]]
            else:
                j = rng.randrange(len(frames))
                if frames[j]:
                    b = bytearray(frames[j])
                    b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
                    frames[j] = bytes(b)
        elif kind == 3:  # another key, another job's nonce, or another process's address
            frames = _sign(rng.choice(strangers), _authentic(role, rng, job, values), to) if rng.random() < 0.67 else \
                _sign(me, _authentic(role, rng, job, values), "tcp://10.9.9.9:1")
        elif kind == 4 and sent:
            frames = rng.choice(sent)  # replayed: its sequence number was used already
        elif kind == 5:
            frames = signed(me, _hostile_header(rng, values), *[rng.randbytes(rng.choice([0, 4, 16])) for _ in
                                                                range(rng.randrange(3))], to=to)
        else:
            frames = _sign(me, _authentic(role, rng, job, values), to)
            if rng.random() < 0.2:
                sent.append(frames)
        out.append([bytes(f) for f in frames])
    return out
