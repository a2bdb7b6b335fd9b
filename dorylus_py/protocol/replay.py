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

The floor never passes the present, so a key holder cannot lock new senders out (issue 40: 70,000
senders stamped 110 s ahead evicted one another and lifted the floor 110 s into the future). A sender
whose newest stamp is ahead of this machine's clock is never evicted for room (that would lift the
floor past now); at most ``max_ahead`` such senders are kept at once, and a message that would make one
more is refused before it takes a slot. A sender stops being ahead once the clock passes its stamp.
So each sender holds one slot of bounded size, at most ``capacity`` slots are held, and eviction only
ever forgets a sender stamped in the past.

``floor`` starts at ``since_us``, the moment the guard's session was made: a process (or a server's
session for one job) accepts nothing stamped before it existed, so what was captured before a restart,
or in an earlier job, cannot be replayed into it, though its sequence windows start empty.

Refusals are counted by kind (``refused``) and summed up in one WARNING line at most once a second (no
sender ids, no keys); refusals of what was stamped before the session began are expected at a start
(a server's hellos queued while no driver listened) and only counted.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass

from dorylus_py.protocol.messages import AuthError, StaleMessage

log = logging.getLogger(__name__)
WINDOW = 1024
_MASK = (1 << WINDOW) - 1
LOG_EVERY_S = 1.0  # at most one warning line this often


@dataclass
class _Sender:
    top: int  # highest sequence number accepted
    seen: int  # bit i set: top - i accepted (bit 0 is top itself)
    newest_ts: int  # newest sender timestamp accepted, microseconds
    last_active: float  # this machine's clock at the last accepted message


class ReplayGuard:
    def __init__(self, capacity: int = 65536, max_age_s: float = 300.0, max_skew_s: float = 120.0, since_us: int = 0,
                 max_ahead: int | None = None):
        if max_age_s < 2 * max_skew_s:
            raise ValueError("max_age_s must be at least twice max_skew_s (see the module docstring)")
        max_ahead = max(1, capacity // 64) if max_ahead is None else max_ahead  # 1024 of the default 65,536
        if not 0 < max_ahead < capacity:
            raise ValueError("max_ahead must be above 0 and below capacity, so that room can always be made")
        self.capacity, self.max_age_s, self.max_skew_s, self.max_ahead = capacity, max_age_s, max_skew_s, max_ahead
        self.senders: OrderedDict[bytes, _Sender] = OrderedDict()  # least recently active first
        self.since_us = since_us
        self.floor = since_us  # newest timestamp (us) of any forgotten sender, or when this guard began
        self._ahead: set[bytes] = set()  # senders whose newest stamp is ahead of this machine's clock
        self._ahead_heap: list[tuple[int, bytes]] = []  # (stamp, sender): when each stops being ahead
        self.refused: Counter[str] = Counter()  # by kind, since the guard began
        self._unlogged, self._logged_at = 0, 0.0
        self._lock = threading.Lock()  # a session may be shared by threads

    def accept(self, sender: bytes, seq: int, ts_us: int, now: float | None = None) -> None:
        """Record (sender, seq) as received, or raise :class:`AuthError` if it is a replay or stale."""
        now = time.time() if now is None else now
        with self._lock:
            try:
                self._accept(sender, seq, ts_us, now)
            except AuthError as e:
                self._count(e.kind, now)
                raise

    def _accept(self, sender: bytes, seq: int, ts_us: int, now: float) -> None:
        skew = ts_us / 1e6 - now
        if abs(skew) > self.max_skew_s:
            raise _refusal("skew", f"message clock is {skew:+.0f} s from this machine's (limit {self.max_skew_s:.0f} s; "
                                   "check NTP)")
        now_us = int(now * 1e6)
        self._forget_idle(now)
        self._settle_ahead(now_us)
        state = self.senders.get(sender)
        ahead = ts_us > now_us and sender not in self._ahead
        if ahead and len(self._ahead) >= self.max_ahead:
            raise _refusal("ahead", f"{len(self._ahead)} senders are stamped ahead of this machine's clock already "
                                    f"(at most {self.max_ahead})")
        if state is None:
            if ts_us <= self.floor:
                if ts_us <= self.since_us:
                    raise _refusal("before", "message older than this session", StaleMessage)
                raise _refusal("stale", "message older than what a sender forgotten for room or inactivity sent")
            self.senders[sender] = _Sender(seq, 1, ts_us, now)
        else:
            if seq > state.top:
                shift = seq - state.top
                state.seen = ((state.seen << shift) | 1) & _MASK if shift < WINDOW else 1
                state.top = seq
            else:
                back = state.top - seq
                if back >= WINDOW:
                    raise _refusal("window", f"sequence number {seq} is older than the window ({state.top} - {WINDOW})")
                if state.seen >> back & 1:
                    raise _refusal("replay", f"sequence number {seq} was already received (replay)")
                state.seen |= 1 << back
            state.newest_ts = max(state.newest_ts, ts_us)
            state.last_active = now
            self.senders.move_to_end(sender)
        if ahead:
            self._ahead.add(sender)
            heapq.heappush(self._ahead_heap, (ts_us, sender))
        if len(self.senders) > self.capacity:
            self._evict()

    def _settle_ahead(self, now_us: int) -> None:
        """Take senders whose newest stamp the clock has passed off the ahead set."""
        heap = self._ahead_heap
        while heap and heap[0][0] <= now_us:
            _, sender = heapq.heappop(heap)
            state = self.senders.get(sender)
            if state is not None and state.newest_ts > now_us:  # it has sent a later stamp since
                heapq.heappush(heap, (state.newest_ts, sender))
            else:
                self._ahead.discard(sender)

    def _evict(self) -> None:
        """Forget the least recently active sender that is not ahead of the clock (there is one:
        ``max_ahead < capacity``); those ahead go to the back of the line."""
        while True:
            sender = next(iter(self.senders))
            if sender not in self._ahead:
                self._forget(sender)
                return
            self.senders.move_to_end(sender)

    def _forget_idle(self, now: float) -> None:
        while self.senders:
            sender, state = next(iter(self.senders.items()))
            if now - state.last_active <= self.max_age_s:
                return
            self._forget(sender)

    def _forget(self, sender: bytes) -> None:
        self._ahead.discard(sender)
        self.floor = max(self.floor, self.senders.pop(sender).newest_ts)

    def _count(self, kind: str, now: float) -> None:
        self.refused[kind] += 1
        if kind == "before":  # expected at a start: counted, not warned about
            return
        self._unlogged += 1
        if now - self._logged_at >= LOG_EVERY_S:
            log.warning("replay guard refused %d messages since its last report (%s)", self._unlogged,
                        ", ".join(f"{n} {k}" for k, n in sorted(self.refused.items())))
            self._unlogged, self._logged_at = 0, now


def _refusal(kind: str, text: str, cls: type[AuthError] = AuthError) -> AuthError:
    e = cls(text)
    e.kind = kind
    return e
