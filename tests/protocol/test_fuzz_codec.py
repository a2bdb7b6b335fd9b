"""Property tests of the codec without sockets: whatever arrives, decoding either returns a message whose
tensors match their frames and whose fields are within the header's bounds, or raises ProtocolError;
nothing else escapes. The header (MessagePack against a schema, ``protocol/header.py``) is fuzzed in
bounds, types and sizes: random bytes, any MessagePack value, headers of the right layout with hostile
ops, specs and fields, and headers cut short. The JSON parser that reads reports and files
(``bounded_json.py``) is fuzzed too, and its depth pre-scan checked against it."""

import json
import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dorylus_py.protocol import Message, ProtocolError, Session
from dorylus_py.protocol.bounded_json import nesting_depth, parse_object
from dorylus_py.protocol.header import MAX_DEPTH, Header, decode_header
from dorylus_py.protocol.messages import DTYPES, MAX_INT, OPS
from tests.cluster.fuzz_corpus import JSON
from tests.protocol.forge import header, packed, signed

KEY = b"fuzz key of thirty-two bytes...."
ADDR = "tcp://127.0.0.1:7100"
FAST = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# whatever MessagePack can carry: integers to 2**64, NaN and infinities, bytes, maps with any keys
PACKABLE = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=20)
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=8) | st.integers(-5, 5), inner, max_size=4),
    max_leaves=16)
SIZES = st.integers(-3, 2**31 + 3) | st.sampled_from([0, 1, 2**31 - 1, 2**31, 2**32, 2**63, -(2**63)])
SPEC = st.one_of(
    st.tuples(st.text(max_size=70), st.sampled_from([*DTYPES, "object", "float16", ""]),
              st.lists(SIZES, max_size=6)).map(list),
    st.tuples(st.text(min_size=1, max_size=8), st.sampled_from(list(DTYPES)), st.lists(st.integers(0, 4), max_size=3),
              st.sampled_from(["float32", "bfloat16", "float16", "int8", "int4", 7])).map(list),
    PACKABLE)
OP = st.sampled_from(sorted(OPS)) | st.sampled_from(["format_disk", "", "OK"]) | PACKABLE


def _depth(value) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


def _within_bounds(value, depth: int = 1) -> bool:
    """What a decoded field may hold: JSON's kinds of values, numbers within 2**53, at most MAX_DEPTH deep."""
    if type(value) is bool or value is None or type(value) is str:
        return True
    if type(value) is int:
        return abs(value) <= MAX_INT
    if type(value) is float:
        return math.isfinite(value) and abs(value) <= MAX_INT
    if type(value) is list:
        return depth <= MAX_DEPTH and all(_within_bounds(v, depth + 1) for v in value)
    if type(value) is dict:
        return depth <= MAX_DEPTH and all(type(k) is str and _within_bounds(v, depth + 1) for k, v in value.items())
    return False


@FAST
@given(st.binary(max_size=300))
def test_any_bytes_decode_as_a_header_or_a_report_row_or_raise_protocol_error(raw):
    for parse, kind in ((decode_header, Header), (parse_object, dict)):  # the wire's and the reports' parsers
        try:
            assert isinstance(parse(raw), kind)
        except ProtocolError:
            pass


@FAST
@given(PACKABLE)
def test_any_messagepack_value_decodes_as_a_header_within_bounds_or_is_refused(value):
    try:
        got = decode_header(packed(value))
    except ProtocolError:
        return
    assert got.op in OPS and all(_within_bounds(v) for v in got.fields.values())


@FAST
@given(OP, st.lists(SPEC, max_size=4), st.dictionaries(st.text(max_size=70) | st.integers(0, 3), PACKABLE, max_size=5),
       st.integers(0, 40))
def test_hostile_headers_of_the_right_layout_and_cut_ones_decode_within_bounds_or_are_refused(op, specs, fields, cut):
    raw = packed([op, specs, fields])
    for frame in (raw, raw[: max(0, len(raw) - cut)]):
        try:
            got = decode_header(frame)
        except ProtocolError:
            continue
        assert got.op in OPS and all(_within_bounds(v) for v in got.fields.values())
        for spec in got.tensors:
            assert 0 < len(spec.name) <= 64 and spec.dtype in DTYPES and len(spec.shape) <= 4
            assert all(type(s) is int and 0 <= s < 2**31 for s in spec.shape)


@FAST
@given(st.lists(st.binary(max_size=100), max_size=6))
def test_random_frames_are_refused(frames):
    try:
        Session(KEY).decode(frames, ADDR)
    except ProtocolError:
        return
    raise AssertionError("random frames passed the MAC")


@FAST
@given(st.dictionaries(st.text(max_size=10), PACKABLE, max_size=5), st.lists(st.binary(max_size=64), max_size=4),
       st.lists(SPEC, max_size=4), st.sampled_from(["ping", "result", "push_grad", "format_disk"]))
def test_authentic_hostile_headers_decode_consistently_or_raise_protocol_error(fields, data, specs, op):
    """A key holder's header, however odd, with arbitrary data frames: the result, if any, holds only
    fields within the bounds and tensors that are exactly their frames."""
    sender, receiver = Session(KEY), Session(KEY)
    try:
        msg = receiver.decode(signed(sender, header(op, specs, **fields), *data, to=ADDR), ADDR)
    except ProtocolError:
        return
    assert isinstance(msg, Message) and msg.sender == sender.id
    assert all(_within_bounds(v) for v in msg.fields.values())
    assert [t.nbytes for t in msg.tensors.values()] == [len(d) for d in data]


@FAST
@given(st.lists(st.tuples(st.sampled_from(["float32", "int64", "bool", "uint8"]),
                          st.lists(st.integers(0, 5), max_size=3)), max_size=4),
       st.dictionaries(st.text(min_size=1, max_size=10), JSON, max_size=4))
def test_round_trips_of_any_tensors_and_fields(specs, fields):
    sender, receiver = Session(KEY), Session(KEY)
    tensors = {f"t{i}": (np.arange(int(np.prod(shape))) % 3).astype(dtype).reshape(shape) for i, (dtype, shape) in enumerate(specs)}
    try:
        frames = sender.encode(Message("task", fields, tensors), ADDR)
    except ProtocolError:  # a field the sender refuses is one every receiver would
        assert not all(_within_bounds(v) for v in fields.values())
        return
    got = receiver.decode(frames, ADDR)
    assert got.fields == fields and set(got.tensors) == set(tensors)
    for name, t in tensors.items():
        assert got.tensors[name].dtype == t.dtype and np.array_equal(got.tensors[name], t)


@FAST
@given(JSON)
def test_the_depth_prescan_agrees_with_the_json_parser(value):
    raw = json.dumps({"v": value}, allow_nan=True).encode()
    assert nesting_depth(raw) == 1 + _depth(value)
