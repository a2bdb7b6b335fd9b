"""A server's counterparts, played by a test: the driver's socket, a tensor worker or peer (a DEALER with
the job key), and the frames a forger or a broken peer would send. Every socket passes the job's PLAIN
gate (a server admits only clients with the job's password: issue 40)."""


import pytest
import zmq

from dorylus_py.protocol import Message, Session
from dorylus_py.protocol.transport import Plain, dealer, router
from tests.protocol.forge import header, signed

KEY = b"k" * 32
PUSHER = "ab" * 16  # the gradient sender id a driver draws for a graph server (weights/server.py), in its start


@pytest.fixture()
def driver():
    sock = router(zmq.Context.instance(), Plain.of_job(KEY))
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    yield f"tcp://127.0.0.1:{port}"
    sock.close(0)


class Client:
    """A tensor worker's side: one DEALER and a session with the job key."""

    def __init__(self, node, key=KEY, sender: bytes | None = None):
        """``sender``: the session's id (a graph server's gradient sender, ``PUSHER``), else a random one."""
        self.node, self.session = node, Session(key)
        if sender is not None:
            self.session.id = sender
        self.sock = dealer(zmq.Context.instance(), node.address, Plain.of_job(KEY))  # the gate's; signed with ``key``

    def frames(self, msg: Message) -> list:
        return self.session.encode(msg, self.node.address)

    def ask(self, handle, frames_or_msg):
        frames = self.frames(frames_or_msg) if isinstance(frames_or_msg, Message) else frames_or_msg
        self.sock.send_multipart(frames)
        for _ in range(100):
            self.node.serve_once(handle, 20)
            if self.sock.poll(10):
                return self.session.decode(self.sock.recv_multipart(), self.session.id)
        raise AssertionError("no reply")

    def unanswered(self, handle, frames) -> None:
        before = self.node.rejections.counts["unauthenticated"]
        self.sock.send_multipart(frames)
        for _ in range(100):
            self.node.serve_once(handle, 20)
            if self.node.rejections.counts["unauthenticated"] > before:
                break
        assert self.node.rejections.counts["unauthenticated"] == before + 1
        assert not self.sock.poll(50)  # nothing goes back, not even an error

    def close(self):
        self.sock.close(0)


def unauthenticated(client, task) -> dict:
    good = client.frames(Message("result", {"lease": "x", "task": task}))
    replayed = client.frames(Message("result", {"lease": "x", "task": dict(task, epoch=9)}))
    return {
        "truncated frames": good[:1],
        "unsigned": [b"\0" * 68, header("result", task=task)],
        "not a message": [b"\xff\xfe"],
        "altered": [good[0], bytes(good[1])[:-1] + b"\xc0"],  # still a header, no longer what was signed
        "wrong key": Client(client.node, b"another key, 32 bytes long......").frames(Message("result", {"task": task})),
        "signed for another server": client.session.encode(Message("result", {"task": task}), "tcp://127.0.0.1:1"),
        "replayed": replayed,
    }, replayed


def authentic_but_bad(client) -> dict:
    short = header("result", [["Z", "float32", [2, 4]]], task={})
    return {
        "short tensor": signed(client.session, short, b"\0" * 7, to=client.node.address),
        "unknown op": signed(client.session, header("format_disk"), to=client.node.address),
        "deep": signed(client.session, header("lease")[:-1] + b"\x81\xa5lease" + b"\x91" * 5000 + b"\xc0",
                       to=client.node.address),
        "huge number": signed(client.session, header("lease", epoch=float("inf")), to=client.node.address),
    }
