"""Hostile messages for one receiving role, made up front so that sending them costs the job nothing.

Kinds (about equal shares): random bytes; valid messages cut short; valid messages with one bit
flipped; messages signed with another key or for another process; replays of valid messages; and,
with a valid MAC, hostile bodies: nesting past the limit, huge and non-finite numbers, non-objects,
wrong field types (values drawn by hypothesis), tensors of wrong dtypes and shapes, unknown ops.

Every authentic message is malformed for its role by construction (wrong shapes, epochs no job
reaches, sources that are not peers), so none can change what the job computes: a key holder who
sends well-formed results is not what a MAC can stop (docs/architecture.md, threat model).
"""

from __future__ import annotations

import functools
import json
import random

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dorylus_py.protocol import Message, ProtocolError, Session
from tests.protocol.forge import signed

FAR = 10**6  # an epoch no test job reaches
OPS = {
    "graph-server": ["pull_rows", "push_result", "ghosts", "progress"],
    "weight-server": ["pull_weights", "push_grad", "pull_state", "ping"],
    "driver": ["hello", "heartbeat", "epoch_stats", "tasks", "switch"],
    "worker": ["steal", "mix", "snapshot", "ping", "report", "row", "average", "dead"],  # decentral peers
}
NOT_AN_INDEX = [-1, 99, FAR, 1.5, "1", None, [1], {"a": 1}, True]  # no epoch, batch or rank of a small job
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)


@functools.lru_cache(maxsize=2)
def hypothesis_values(count: int) -> list:
    """``count`` JSON-like values drawn by hypothesis (NaN, infinities, huge integers included)."""
    values: list = []

    @settings(max_examples=count, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(JSON)
    def draw(value):
        values.append(value)

    draw()
    return values


def _task(rng: random.Random, values: list):
    """A task no job runs: a far epoch, a wrong type somewhere, or a hypothesis value."""
    task = {"kind": rng.choice(["fwd", "bwd", "loss", "fused", "eval", "rm", 7]), "train": rng.choice([True, False, 1, None]),
            "epoch": rng.choice([FAR + rng.randrange(1000), 0, -1, 1.5, "1", None, 2**53]),
            "layer": rng.choice([0, 1, 2, 99, -1, None]), "chunk": rng.choice([0, 1, 5, -3, "x"]),
            "attempt": rng.choice([1, 0, 2**53, None])}
    if rng.random() < 0.3:
        task[rng.choice(list(task))] = rng.choice(values)
    return rng.choice([task, task, rng.choice(values)])


def _array(rng: random.Random, forbidden: set) -> np.ndarray:
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


def _authentic(role: str, rng: random.Random, values: list) -> Message:
    """A message of the role's own ops, malformed for it."""
    op = rng.choice(OPS[role])
    v = lambda: rng.choice(values)  # noqa: E731
    fields = {"req": rng.choice(["r", None, 5, v()])}
    tensors: dict = {}
    if op in ("pull_rows", "push_result"):
        fields |= {"task": _task(rng, values), "version": rng.choice([0, -1, None, v()]), "loss_sum": v(), "correct": v(),
                   "have": rng.choice([None, ["f" * 32], v(), [v()], ["t" * 65], ["t"] * 9])}  # static-row tokens
        tensors = {rng.choice(["Z", "dW", "dG"]): _array(rng, set())} if op == "push_result" else {}
    elif op == "ghosts":  # never a peer's well-formed rows: a source that is no peer, or rows that do not fit
        fields |= {"phase": rng.choice(["fwd", "efwd", "bwd", "up", v()]), "epoch": rng.choice([1, FAR, v()]),
                   "layer": rng.choice([0, 1, 5]), "src": rng.choice([0, 2, 99, -1, v()]), "chunk": rng.choice([0, 1, 9]),
                   "min_epoch": rng.choice([1, v()])}
        tensors = {"positions": _array(rng, set()), "rows": _array(rng, set())}
    elif op == "progress":
        fields |= {"src": rng.choice([0, 2, 99, "1", None]), "min_epoch": v()}
    elif op in ("pull_weights", "pull_state"):
        fields |= {"layer": rng.choice([2, 9, -1, "0", None, v()]), "version": rng.choice([0, None, FAR, v()]),
                   "hold": rng.choice([None, [1, 2], [[1], 0, 0], v()])}
    elif op == "push_grad":  # a gradient of no layer's shape, or not finite float32, or a malformed key
        fields |= {"layer": rng.choice([0, 1, v()]), "version": rng.choice([0, v()]), "key": rng.choice([[1, 0, 0], v()])}
        tensors = {"grad": _array(rng, {(1433, 16), (16, 7)})}
    elif role == "worker":  # a peer's rank (so the handler sees it), every other field unusable
        bad = lambda: rng.choice(NOT_AN_INDEX + [x for x in values if type(x) is not int])  # noqa: E731
        fields = {"rank": rng.choice([0, 2, 2, 7, "0"]), "id": rng.choice([1, 2, None]), "epoch": bad(), "cycle": bad(),
                  "dead": bad(), "batches": rng.choice([[99], [bad()], bad()]), "row": rng.choice([{"epoch": "1"}, bad()]),
                  "left": v(), "loss_sum": v(), "count": bad(), "exchanges": bad(), "keep": v()}
        tensors = {name: _array(rng, {(4,)}) for name in rng.sample(["params", "grad", "tasks", "best"], rng.randrange(3))}
        if op == "report" and rng.random() < 0.3:
            tensors["tasks"] = np.frombuffer(b"[" * rng.choice([10, 100_000]), np.uint8)  # deep JSON in a tensor
    elif op in ("hello", "heartbeat"):  # the servers of the job said hello before the fuzzing starts
        fields |= {"role": rng.choice(["graph-server", "weight-server", "x", v()]), "rank": rng.choice([0, 1, 7, v()]),
                   "address": v()}
    else:
        fields |= {"rank": v(), "epoch": v(), "finished": v()}
    if rng.random() < 0.1:
        op = rng.choice(["format_disk", "start", "rows", "weights", "ok"] + (["stop"] if role != "worker" else []))
    return Message(op, fields, tensors)


def _hostile_header(rng: random.Random, values: list) -> bytes:
    choice = rng.randrange(7)
    if choice == 0:
        depth = rng.choice([17, 100, 5000, 30000])
        return b'{"op": "ping", "x": ' + b"[" * depth + b"]" * depth + b"}"
    if choice == 1:
        return rng.choice([b'{"op": "ping", "n": 1e999}', b'{"op": "ping", "n": NaN}', b'{"op": "ping", "n": -Infinity}',
                           b'{"op": "ping", "n": ' + b"9" * rng.choice([20, 5000]) + b"}"])
    if choice == 2:
        return rng.choice([b"[1, 2]", b'"op"', b"null", b"\xff\xfe\x00", b"{", b'{"op": "ping"'])
    if choice == 3:
        return b'{"op": "ping", "s": "' + b"a" * rng.choice([1000, 60000]) + b'"}'
    if choice == 4:  # tensor specs that do not match the frames
        specs = rng.choice([[{"name": "grad", "dtype": "float32", "shape": [2, 2]}],
                            [{"name": "grad", "dtype": "object", "shape": [1]}],
                            [{"name": "grad", "dtype": "float32", "shape": [-1]}],
                            [{"name": "Z", "dtype": "float32", "shape": [2**40, 2**40]}], {"Z": 1}])
        return json.dumps({"op": "push_grad", "tensors": specs}).encode()
    return json.dumps({"op": "ping", **{f"k{i}": rng.choice(values) for i in range(3)}}, allow_nan=True).encode()


def _sign(session: Session, msg: Message, to: str) -> list[bytes]:
    """``msg`` signed for ``to``; a header with NaN or infinities, which encode refuses, is signed as it is."""
    try:
        return [bytes(f) for f in session.encode(msg, to)]
    except ProtocolError:  # a non-finite number in a field
        specs = [{"name": n, "dtype": a.dtype.name, "shape": list(a.shape)} for n, a in msg.tensors.items()]
        header = json.dumps({"op": msg.op, "tensors": specs, **msg.fields}, allow_nan=True).encode()
        return signed(session, header, *[a.tobytes() for a in msg.tensors.values()], to=to)


def corpus(role: str, key: bytes, to: str, count: int, seed: int = 0) -> list[list[bytes]]:
    """``count`` hostile messages for the process of ``role`` listening at ``to``."""
    rng = random.Random(seed)
    values = hypothesis_values(300)
    me, stranger = Session(key), Session(b"a key that is not the job's key.")
    sent: list[list[bytes]] = []
    out: list[list[bytes]] = []
    for i in range(count):
        kind = i % 8
        if kind == 0:
            frames = [rng.randbytes(rng.choice([0, 1, 67, 68, 69, 300])) for _ in range(rng.randrange(1, 6))]
            if rng.random() < 0.5 and frames:
                frames[0] = b"DRY1" + frames[0][4:]
        elif kind in (1, 2):
            frames = _sign(me, _authentic(role, rng, values), to)
            if kind == 1:
                frames = frames[: rng.randrange(len(frames))] or [frames[0][: rng.randrange(68)]]
            else:
                j = rng.randrange(len(frames))
                if frames[j]:
                    b = bytearray(frames[j])
                    b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
                    frames[j] = bytes(b)
        elif kind == 3:
            frames = _sign(stranger, _authentic(role, rng, values), to) if rng.random() < 0.5 else \
                _sign(me, _authentic(role, rng, values), "tcp://10.9.9.9:1")
        elif kind == 4 and sent:
            frames = rng.choice(sent)  # replayed: its sequence number was used already
        elif kind == 5:
            frames = signed(me, _hostile_header(rng, values), *[rng.randbytes(rng.choice([0, 4, 16])) for _ in
                                                                range(rng.randrange(3))], to=to)
        else:
            frames = _sign(me, _authentic(role, rng, values), to)
            if rng.random() < 0.2:
                sent.append(frames)
        out.append([bytes(f) for f in frames])
    return out
