"""Signed messages: round trips without sockets and over inproc PAIR sockets, and every check's refusal."""

import struct

import numpy as np
import pytest
import zmq

from dorylus_py.errors import ConfigError
from dorylus_py.protocol import AuthError, Limits, Message, ProtocolError, Session
from dorylus_py.protocol.session import _FIXED, ENVELOPE_BYTES
from tests.protocol import forge

KEY = bytes(range(32))
ADDR = "tcp://127.0.0.1:7100"


def pair() -> tuple[Session, Session]:
    return Session(KEY), Session(KEY)


def test_round_trip_without_copies():
    a, b = pair()
    z = np.arange(12, dtype=np.float32).reshape(3, 4)
    frames = a.encode(Message("result", {"task": {"chunk": 1}}, {"Z": z, "m": np.array([True, False])}), ADDR)
    assert len(frames[0]) == ENVELOPE_BYTES
    assert np.shares_memory(np.asarray(frames[2]), z)  # encode: the frame is the array's own memory
    got = b.decode(frames, ADDR)
    assert np.shares_memory(got.tensors["Z"], z)  # decode: the tensor is a view of the frame
    assert got.op == "result" and got["task"] == {"chunk": 1} and got.sender == a.id
    np.testing.assert_array_equal(got.tensors["Z"], z)
    assert got.tensors["m"].tolist() == [True, False] and "tensors" not in got.fields


def test_reply_is_bound_to_the_asking_session():
    client, server = pair()
    request = server.decode(client.encode(Message("lease", {"req": "r1"}), ADDR), ADDR)
    reply = server.encode(Message("ok", {"req": "r1"}), request.sender)
    assert client.decode(reply, client.id).op == "ok"
    other = Session(KEY)
    with pytest.raises(AuthError, match="bad MAC"):  # a captured reply is useless to any other session
        other.decode(server.encode(Message("ok", {"req": "r1"}), request.sender), other.id)


def test_round_trip_over_pair_sockets_zero_copy():
    ctx = zmq.Context.instance()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind("inproc://session-test")
    b.connect("inproc://session-test")
    sa, sb = pair()
    big = np.random.default_rng(0).standard_normal((1000, 64)).astype(np.float32)
    for _ in range(2):  # each message gets its own sequence number
        a.send_multipart(sa.encode(Message("task", {}, {"P": big, "empty": np.zeros((0, 64), np.float32)}), ADDR),
                         copy=False)
        frames = b.recv_multipart(copy=False)
        got = sb.decode(frames, ADDR)
        assert np.shares_memory(got.tensors["P"], np.frombuffer(frames[2].buffer, np.uint8))  # read in place
        np.testing.assert_array_equal(got.tensors["P"], big)
        assert got.tensors["empty"].shape == (0, 64)
    a.close()
    b.close()


@pytest.mark.parametrize("wire, bytes_per_row", [("float32", 4 * 64), ("bfloat16", 2 * 64), ("float16", 2 * 64),
                                                  ("int8", 64 + 2)])
def test_row_blocks_travel_in_the_form_named_and_arrive_as_float32(wire, bytes_per_row):
    a, b = pair()
    z = np.random.default_rng(0).standard_normal((10, 64)).astype(np.float32)
    ids = np.arange(10)
    frames = a.encode(Message("ghosts", {}, {"rows": z, "positions": ids}, wire={"rows": wire}), ADDR)
    assert len(frames[2]) == 10 * bytes_per_row and len(frames[3]) == ids.nbytes  # only the rows narrower
    got = b.decode(frames, ADDR)
    assert got.tensors["rows"].dtype == np.float32 and got.tensors["rows"].shape == (10, 64)
    assert got.wire == ({} if wire == "float32" else {"rows": wire}) and got.tensor_bytes() == 10 * bytes_per_row + 80
    step = {"float32": 0, "bfloat16": 2**-8, "float16": 2**-11, "int8": 1 / 127}[wire]
    assert np.all(np.abs(got.tensors["rows"] - z) <= step * np.abs(z).max(axis=1, keepdims=True) * 1.01)
    np.testing.assert_array_equal(got.tensors["positions"], ids)


def test_only_float32_row_blocks_can_be_sent_narrower():
    with pytest.raises(ProtocolError, match="tensor 'P': expected 2-D float32"):
        Session(KEY).encode(Message("task", {}, {"P": np.zeros(4, np.float32)}, wire={"P": "int8"}), ADDR)


def test_the_key_travels_in_no_frame():
    a, _ = pair()
    frames = a.encode(Message("task", {"x": KEY.hex()[:0]}, {"P": np.frombuffer(b"\0" * 64, np.uint8)}), ADDR)
    blob = b"".join(bytes(f) for f in frames)
    assert KEY not in blob and KEY.hex().encode() not in blob and "KEY" not in repr(a) and KEY.hex() not in repr(a)


def signed(session: Session, header: bytes, *data: bytes, me=ADDR) -> list:
    return forge.signed(session, header, *data, to=me)


P = ["P", "float32", [2, 2]]


def json_nested(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize(
    "header, data, message",
    [
        (b"\xc1", [], "not a valid header"),  # a byte MessagePack never uses
        (b"\x93\xa2ok\x90\x81\xa1s\xa2\xff\xfe", [], "not a valid header"),  # a string not UTF-8 (msgspec: ValueError)
        (forge.packed({"op": "ok"}), [], "Expected `array`, got `object`"),
        (forge.packed([1, 2]), [], "Expected `array` of at least length 3"),
        (forge.packed(["ok", [], {}, 1]), [], "Expected `array` of at most length 3"),
        (b"\x91" * 5000 + b"\xc0", [], "not a valid header|Expected"),
        (forge.header("ok", x=json_nested(9)), [], "the fields.*: nested more than 8 deep"),
        (forge.header("ok", epoch=float("inf")), [], "not a finite number"),
        (forge.header("ok", epoch=float("nan")), [], "not a finite number"),
        (forge.header("ok", epoch=-float("inf")), [], "not a finite number"),
        (forge.header("ok", epoch=2**64 - 1), [], "an integer out of range"),
        (forge.header("ok", epoch=2**53 + 1), [], "an integer out of range"),
        (forge.header("ok", epoch=b"\x01"), [], "got `bytes`"),
        (forge.header("ok", epoch={1: 2}), [], "a key of the fields.*Expected `str`, got `int`"),
        (forge.packed(["ok", [], {1: 2}]), [], "a key of the fields: Expected `str`, got `int`"),
        (forge.packed(["ok", [], {"x" * 65: 2}]), [], "a key of the fields: Expected `str` of length <= 64"),
        (forge.header("launch_missiles"), [], "the op: Invalid enum value 'launch_missiles'"),
        (forge.header(["ok"]), [], "the op: Expected `str`"),
        (forge.header("task", [P]), [], "does not match the 0 data"),
        (forge.header("task", [P]), [b"\0" * 15], r"15 bytes, but shape \[2, 2\] of float32 needs 16"),
        (forge.header("task", [["P", "object", [1]]]), [b"\0" * 8], r"tensor spec 0 \[1\]: Invalid enum value 'object'"),
        (forge.header("task", [["P", ["float32"], [1]]]), [b"\0" * 4], "tensor spec 0.*Expected `str`"),
        (forge.header("task", [["P", "float32", [-1]]]), [b""], "tensor spec 0.*Expected `int` >= 0"),
        (forge.header("task", [["P", "float32", [2**31]]]), [b""], "tensor spec 0.*Expected `int` <= 2147483647"),
        (forge.header("task", [["P", "float32", [True]]]), [b"\0" * 4], "tensor spec 0.*Expected `int`, got `bool`"),
        (forge.header("task", [["P", "uint8", [1, 1, 1, 1, 1]]]), [b"\0"], r"tensor spec 0 \[2\]: Expected `array` of length <= 4"),
        (forge.header("task", [["", "uint8", [1]]]), [b"\0"], "tensor spec 0.*length >= 1"),
        (forge.header("task", [["P" * 65, "uint8", [1]]]), [b"\0"], "tensor spec 0.*length <= 64"),
        (forge.header("task", [["P", "uint8", [1]], ["P", "uint8", [1]]]), [b"\0", b"\0"], "named twice"),
        (forge.packed(["task", {"P": 1}, {}]), [b"\0"], "the tensor list: Expected `array`, got `object`"),
        (forge.header("task", [["P", "float32", [2, 2], "int4"]]), [b"\0" * 8], "Invalid enum value 'int4'"),
        (forge.header("task", [["P", "int64", [2, 2], "int8"]]), [b"\0" * 8], "for 2-D float32 rows"),
        (forge.header("task", [["P", "float32", [4], "float16"]]), [b"\0" * 8], "for 2-D float32 rows"),
        (forge.header("task", [["P", "float32", [2, 2], "int8"]]), [b"\0" * 7], r"7 bytes, but shape \[2, 2\] in int8 needs 8"),
        (forge.header("task", [["P", "float32", [65536, 65536], "bfloat16"]]), [b""], "larger than a frame may be"),
        (forge.header("task", [["P", "float32", [1], "float32", 1]]), [b"\0" * 4], "tensor spec 0: Expected `array` of at most length 4"),
    ],
)
def test_hostile_bodies_with_a_valid_mac_are_refused(header, data, message):
    sender, receiver = pair()
    with pytest.raises(ProtocolError, match=message) as err:
        receiver.decode(signed(sender, header, *data), ADDR)
    assert not isinstance(err.value, AuthError)  # authenticated: answered with an error, not dropped


def test_a_field_nests_eight_deep_and_no_deeper_on_either_side():
    sender, receiver = pair()
    assert receiver.decode(sender.encode(Message("ok", {"x": json_nested(8)}), ADDR), ADDR)["x"] == json_nested(8)
    with pytest.raises(ProtocolError, match="field 'x': nested more than 8 deep"):
        sender.encode(Message("ok", {"x": json_nested(9)}), ADDR)
    with pytest.raises(ProtocolError, match="nested more than 8 deep"):
        receiver.decode(signed(sender, forge.header("ok", x=json_nested(9))), ADDR)


def test_brackets_and_escaped_quotes_inside_strings_are_only_text():
    sender, receiver = pair()
    text = '[[[[{{{{\\"' * 100 + "\\\\"
    got = receiver.decode(signed(sender, forge.header("ok", s=text, t="]]}}")), ADDR)
    assert got["s"] == text


@pytest.mark.parametrize("mutate, message", [
    (lambda f: [], "0 frames"),
    (lambda f: f[:1], "1 frames"),
    (lambda f: f + [b""] * 1100, "frames"),
    (lambda f: [f[0][:-1], *f[1:]], "envelope of 67 bytes"),
    (lambda f: [f[0], b" " * 70_000], "header of 70000 bytes"),
    (lambda f: [b"XXXX" + f[0][4:], *f[1:]], "bad magic"),
    (lambda f: [f[0][:-1] + bytes([f[0][-1] ^ 1]), *f[1:]], "bad MAC"),
    (lambda f: [f[0], f[1][:-1], *f[2:]], "bad MAC"),
    (lambda f: [f[0], f[1], f[2][:-4]], "bad MAC"),
    (lambda f: [f[0], f[1], bytes(len(f[2]))], "bad MAC"),
    (lambda f: [f[0][:4] + bytes(16) + f[0][20:], *f[1:]], "bad MAC"),  # another sender id
    (lambda f: [f[0][:20] + struct.pack(">Q", 99) + f[0][28:], *f[1:]], "bad MAC"),  # another sequence number
])
def test_unauthenticated_messages_are_refused_before_parsing(mutate, message):
    sender, receiver = pair()
    frames = [bytes(f) for f in sender.encode(Message("task", {}, {"P": np.ones(4, np.float32)}), ADDR)]
    with pytest.raises(AuthError, match=message):
        receiver.decode(mutate(frames), ADDR)


def test_wrong_key_and_wrong_audience_are_refused():
    frames = Session(b"another key of 32 bytes........!").encode(Message("ok"), ADDR)
    with pytest.raises(AuthError, match="bad MAC"):
        Session(KEY).decode(frames, ADDR)
    sender, receiver = pair()
    with pytest.raises(AuthError, match="bad MAC"):  # signed for another server
        receiver.decode(sender.encode(Message("ok"), "tcp://127.0.0.1:7101"), ADDR)


def test_replays_are_refused():
    sender, receiver = pair()
    first = sender.encode(Message("ok"), ADDR)
    second = sender.encode(Message("ok"), ADDR)
    receiver.decode(second, ADDR)
    receiver.decode(first, ADDR)  # overtaken within the window: still new
    for frames in (first, second):
        with pytest.raises(AuthError, match="replay"):
            receiver.decode(frames, ADDR)


def test_short_keys_are_refused_and_sending_non_finite_numbers_fails_clearly():
    with pytest.raises(ValueError, match="at least 16 bytes"):
        Session(b"short")
    with pytest.raises(ProtocolError, match="not a finite number"):
        Session(KEY).encode(Message("epoch_stats", {"loss_sum": float("nan")}), ADDR)
    with pytest.raises(ProtocolError, match="cannot be sent"):
        Session(KEY).encode(Message("task", {}, {"P": np.array(["a"])}), ADDR)


def test_a_shape_whose_size_overflows_is_refused_by_name():
    """np.prod in int64 wraps: [65536] * 4 is 2**64 elements, "0" bytes; a reshape then raised ValueError,
    which no receive loop caught (it killed every role of a live job)."""
    a, b = pair()
    for shape in ([65536, 65536, 65536, 65536], [2**31 - 1] * 4, [2**16, 2**16, 2**16, 2**16 + 1], [3, -1],
                  [0, 2**31 - 1, 2**31 - 1, 2**31 - 1], [2**31 - 1, 0, 2**20]):  # empty, yet too big for numpy
        header = forge.header("push_grad", [["g", "float32", shape]])
        with pytest.raises(ProtocolError, match="Expected `int`|needs|larger than a frame") as e:
            b.decode(forge.signed(a, header, b"", to=ADDR), ADDR)
        assert type(e.value) is ProtocolError  # authentic, malformed: never a ValueError


def test_requests_are_bound_to_their_job():
    """A request signed for one job's nonce is refused in another job at the same address; a server's
    hello, sent before it knows the job, is accepted only where the receiver allows it unbound."""
    job1, job2 = b"\x01" * 16, b"\x02" * 16
    sender = Session(KEY, job=job1)
    in_job2 = Session(KEY, job=job2)
    with pytest.raises(AuthError, match="bad MAC"):
        in_job2.decode(sender.encode(Message("push_grad", {}), ADDR), ADDR)
    assert Session(KEY, job=job1).decode(sender.encode(Message("push_grad", {}), ADDR), ADDR).op == "push_grad"
    server = Session(KEY)  # before its start: bound to no job
    driver = Session(KEY).for_job(job2)
    assert driver.decode(server.encode(Message("hello", {}), ADDR), ADDR, unbound=frozenset({"hello"})).op == "hello"
    with pytest.raises(AuthError, match="signed for no job"):
        driver.decode(server.encode(Message("epoch_stats", {}), ADDR), ADDR, unbound=frozenset({"hello"}))
    with pytest.raises(AuthError, match="bad MAC"):
        driver.decode(server.encode(Message("hello", {}), ADDR), ADDR)


def test_a_new_session_refuses_what_was_sent_before_it_began():
    """A restarted process (or a server's session for its next job) starts with empty sequence windows,
    but nothing stamped before it began is accepted: a captured message cannot be replayed into it."""
    sender = Session(KEY)
    captured = sender.encode(Message("hello", {}), ADDR)
    later = Session(KEY)
    with pytest.raises(AuthError, match="older than this session"):
        later.decode(captured, ADDR)
    assert later.decode(sender.encode(Message("hello", {}), ADDR), ADDR).op == "hello"


def test_for_job_shares_the_sender_identity():
    base = Session(KEY)
    view = base.for_job(b"\x07" * 16)
    assert view.id == base.id and view.replay is base.replay and base.job == b""
    first, second = base.encode(Message("ok"), ADDR), view.encode(Message("ok"), ADDR)
    seqs = [_FIXED.unpack(bytes(f[0][: _FIXED.size]))[2] for f in (first, second)]
    assert seqs[1] == seqs[0] + 1  # one sequence: no number is used twice by the same sender id


def test_a_message_signed_for_no_job_must_be_a_bare_hello_before_it_takes_a_replay_slot():
    """Issue 40: the driver parsed an unbound message whole before it checked its op, so any key holder
    reached its parser without the job's nonce. Now the header's first bytes must name ``hello`` and
    there may be no tensors; anything else is refused before the replay guard or the parser sees it."""
    server, driver = Session(KEY), Session(KEY).for_job(b"\x02" * 16)
    hello = frozenset({"hello"})
    bad = [server.encode(Message("push_grad", {}, {"g": np.zeros(2, np.float32)}), ADDR),
           server.encode(Message("hello", {}, {"g": np.zeros(2, np.float32)}), ADDR),
           forge.signed(server, forge.header("push_grad", [["g", "float32", [0, 2**31 - 1, 2**31 - 1, 2**31 - 1]]]),
                        b"", to=ADDR),
           forge.signed(server, forge.packed([[], "hello", {}]), to=ADDR),  # the op not first: not as encode writes
           forge.signed(server, forge.packed([["hello"], [], {}]), to=ADDR)]
    for frames in bad:
        with pytest.raises(AuthError, match="signed for no job"):
            driver.decode(frames, ADDR, unbound=hello)
    assert server.id not in driver.replay.senders
    assert driver.decode(server.encode(Message("hello", {"rank": 0}), ADDR), ADDR, unbound=hello)["rank"] == 0


def test_a_sender_refuses_a_message_over_the_cap_naming_the_setting(monkeypatch):
    small = Session(KEY, Limits(max_message_bytes=1000))
    with pytest.raises(ProtocolError, match="exceeds the cap of 1000.*DORYLUS_MAX_MESSAGE_MB"):
        small.encode(Message("task", {}, {"P": np.zeros(300, np.float32)}), ADDR)
    monkeypatch.setenv("DORYLUS_MAX_MESSAGE_MB", "3")
    assert Limits().max_message_bytes == 3 * 2**20
    for bad in ("0", "2048", "1e3", "-1"):
        monkeypatch.setenv("DORYLUS_MAX_MESSAGE_MB", bad)
        with pytest.raises(ConfigError, match="DORYLUS_MAX_MESSAGE_MB"):
            Limits()
