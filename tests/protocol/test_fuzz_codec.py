"""Property tests of the codec without sockets: whatever arrives, decoding either returns a message whose
tensors match their frames or raises ProtocolError; nothing else escapes, and the depth pre-scan
agrees with the JSON parser."""

import json

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dorylus_py.protocol import Message, ProtocolError, Session
from dorylus_py.protocol.bounded_json import nesting_depth, parse_header
from tests.cluster.fuzz_corpus import JSON
from tests.protocol.forge import signed

KEY = b"fuzz key of thirty-two bytes...."
ADDR = "tcp://127.0.0.1:7100"
FAST = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _depth(value) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


@FAST
@given(JSON)
def test_the_depth_prescan_agrees_with_the_parser(value):
    raw = json.dumps({"v": value}, allow_nan=True).encode()
    assert nesting_depth(raw) == 1 + _depth(value)


@FAST
@given(st.binary(max_size=300))
def test_any_header_bytes_parse_or_raise_protocol_error(raw):
    try:
        assert isinstance(parse_header(raw), dict)
    except ProtocolError:
        pass


@FAST
@given(st.lists(st.binary(max_size=100), max_size=6))
def test_random_frames_are_refused(frames):
    try:
        Session(KEY).decode(frames, ADDR)
    except ProtocolError:
        return
    raise AssertionError("random frames passed the MAC")


@FAST
@given(st.dictionaries(st.text(max_size=10), JSON, max_size=5), st.lists(st.binary(max_size=64), max_size=4),
       st.sampled_from(["ping", "rows", "push_grad", "format_disk"]))
def test_authentic_hostile_headers_decode_consistently_or_raise_protocol_error(fields, data, op):
    """A key holder's header, however odd, with arbitrary data frames: the result, if any, holds only
    finite numbers within range and tensors that are exactly their frames."""
    sender, receiver = Session(KEY), Session(KEY)
    header = json.dumps({"op": op, **fields}, allow_nan=True).encode()
    try:
        msg = receiver.decode(signed(sender, header, *data, to=ADDR), ADDR)
    except ProtocolError:
        return
    assert isinstance(msg, Message) and msg.sender == sender.id
    numbers = [v for v in _leaves(msg.fields) if isinstance(v, (int, float)) and not isinstance(v, bool)]
    assert all(np.isfinite(v) and abs(v) <= 2**53 for v in numbers)
    assert [t.nbytes for t in msg.tensors.values()] == [len(d) for d in data]


@FAST
@given(st.lists(st.tuples(st.sampled_from(["float32", "int64", "bool", "uint8"]),
                          st.lists(st.integers(0, 5), max_size=3)), max_size=4))
def test_round_trips_of_any_tensors(specs):
    sender, receiver = Session(KEY), Session(KEY)
    tensors = {f"t{i}": (np.arange(int(np.prod(shape))) % 3).astype(dtype).reshape(shape) for i, (dtype, shape) in enumerate(specs)}
    got = receiver.decode(sender.encode(Message("task", {"n": len(specs)}, tensors), ADDR), ADDR)
    assert got["n"] == len(specs) and set(got.tensors) == set(tensors)
    for name, t in tensors.items():
        assert got.tensors[name].dtype == t.dtype and np.array_equal(got.tensors[name], t)


def _leaves(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v)
    else:
        yield value
