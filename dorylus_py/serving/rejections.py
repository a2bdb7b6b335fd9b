"""What a server does with a message it will not use: count it, log the first few, and tell bugs apart.

A handler refuses an authentic message it cannot use by raising a :data:`REJECTED` error (a
:class:`~dorylus_py.protocol.ProtocolError` from a named check, a ``WeightError``, ...): the message
is answered with an ``error`` and counted. Anything else a handler raises is a bug in this program:
logged with the op and the sender, the message dropped, the loop kept; ``DORYLUS_STRICT=1`` (the tests
set it for every process they start) makes it fatal, so that a bug fails a test instead of passing as
a rejection.
"""

from __future__ import annotations

import logging
import os

from dorylus_py.errors import DorylusError
from dorylus_py.protocol.messages import StaleMessage

log = logging.getLogger("dorylus_py.serving.node")
STRICT_ENV = "DORYLUS_STRICT"  # "1": a bug met while handling a peer's message is fatal (tests), not logged and dropped

# What a handler raises for an authentic message it refuses (ProtocolError, WeightError, ...): answered, counted.
REJECTED = (DorylusError,)


class Rejections:
    """Counts refused messages; logs the first few of each kind and then every thousandth. ``bugs``:
    messages whose handling raised something no check names, which is this program's fault. Messages
    older than the session (:class:`StaleMessage`: a server's hellos queued while no driver listened, as
    the design expects at every start) are counted among the unauthenticated and as ``expected``, and
    never warned about: a warning is for what a user must look into."""

    def __init__(self, who: str):
        self.who, self.counts = who, {"unauthenticated": 0, "invalid": 0, "bugs": 0}
        self.expected = 0  # of them, messages older than the session: a server's hellos from before a start

    @property
    def unexpected(self) -> int:
        """Refusals a run reports (its summary, a line at the end): all but the expected ones."""
        return sum(self.counts.values()) - self.expected

    def add(self, kind: str, error: Exception) -> None:
        self.counts[kind] += 1
        n = self.counts[kind]
        if isinstance(error, StaleMessage):
            self.expected += 1
            log.debug("%s: %s message #%d refused: %s", self.who, kind, n, error)
        elif n <= 5 or n % 1000 == 0:
            log.warning("%s: %s message #%d refused: %s", self.who, kind, n, error)

    def bug(self, op: str, sender: bytes, error: Exception) -> None:
        self.counts["bugs"] += 1
        report_bug(self.who, op, sender, error)

    def report(self) -> None:
        """At the end: one warning with the counts, if anything but the expected was refused."""
        if sum(self.counts.values()) > self.expected:
            log.warning("%s refused messages: %s", self.who, self)

    def record(self) -> dict:
        """The counts as a run record keeps them (``summary.json``'s ``refused_messages``)."""
        return self.counts | {"expected": self.expected}

    def __str__(self) -> str:
        counts = ", ".join(f"{n} {kind}" for kind, n in self.counts.items())
        return counts + (f" ({self.expected} of them from before this start, as expected)" if self.expected else "")


def report_bug(who: str, op: str, sender: bytes, error: Exception) -> None:
    """A handler failed on a message in a way no check names: log it (op, sender) so that the message
    can be dropped; under ``DORYLUS_STRICT=1`` re-raise, so that a test fails instead of counting it."""
    log.error("%s: bug while handling %s from %s (message dropped): %r", who, op, sender.hex()[:12], error,
              exc_info=error)
    if os.environ.get(STRICT_ENV) == "1":
        raise error
