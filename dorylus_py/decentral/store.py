"""The local launcher's rendezvous store: a torch ``Store`` served from the launcher on loopback, bounded.

torch's ``TCPStore`` holds whatever any local user sets in it (150 values of 4 MB took a launcher from 253
to 862 MB), and checks nobody. This one is what the workers need of it at start-up (their addresses;
under ``--mode allreduce`` gloo's, through :class:`StoreClient`, a ``torch.distributed.Store``) and no
more:

- a connection first proves it holds the job key (an HMAC of the server's nonce) within
  ``HANDSHAKE_S``, before anything it sends is read; there are at most ``connections`` at once;
- each request's header is checked before its body is read: a key of at most ``KEY_CAP`` bytes, a
  value of at most ``VALUE_CAP``, and the value must fit in ``BYTES_CAP`` together with everything held
  and being read; a new key beyond ``keys`` is refused. A refused request gets one line back and its
  connection is closed.

So the store never holds more than ``BYTES_CAP`` of values, whoever writes to it. The protocol is a
header ``!BHI`` (op, key length, value length), the key and the value; the answer ``!BI`` (status,
length) and its body. ``get`` and ``wait`` poll (a start-up rendezvous, not a data path).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import struct
import threading
import time
from datetime import timedelta

import torch.distributed as dist

from dorylus_py.errors import DorylusError
from dorylus_py.timescale import scaled

KEY_CAP = 256  # bytes of a key's name
VALUE_CAP = 1 << 20  # bytes of one value (an address is ~100, gloo's ~200 per rank)
BYTES_CAP = 16 << 20  # bytes of values held and being read, all together
HANDSHAKE_S = 5.0  # a connection that has not proved the key by then is closed
POLL_S = 0.01

HEAD, ANSWER = struct.Struct("!BHI"), struct.Struct("!BI")
SET, GET, ADD, CHECK, DELETE, COUNT = range(1, 7)
OK, MISSING, REFUSED = range(3)
NONCE = 32


def _proof(key: bytes, nonce: bytes) -> bytes:
    return hmac.new(key, b"dorylus-rendezvous\0" + nonce, hashlib.sha256).digest()


def _read(sock: socket.socket, n: int, deadline: float | None = None) -> bytes:
    """``n`` bytes from ``sock``; all of them by ``deadline`` (monotonic) if given, not just each recv."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ConnectionError("too slow")
            sock.settimeout(left)
        k = sock.recv_into(view[got:])
        if not k:
            raise ConnectionError("closed")
        got += k
    return bytes(buf)


class Refused(Exception):
    """A request the store does not hold (its answer, then the connection's end)."""


class StoreServer:
    """The store, served on 127.0.0.1 by a thread per connection until :meth:`close`."""

    def __init__(self, key: bytes, world: int):
        self._key = key
        self.keys_cap = 64 + 4 * world  # addresses, gloo's, abort: about 2 per worker
        self.connections_cap = 16 + 2 * world  # each worker holds one (gloo's goes through it)
        self.refused = 0  # requests refused and connections dropped
        self._data: dict[str, bytes] = {}
        self._bytes = 0  # held and being read
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port = self._listener.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, name="rendezvous", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                full = len(self._open) >= self.connections_cap or self._closed
                if not full:
                    self._open.add(conn)
            if full:
                self._refuse()
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), name="rendezvous-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            deadline = time.monotonic() + scaled(HANDSHAKE_S)
            conn.settimeout(scaled(HANDSHAKE_S))
            nonce = secrets.token_bytes(NONCE)
            conn.sendall(nonce)
            if not hmac.compare_digest(_read(conn, NONCE, deadline), _proof(self._key, nonce)):
                raise Refused("not the job key")
            conn.settimeout(None)  # a worker keeps its connection for the job
            while True:
                op, key_len, value_len = HEAD.unpack(_read(conn, HEAD.size))
                self._reserve(key_len, value_len)
                try:
                    key = _read(conn, key_len).decode(errors="replace")
                    value = _read(conn, value_len)
                    status, body = self._do(op, key, value)
                finally:
                    with self._lock:
                        self._bytes -= value_len
                conn.sendall(ANSWER.pack(status, len(body)) + body)
        except Refused as e:
            self._refuse()
            reason = str(e).encode()
            try:
                conn.sendall(ANSWER.pack(REFUSED, len(reason)) + reason)
            except OSError:
                pass
        except (OSError, ConnectionError, UnicodeError):
            pass  # a peer gone, a handshake not finished in time
        finally:
            with self._lock:
                self._open.discard(conn)
            conn.close()

    def _refuse(self) -> None:
        with self._lock:
            self.refused += 1

    def _reserve(self, key_len: int, value_len: int) -> None:
        if key_len > KEY_CAP or value_len > VALUE_CAP:
            raise Refused(f"a key of {key_len} bytes or a value of {value_len} (caps {KEY_CAP}, {VALUE_CAP})")
        with self._lock:
            if self._bytes + value_len > BYTES_CAP:
                raise Refused(f"a value of {value_len} bytes does not fit: the store holds {self._bytes} of {BYTES_CAP}")
            self._bytes += value_len

    def _do(self, op: int, key: str, value: bytes) -> tuple[int, bytes]:
        with self._lock:
            if op == SET:
                if key not in self._data and len(self._data) >= self.keys_cap:
                    raise Refused(f"the store holds {len(self._data)} keys, its cap")
                self._bytes += len(value) - len(self._data.get(key, b""))
                self._data[key] = value
                return OK, b""
            if op == GET:
                return (OK, self._data[key]) if key in self._data else (MISSING, b"")
            if op == ADD:
                old = self._data.get(key, b"0")
                if key not in self._data and len(self._data) >= self.keys_cap:
                    raise Refused(f"the store holds {len(self._data)} keys, its cap")
                try:
                    new = str(int(old) + int(value)).encode()
                except ValueError:
                    raise Refused(f"add to {key!r}: not integers") from None
                self._bytes += len(new) - len(self._data.get(key, b""))
                self._data[key] = new
                return OK, new
            if op == CHECK:
                return OK, b"1" if all(k in self._data for k in value.decode(errors="replace").split("\0")) else b"0"
            if op == DELETE:
                old = self._data.pop(key, None)
                self._bytes -= len(old or b"")
                return OK, b"1" if old is not None else b"0"
            if op == COUNT:
                return OK, str(len(self._data)).encode()
        raise Refused(f"unknown operation {op}")

    def held(self) -> tuple[int, int]:
        """(keys, bytes of values) the store holds."""
        with self._lock:
            return len(self._data), sum(map(len, self._data.values()))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns = list(self._open)
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread (close alone does not, on Linux)
        except OSError:
            pass
        self._listener.close()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class StoreClient(dist.Store):
    """A worker's side of :class:`StoreServer`, as a torch ``Store`` (gloo's rendezvous goes through it)."""

    def __init__(self, host: str, port: int, key: bytes, timeout_s: float):
        super().__init__()
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        deadline = time.monotonic() + timeout_s
        while True:  # a server at its connection cap closes at once: try again until the deadline
            try:
                self._sock = socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic()))
                self._sock.sendall(_proof(key, _read(self._sock, NONCE)))
                self._sock.settimeout(timeout_s)
                self.num_keys()  # the server answers only once it has checked the proof
                break
            except (OSError, ConnectionError) as e:
                if time.monotonic() > deadline:
                    raise DorylusError(f"cannot reach the rendezvous store at {host}:{port} ({e})") from None
                time.sleep(0.1)

    def _call(self, op: int, key: str = "", value: bytes = b"") -> tuple[int, bytes]:
        name = key.encode()
        with self._lock:
            self._sock.sendall(HEAD.pack(op, len(name), len(value)) + name + value)
            status, n = ANSWER.unpack(_read(self._sock, ANSWER.size))
            body = _read(self._sock, min(n, VALUE_CAP))
        if status == REFUSED:
            what = repr(key) if key else "this worker"
            raise DorylusError(f"the rendezvous store refused {what}: {body.decode(errors='replace')}")
        return status, body

    def set(self, key: str, value) -> None:
        self._call(SET, key, value.encode() if isinstance(value, str) else bytes(value))

    def get(self, key: str) -> bytes:
        self.wait([key])
        return self._call(GET, key)[1]

    def add(self, key: str, amount: int) -> int:
        return int(self._call(ADD, key, str(amount).encode())[1])

    def check(self, keys: list[str]) -> bool:
        return self._call(CHECK, "", "\0".join(keys).encode())[1] == b"1"

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        limit = timeout.total_seconds() if timeout is not None else self.timeout_s
        deadline = time.monotonic() + limit
        while not self.check(keys):
            if time.monotonic() > deadline:
                raise DorylusError(f"rendezvous: {keys} not set within {limit:g} s")
            time.sleep(POLL_S)

    def delete_key(self, key: str) -> bool:
        return self._call(DELETE, key)[1] == b"1"

    def num_keys(self) -> int:
        return int(self._call(COUNT)[1])

    def close(self) -> None:
        self._sock.close()
