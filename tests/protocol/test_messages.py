import json

import numpy as np
import pytest
import zmq

from dorylus_py.protocol import Message, ProtocolError, decode, encode, require

TOKEN = "t0k3n"


def test_round_trip_without_copies():
    z = np.arange(12, dtype=np.float32).reshape(3, 4)
    frames = encode(Message("push_result", {"task": {"chunk": 1}}, {"Z": z, "m": np.array([True, False])}), TOKEN)
    assert np.shares_memory(np.asarray(frames[1]), z)  # encode: the frame is the array's own memory
    got = decode(frames, TOKEN)
    assert np.shares_memory(got.tensors["Z"], z)  # decode: the tensor is a view of the frame
    assert got.op == "push_result" and got["task"] == {"chunk": 1}
    np.testing.assert_array_equal(got.tensors["Z"], z)
    assert got.tensors["m"].tolist() == [True, False]


def test_round_trip_over_pair_sockets_zero_copy():
    ctx = zmq.Context.instance()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind("inproc://msg-test")
    b.connect("inproc://msg-test")
    big = np.random.default_rng(0).standard_normal((1000, 64)).astype(np.float32)
    a.send_multipart(encode(Message("rows", {}, {"P": big, "empty": np.zeros((0, 64), np.float32)}), TOKEN), copy=False)
    frames = b.recv_multipart(copy=False)
    got = decode(frames, TOKEN)
    assert np.shares_memory(got.tensors["P"], np.frombuffer(frames[1].buffer, np.uint8))  # read in place
    np.testing.assert_array_equal(got.tensors["P"], big)
    assert got.tensors["empty"].shape == (0, 64)
    a.close()
    b.close()


def frames_of(header: dict, *data: bytes) -> list:
    return [json.dumps(header).encode(), *data]


@pytest.mark.parametrize(
    "frames, message",
    [
        ([], "empty message"),
        ([b"{not json"], "not valid JSON"),
        ([b"[1, 2]"], "not a JSON object"),
        (frames_of({"op": "ok", "token": "wrong"}), "wrong or missing job token"),
        (frames_of({"op": "ok"}), "wrong or missing job token"),
        (frames_of({"op": "launch_missiles", "token": TOKEN}), "unknown op"),
        (frames_of({"op": "rows", "token": TOKEN, "tensors": [{"name": "P", "dtype": "float32", "shape": [2, 2]}]}),
         "names 1 tensors but 0 data frames"),
        (frames_of({"op": "rows", "token": TOKEN, "tensors": [{"name": "P", "dtype": "float32", "shape": [2, 2]}]}, b"\0" * 15),
         r"15 bytes, but shape \[2, 2\] of float32 needs 16"),
        (frames_of({"op": "rows", "token": TOKEN, "tensors": [{"name": "P", "dtype": "object", "shape": [1]}]}, b"\0" * 8),
         "dtype 'object' not allowed"),
        (frames_of({"op": "rows", "token": TOKEN, "tensors": [{"name": "P", "dtype": "float32", "shape": [-1]}]}, b""),
         "bad shape"),
        ([b"x" * 70_000], "exceeds"),
    ],
)
def test_bad_messages_are_rejected(frames, message):
    with pytest.raises(ProtocolError, match=message):
        decode(frames, TOKEN)


def test_require_checks_fields_and_shapes():
    msg = Message("push_result", {"task": 1}, {"Z": np.zeros((3, 4), np.float32)})
    require(msg, "task", shapes={"Z": (3, 4)})
    with pytest.raises(ProtocolError, match="missing 'loss_sum'"):
        require(msg, "loss_sum")
    with pytest.raises(ProtocolError, match=r"shape \[3, 4\], expected \[3, 5\]"):
        require(msg, shapes={"Z": (3, 5)})
