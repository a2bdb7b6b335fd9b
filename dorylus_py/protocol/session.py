"""Signed messages (the jupyter_client session model over ZeroMQ multipart): every frame under one MAC.

Frames: ``[envelope, header, *tensors]``. The envelope is 68 fixed bytes: magic ``DRY1``, the sender's
16-byte id, its sequence number and clock (u64 each, big-endian), and the MAC:

    MAC = HMAC-SHA256(job key, envelope[:36] | audience | header | (length, tag) of each tensor frame)
    audience = the address sent to and the job's nonce (a request), or the session id replied to
    tag = AES-256-GMAC(HMAC-SHA256(job key, "frames" | envelope[:36]), nonce = frame index, frame)

Tensor frames enter the MAC through GMAC tags under a key derived per message (unique: the sender id
is random and its sequence number never repeats): GMAC runs at about 25 GB/s here, SHA-256 at 1-1.7,
and with SHA-256 over the tensors an epoch of the 200 k-vertex benchmark took 1.6-2x as long
(docs/architecture.md). The *audience* is bound into the MAC but never sent: a request is signed for
the address it is sent to and the job it belongs to (the driver's nonce, drawn per start of a job),
a reply for the session that asked, so a message captured on the way to one process is refused by
every other, and one captured in an earlier job or start by the next. Session ids are random per
process and job, and a session accepts nothing stamped before it was made (:mod:`replay`), so a
restarted process refuses what was captured before it started. The key itself never travels.

A receiver (:meth:`Session.decode`) checks, in order: frame count and sizes (the whole message within
``Limits.max_message_bytes``), the magic, the MAC (``hmac.compare_digest``), for a message signed for no
job that it is a bare ``hello`` (its header's first bytes), the sequence (:mod:`replay`), and only then
decodes the header against its schema (:mod:`header`: the op, the tensors' specs and the fields'
values, each within bounds), then the tensors' shapes against their byte lengths (each shape sized before any array is made). A
float32 row block may travel narrower (``Message.wire``, :mod:`quantize`): its spec names the form, its
frame holds that form's bytes, and the receiver gets float32 rows back.
Failures up to and including the sequence raise :class:`AuthError` (answer nothing: the sender cannot
be trusted with even an error); later ones raise :class:`ProtocolError`, and so does anything numpy
raises on a hostile body: ``decode`` raises nothing else.
"""

from __future__ import annotations

import copy
import hmac
import itertools
import math
import os
import struct
import time
from dataclasses import dataclass, field

import numpy as np
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from dorylus_py.errors import ConfigError
from dorylus_py.protocol.header import MAX_HEADER_BYTES, TensorSpec, decode_header, encode_header, header_prefix
from dorylus_py.protocol.messages import DTYPES, AuthError, Message, ProtocolError
from dorylus_py.protocol.quantize import pack, unpack, wire_bytes
from dorylus_py.protocol.replay import ReplayGuard

MAGIC = b"DRY1"
_FIXED = struct.Struct(">4s16sQQ")  # magic, sender id, sequence number, sender clock (microseconds)
MAC_BYTES = 32
ENVELOPE_BYTES = _FIXED.size + MAC_BYTES
MIN_KEY_BYTES = 16


MESSAGE_CAP_ENV = "DORYLUS_MAX_MESSAGE_MB"  # the per-message cap, MiB, where the default is too small or large
DEFAULT_MESSAGE_MB = 512  # below a 954 MiB frame: the attack of issue 40 is refused at its first frame header


def message_cap() -> int:
    """The per-message byte cap: ``DORYLUS_MAX_MESSAGE_MB`` MiB if set (1 to 2047), else 512 MiB."""
    raw = os.environ.get(MESSAGE_CAP_ENV, "")
    if not raw:
        return DEFAULT_MESSAGE_MB * 2**20
    if not raw.isdigit() or not 1 <= int(raw) <= 2047:
        raise ConfigError(f"{MESSAGE_CAP_ENV}={raw[:20]!r}: expected a whole number of MiB from 1 to 2047")
    return int(raw) * 2**20


@dataclass(frozen=True)
class Limits:
    """What a receiver accepts before it spends a MAC on a message (raise the chunk count for huge partitions).
    ``max_message_bytes`` bounds every message, all frames together: ZeroMQ refuses a frame over it at the
    frame's header (``MAXMSGSIZE``), the receiver counts the frames' total as it reads them
    (``transport.receive``), and a sender refuses to send more (one line naming the setting)."""

    max_tensors: int = 1024  # a weight server's whole state: 5 arrays per tensor block it holds (GAT: 4 tensors a layer)
    max_frame_bytes: int = 2**31 - 1  # one tensor (GMAC's limit); the message cap is lower by default
    max_message_bytes: int = field(default_factory=message_cap)


def _audience(who: str | bytes, job: bytes) -> bytes:
    """An address (``tcp://...``) with the job's nonce, or a session id (random per process and job, so
    it needs no nonce), as bound into a MAC."""
    raw = b"@" + who.encode() + b"|" + job if isinstance(who, str) else b"#" + bytes(who)
    return struct.pack(">H", len(raw)) + raw


class Session:
    """One party's signing identity: the job key, a random sender id, a sequence counter, the replay
    state of what it has received, and the job its requests belong to (``job``: the driver's nonce;
    empty before a server has its ``start``). Safe to share between threads."""

    def __init__(self, key: bytes, limits: Limits | None = None, replay: ReplayGuard | None = None, job: bytes = b""):
        if not isinstance(key, bytes) or len(key) < MIN_KEY_BYTES:
            raise ValueError(f"the job key must be at least {MIN_KEY_BYTES} bytes")
        self._key = key
        self.id = os.urandom(16)
        self.limits = limits or Limits()
        self.replay = replay or ReplayGuard(since_us=time.time_ns() // 1000)  # nothing from before this session
        self.job = job
        self._seq = itertools.count(1)  # next() is atomic under the GIL

    def __repr__(self) -> str:  # never the key
        return f"Session(id={self.id.hex()})"

    def sibling(self, sender: bytes | None = None) -> "Session":
        """Another party with the same key and job (a worker thread of this process), without exposing the
        key; ``sender``: its id (one the driver drew for a graph server's gradients) instead of a random one."""
        other = Session(self._key, self.limits, job=self.job)
        if sender is not None:
            other.id = sender
        return other

    def curve_client_keys(self) -> tuple[bytes, bytes]:
        """The job's CurveZMQ client key pair, derived from the key (``zap.py``), without exposing the key."""
        from dorylus_py.protocol.zap import client_keys

        return client_keys(self._key)

    def plain_password(self) -> bytes:
        """The job's ZMTP PLAIN password, derived from the key (``zap.py``), without exposing the key."""
        from dorylus_py.protocol.zap import plain_password

        return plain_password(self._key)

    def for_job(self, job: bytes) -> "Session":
        """This same party (id, sequence, replay state) with its requests bound to ``job``."""
        view = copy.copy(self)
        view.job = job
        return view

    def _mac(self, fixed: bytes, audience: str | bytes, header, frames: list, job: bytes | None = None) -> bytes:
        aud = _audience(audience, self.job if job is None else job)
        parts = [fixed, aud, struct.pack(">IH", len(header), len(frames)), header]
        gmac = AESGCM(hmac.digest(self._key, b"frames" + fixed, "sha256")) if frames else None
        for i, frame in enumerate(frames):
            parts += [struct.pack(">Q", len(frame)), gmac.encrypt(i.to_bytes(12, "big"), b"", frame)]
        return hmac.digest(self._key, b"".join(parts), "sha256")

    def encode(self, msg: Message, to: str | bytes) -> list:
        """Frames for ``msg`` signed for ``to`` (the address sent to, or the session id replied to).
        Contiguous tensors are not copied."""
        specs, frames = [], []
        for name, t in msg.tensors.items():
            arr = np.require(t, requirements="C")  # unlike ascontiguousarray, keeps 0-d arrays 0-d
            if arr.dtype.name not in DTYPES:
                raise ProtocolError(f"tensor {name!r}: dtype {arr.dtype.name} cannot be sent")
            form = msg.wire.get(name, "float32")
            specs.append(TensorSpec(name, arr.dtype.name, list(arr.shape), form))
            if form != "float32":
                try:
                    arr = pack(arr, form)
                except ValueError as e:
                    raise ProtocolError(f"tensor {name!r}: {e}") from None
            frames.append(memoryview(arr).cast("B") if arr.size else b"")
        header = encode_header(msg.op, specs, msg.fields)
        size = ENVELOPE_BYTES + len(header) + sum(len(f) for f in frames)
        if size > self.limits.max_message_bytes:
            raise ProtocolError(f"op {msg.op}: a message of {size} bytes exceeds the cap of "
                                f"{self.limits.max_message_bytes} (more chunks, or {MESSAGE_CAP_ENV})")
        fixed = _FIXED.pack(MAGIC, self.id, next(self._seq), time.time_ns() // 1000)
        return [fixed + self._mac(fixed, to, header, frames), header, *frames]

    def decode(self, frames: list, me: str | bytes, unbound: frozenset[str] = frozenset()) -> Message:
        """Check and parse ``frames`` (bytes or zmq Frames) meant for ``me`` (this process's address
        for requests, this session's id for replies); raise :class:`ProtocolError` on any problem, and
        nothing else: whatever numpy or the header's decoder raises on a hostile body becomes one (here, the
        one place every receive loop goes through).
        ``unbound``: ops also accepted when signed for no job (a server's ``hello``, before it has one);
        such a message is refused unless it is one of them, before it takes a replay slot or is parsed."""
        lim = self.limits
        if not 2 <= len(frames) <= 2 + lim.max_tensors:
            raise AuthError(f"{len(frames)} frames (expected 2 to {2 + lim.max_tensors})")
        bufs = [_buffer(f) for f in frames]
        lengths = [len(b) for b in bufs]
        if lengths[0] != ENVELOPE_BYTES or lengths[1] > MAX_HEADER_BYTES:
            raise AuthError(f"envelope of {lengths[0]} bytes or header of {lengths[1]} bytes: not a signed message")
        if max(lengths[2:], default=0) > lim.max_frame_bytes or sum(lengths) > lim.max_message_bytes:
            raise AuthError(f"message of {sum(lengths)} bytes exceeds the limits")
        envelope = bytes(bufs[0])
        fixed, mac = envelope[: _FIXED.size], envelope[_FIXED.size :]
        magic, sender, seq, ts_us = _FIXED.unpack(fixed)
        if magic != MAGIC:
            raise AuthError("not a signed dorylus message (bad magic)")
        bound = hmac.compare_digest(self._mac(fixed, me, bufs[1], bufs[2:]), mac)
        if not bound:
            if not (unbound and self.job and isinstance(me, str)
                    and hmac.compare_digest(self._mac(fixed, me, bufs[1], bufs[2:], b""), mac)):
                raise AuthError("bad MAC: not signed with this job's key, not meant for this process and job, or altered")
            if len(bufs) != 2 or not any(bytes(bufs[1][:len(p)]) == p for p in _prefixes(unbound)):
                raise AuthError("signed for no job, and not one of the ops that may be (or with tensors)")
        self.replay.accept(sender, seq, ts_us)
        try:
            msg = _parse(bufs, sender, lim)
        except ProtocolError as e:
            e.sender = sender  # authentic: an error reply may go back to it
            raise
        except Exception as e:  # noqa: BLE001  (numpy, struct, ...: a hostile body is refused, never a crash)
            raise _refused(e, sender) from None
        if not bound and msg.op not in unbound:
            raise AuthError(f"op {msg.op} signed for no job")
        return msg


def _prefixes(ops: frozenset[str]) -> list[bytes]:
    """How the header of an op in ``ops`` begins (the op first)."""
    return [header_prefix(op) for op in ops]


def _refused(error: Exception, sender: bytes) -> ProtocolError:
    e = ProtocolError(f"malformed message ({type(error).__name__}: {str(error)[:80]})")
    e.sender = sender
    return e


def _parse(bufs: list[memoryview], sender: bytes, lim: Limits) -> Message:
    header = decode_header(bytes(bufs[1]))  # the op, the specs' types and bounds, the fields' values
    op, specs = header.op, header.tensors
    if len(specs) != len(bufs) - 2:
        raise ProtocolError(f"op {op}: the header's tensor list does not match the {len(bufs) - 2} data frames")
    tensors, wire = {}, {}
    for spec, buf in zip(specs, bufs[2:]):
        name, dtype, shape, form = spec.name, spec.dtype, spec.shape, spec.wire
        _check_spec(spec, lim)
        if name in tensors:
            raise ProtocolError(f"op {op}: tensor {name!r} named twice")
        if form != "float32":
            if len(buf) != wire_bytes(*shape, form):
                raise ProtocolError(f"tensor {name!r}: {len(buf)} bytes, but shape {shape} in {form} needs "
                                    f"{wire_bytes(*shape, form)}")
            tensors[name], wire[name] = unpack(buf, *shape, form), form
            continue
        expected = math.prod(shape) * np.dtype(DTYPES[dtype]).itemsize  # Python integers: no wrap-around
        if len(buf) != expected:
            raise ProtocolError(f"tensor {name!r}: {len(buf)} bytes, but shape {shape} of {dtype} needs {expected}")
        tensors[name] = np.frombuffer(buf, dtype=DTYPES[dtype]).reshape(shape)
    return Message(op, header.fields, tensors, sender, sum(len(b) for b in bufs[1:]), wire)


def _check_spec(spec: TensorSpec, lim: Limits) -> None:
    """What the schema cannot say of a spec: its shape with each zero taken as one must fit a frame too,
    so that no empty frame can stand for an array numpy cannot describe (``[0, 2**31-1, 2**31-1,
    2**31-1]``: "array is too big"); a narrower wire form only for 2-D float32 rows."""
    name, shape = spec.name, spec.shape
    if math.prod(max(s, 1) for s in shape) * np.dtype(DTYPES[spec.dtype]).itemsize > lim.max_frame_bytes:
        raise ProtocolError(f"tensor {name!r}: shape {shape} of {spec.dtype} is larger than a frame may be")
    if spec.wire != "float32" and (spec.dtype != "float32" or len(shape) != 2):
        raise ProtocolError(f"tensor {name!r}: wire form {spec.wire} is only for 2-D float32 rows")


def _buffer(frame) -> memoryview:
    return memoryview(frame.buffer if hasattr(frame, "buffer") else frame).cast("B")
