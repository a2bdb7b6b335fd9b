"""The Lambda service under a peer that holds connections open, resets them, or sends bodies it never signed
(issue 52, item 8): a fresh caller is still served at once, a request must arrive whole within its deadline,
the signature is checked on the headers before the body is read, and resets cost one log line a second, no
traceback. In one process, on loopback (127.0.0.0/8 gives a peer as many addresses as it likes)."""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import socket
import struct
import threading
import time

import pytest

pytest.importorskip("aiobotocore")

from botocore.auth import SigV4Auth  # noqa: E402
from botocore.awsrequest import AWSRequest  # noqa: E402
from botocore.credentials import Credentials as BotoCredentials  # noqa: E402

from dorylus_py.lab import connections  # noqa: E402
from dorylus_py.lab.connections import Connections, GuardedServer  # noqa: E402
from dorylus_py.lab.lambda_service import Function, LambdaService  # noqa: E402
from dorylus_py.lab.sigv4 import Credentials  # noqa: E402
from tests.lab.test_lambda_service import CREDS  # noqa: E402
from tests.worker import event_for  # noqa: E402

CONFIG = "/2015-03-31/functions/dorylus/configuration"
INVOKE = "/2015-03-31/functions/dorylus/invocations"


@pytest.fixture(scope="module")
def service():
    with pytest.MonkeyPatch.context() as mp:
        for k, v in {"AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"}.items():
            mp.setenv(k, v)
        svc = LambdaService(Function(concurrency=1, timeout_s=20), CREDS, b"k" * 32, ("127.0.0.1", 0))
        threading.Thread(target=svc.serve_forever, daemon=True).start()
        yield svc
        svc.close()


def port_of(service) -> int:
    return service.httpd.server_address[1]


def connect(service, source: str = "127.0.0.1", timeout: float = 5) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", port_of(service), timeout=timeout, source_address=(source, 0))


def sign(port: int, method: str, path: str, body: bytes, creds: Credentials = CREDS, declare: bool = False) -> dict:
    """The headers botocore signs a request with (``declare``: its body's hash in ``x-amz-content-sha256``,
    signed, as S3 clients send it)."""
    headers = {"X-Amz-Content-SHA256": hashlib.sha256(body).hexdigest()} if declare else {}
    request = AWSRequest(method=method, url=f"http://127.0.0.1:{port}{path}", data=body, headers=headers)
    SigV4Auth(BotoCredentials(creds.access_key_id, creds.secret_access_key), "lambda", creds.region).add_auth(request)
    return dict(request.headers.items())


def call(conn: http.client.HTTPConnection, path: str = CONFIG, body: bytes = b"", declare: bool = False,
         send: bytes | None = None) -> tuple[int, dict]:
    """A signed request on ``conn``; ``send``: the body that goes instead of the signed one. Status, JSON answer."""
    method = "POST" if body else "GET"
    conn.request(method, path, body=body if send is None else send, headers=sign(conn.port, method, path, body,
                                                                                 declare=declare))
    answer = conn.getresponse()
    return answer.status, json.loads(answer.read() or b"{}")


def headers_only(service, head: dict, length: int) -> bytes:
    """A POST's headers, saying ``length`` bytes of body follow, and none that do; what comes back."""
    lines = [f"POST {INVOKE} HTTP/1.1", f"Host: 127.0.0.1:{port_of(service)}", *(f"{k}: {v}" for k, v in head.items()),
             f"Content-Length: {length}"]
    with socket.create_connection(("127.0.0.1", port_of(service)), timeout=5) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        answer = b""
        while chunk := s.recv(4096):  # to the end: the service closes the connection (a timeout: it waits for the body)
            answer += chunk
        return answer


class SlowHeaders:
    """The issue's attack: ``per_source`` connections from each address of ``sources``, each sending a request
    line and then one header line every ``every_s`` (no signature), re-opening at each turn those the service
    closed."""

    def __init__(self, service, sources: list[str], per_source: int, every_s: float = 0.3):
        self.port, self.sources, self.per_source, self.every_s = port_of(service), sources, per_source, every_s
        self.held: dict[str, list[socket.socket]] = {s: [] for s in sources}
        self.reopened = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "SlowHeaders":
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for socks in self.held.values():
            for s in socks:
                s.close()

    def _open(self, source: str) -> socket.socket:
        s = socket.socket()
        s.bind((source, 0))
        s.connect(("127.0.0.1", self.port))
        s.sendall(f"POST {INVOKE} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode())
        s.setblocking(False)
        return s

    def _run(self) -> None:
        turns = 0
        while not self._stop.is_set():
            for source, socks in self.held.items():
                alive = []
                for s in socks:
                    try:
                        if _waiting(s):
                            s.send(f"X-Slow-{turns}: 1\r\n".encode())
                            alive.append(s)
                            continue
                    except OSError:
                        pass
                    s.close()
                self.reopened += len(socks) - len(alive) if turns else 0
                while len(alive) < self.per_source and not self._stop.is_set():
                    alive.append(self._open(source))
                self.held[source] = alive
            turns += 1
            self._stop.wait(self.every_s)

    def holding(self) -> int:
        return sum(map(len, self.held.values()))


def _waiting(s: socket.socket) -> bool:
    """The service holds ``s`` open and has not answered (an answer, or its end, means it let go)."""
    try:
        s.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return True
    except OSError:
        pass
    return False


def until(predicate, timeout_s: float = 20, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


# --- the policy, without sockets ----------------------------------------------------------------------------

def test_a_newcomer_takes_the_place_of_the_oldest_unsigned_connection_never_a_callers():
    held = Connections(most=4, per_peer=2)
    assert held.admit("a1", "A", 0.0) == [] and held.admit("a2", "A", 1.0) == []
    assert held.admit("a3", "A", 2.0) == ["a1"]  # A at its cap: its oldest newcomer goes
    held.signed("a2")
    held.signed("a3")
    assert held.admit("a4", "A", 3.0) is None  # both places are callers'
    assert held.admit("b1", "B", 3.0) == [] and held.admit("b2", "B", 4.0) == []
    held.signed("b1")
    assert held.admit("c1", "C", 5.0) == ["b2"]  # all 4 places taken: the unsigned one of the busiest peers
    assert held.count() == 4 and held.count("A") == 2


def test_the_deadline_runs_over_a_whole_request_and_pauses_only_for_callers():
    held = Connections(most=8, per_peer=8)
    held.admit("new", "A", 0.0)
    held.admit("caller", "A", 0.0)
    held.signed("caller")
    held.pause("new")  # a newcomer's clock runs on from its connect until it signs a request
    held.pause("caller")
    assert held.overdue(5.0, 4.0) == ["new"]
    held.clock("caller", 10.0)  # its next request began arriving
    held.clock("caller", 13.0)  # (more bytes: the clock does not start again)
    assert held.overdue(13.5, 4.0) == [] and held.overdue(14.5, 4.0) == ["caller"]


# --- the service ---------------------------------------------------------------------------------------------

def test_connections_holding_the_peers_places_do_not_keep_a_fresh_caller_out(service):
    """80 slow-header connections from 127.0.0.1 (over its cap of 64, kept up as the service closes them), and
    a caller from the same address is answered at once; the same with every place of the service taken by
    peers of four other addresses, at their own caps."""
    cap = GuardedServer.PER_PEER
    with SlowHeaders(service, ["127.0.0.1"], cap + 16) as attack:
        until(lambda: service.httpd.held.count("127.0.0.1") >= cap, what="the attack holds the address's places")
        t0 = time.monotonic()
        assert call(connect(service))[0] == 200
        assert time.monotonic() - t0 < 3
        assert service.httpd.held.count("127.0.0.1") <= cap and attack.holding() >= cap


def test_a_service_full_of_other_peers_still_takes_a_fresh_caller(service, monkeypatch):
    monkeypatch.setattr(service.httpd.held, "most", 32)
    monkeypatch.setattr(service.httpd.held, "per_peer", 8)
    with SlowHeaders(service, [f"127.0.0.{i}" for i in range(2, 6)], 8):
        until(lambda: service.httpd.held.count() >= 32, what="the attack holds every place")
        t0 = time.monotonic()
        assert call(connect(service))[0] == 200
        assert time.monotonic() - t0 < 3


def test_a_request_must_arrive_whole_within_its_deadline_and_a_callers_idle_connection_stays(service, monkeypatch):
    monkeypatch.setattr(connections, "REQUEST_S", 1.5)
    caller = connect(service)
    assert call(caller)[0] == 200  # a caller's connection, kept alive
    with SlowHeaders(service, ["127.0.0.9"], 1, every_s=0.2) as attack:  # a header line every 0.2 s: no read waits long
        silent = socket.create_connection(("127.0.0.1", port_of(service)), timeout=10)  # sends nothing at all
        until(lambda: attack.holding() == 1)
        first = attack.held["127.0.0.9"][0]
        t0 = time.monotonic()
        until(lambda: first not in attack.held["127.0.0.9"], timeout_s=6, what="the slow request was not cut")
        assert time.monotonic() - t0 < 1.5 + 1.5
        assert silent.recv(1) == b""  # closed by the service (the silent one is cut too)
        silent.close()
    time.sleep(1.0)
    assert call(caller)[0] == 200  # idle for 3 deadlines, the caller's connection serves its next request


def test_a_request_is_refused_on_its_headers_before_its_body_is_read(service):
    """No signature, or a forged one over a declared body hash: 403 at once, though the body never comes.
    A declared hash that is not the body's is refused once the body is in; the true one runs."""
    answer = headers_only(service, {}, 1_000_000)
    assert answer.startswith(b"HTTP/1.1 403") and b"Connection: close" in answer
    body = json.dumps(event_for("not an address").to_dict()).encode()
    forged = sign(port_of(service), "POST", INVOKE, body, Credentials(CREDS.access_key_id, "guessed", CREDS.region), True)
    answer = headers_only(service, forged, 1_000_000)
    assert answer.startswith(b"HTTP/1.1 403") and b"does not match" in answer
    status, out = call(connect(service), INVOKE, body, declare=True, send=body[:-1] + b" ")
    assert status == 403 and "x-amz-content-sha256" in out["message"]
    status, out = call(connect(service), INVOKE, body, declare=True)
    assert status == 200 and "ZMQError" in out["errorMessage"]  # it ran (and could not reach the address)


def _reset(port: int) -> None:
    s = socket.socket()
    s.connect(("127.0.0.1", port))
    s.sendall(f"POST {INVOKE} HTTP/1.1\r\nHost: x\r\n".encode())
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()  # RST


def test_a_storm_of_reset_connections_is_counted_in_a_few_log_lines_without_tracebacks(service, caplog, capfd):
    n = 300
    before = service.httpd.ended.counts["reset by the peer"]
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger=connections.__name__):
        for i in range(n):
            _reset(port_of(service))
            if i % 50 == 49:
                until(lambda: service.httpd.held.count() == 0, what="the reset connections let go")
        until(lambda: service.httpd.held.count() == 0, what="the reset connections let go")
        elapsed = time.monotonic() - t0
    err = capfd.readouterr().err
    assert err.count("Traceback") == 0 and "ConnectionResetError" not in err, (err.count("Traceback"), err[-1000:])
    lines = [r for r in caplog.records if r.name == connections.__name__]
    assert 1 <= len(lines) <= elapsed / connections.LOG_EVERY_S + 1, (len(lines), elapsed)
    assert service.httpd.ended.counts["reset by the peer"] - before >= n // 2  # each counted, if not said
