"""Replay protection with bounded memory: per-sender sequence windows that forget idle senders safely.

Every signed message carries its sender's id, a sequence number that the sender increments per
message, and the sender's clock. A receiver accepts a message once: a sequence number above the
highest seen from that sender, or one of the ``WINDOW`` below it not seen yet (threads sharing a
session may overtake each other); older ones and repeats are refused.

Lambdas are many short-lived senders, so a receiver cannot remember every sender forever. It forgets
a sender idle for ``max_age_s`` (or the least recently active one, beyond ``capacity`` senders), and
remembers only ``floor``: the newest timestamp of any sender forgotten. A message from a sender not
remembered is accepted only if it is newer than ``floor``, which every message a forgotten sender
ever sent us is not, so forgetting never re-opens a replay. Timestamps must lie within ``max_skew_s``
of this machine's clock; with ``max_age_s >= 2 * max_skew_s`` senders forgotten for being idle never
push ``floor`` past a correct clock, so new senders are not refused.

``floor`` starts at ``since_us``, the moment the guard's session was made: a process (or a server's
session for one job) accepts nothing stamped before it existed, so what was captured before a restart,
or in an earlier job, cannot be replayed into it, though its sequence windows start empty.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from dorylus_py.protocol.messages import AuthError, StaleMessage

WINDOW = 1024
_MASK = (1 << WINDOW) - 1


@dataclass
class _Sender:
    top: int  # highest sequence number accepted
    seen: int  # bit i set: top - i accepted (bit 0 is top itself)
    newest_ts: int  # newest sender timestamp accepted, microseconds
    last_active: float  # this machine's clock at the last accepted message


class ReplayGuard:
    def __init__(self, capacity: int = 65536, max_age_s: float = 300.0, max_skew_s: float = 120.0, since_us: int = 0):
        if max_age_s < 2 * max_skew_s:
            raise ValueError("max_age_s must be at least twice max_skew_s (see the module docstring)")
        self.capacity, self.max_age_s, self.max_skew_s = capacity, max_age_s, max_skew_s
        self.senders: OrderedDict[bytes, _Sender] = OrderedDict()  # least recently active first
        self.floor = since_us  # newest timestamp (us) of any forgotten sender, or when this guard began
        self._lock = threading.Lock()  # a session may be shared by threads

    def accept(self, sender: bytes, seq: int, ts_us: int, now: float | None = None) -> None:
        """Record (sender, seq) as received, or raise :class:`AuthError` if it is a replay or stale."""
        now = time.time() if now is None else now
        skew = ts_us / 1e6 - now
        if abs(skew) > self.max_skew_s:
            raise AuthError(f"message clock is {skew:+.0f} s from this machine's (limit {self.max_skew_s:.0f} s; "
                                "check NTP)")
        with self._lock:
            self._forget_idle(now)
            state = self.senders.get(sender)
            if state is None:
                if ts_us <= self.floor:
                    raise StaleMessage("message older than this session, or than what a sender forgotten for inactivity sent")
                self.senders[sender] = _Sender(seq, 1, ts_us, now)
                if len(self.senders) > self.capacity:
                    self._forget(next(iter(self.senders)))
                return
            if seq > state.top:
                shift = seq - state.top
                state.seen = ((state.seen << shift) | 1) & _MASK if shift < WINDOW else 1
                state.top = seq
            else:
                back = state.top - seq
                if back >= WINDOW:
                    raise AuthError(f"sequence number {seq} is older than the window ({state.top} - {WINDOW})")
                if state.seen >> back & 1:
                    raise AuthError(f"sequence number {seq} was already received (replay)")
                state.seen |= 1 << back
            state.newest_ts = max(state.newest_ts, ts_us)
            state.last_active = now
            self.senders.move_to_end(sender)

    def _forget_idle(self, now: float) -> None:
        while self.senders:
            sender, state = next(iter(self.senders.items()))
            if now - state.last_active <= self.max_age_s:
                return
            self._forget(sender)

    def _forget(self, sender: bytes) -> None:
        self.floor = max(self.floor, self.senders.pop(sender).newest_ts)
