"""A tensor worker's emulated network link (``--lambda-bandwidth-mbps``, local emulator only).

A Lambda's network interface caps its transfers, each way; the Dorylus paper measured about 200 Mbps
between a Lambda and an EC2 server. Messages still cross localhost at once: the link only says *when*
each would have been complete, and the worker waits for that moment before what it sends leaves, or
before it uses what came. Incoming and outgoing bytes queue apart (full duplex), one message after
another in each direction. A real Lambda has no cap to emulate: its context carries none, and the
worker gets no link.
"""

from __future__ import annotations

import time


class Link:
    def __init__(self, mbps: float):
        self.rate = mbps * 1e6 / 8  # bytes a second, each way
        self.in_free = self.out_free = 0.0  # when each direction is done with what it carries

    def arrives(self, nbytes: int, now: float) -> float:
        """When ``nbytes`` that reached us at ``now`` would have been fully received."""
        self.in_free = max(now, self.in_free) + nbytes / self.rate
        return self.in_free

    def departs(self, nbytes: int, now: float) -> float:
        """When ``nbytes`` handed to the link at ``now`` would have been fully sent."""
        self.out_free = max(now, self.out_free) + nbytes / self.rate
        return self.out_free


def wait_until(t: float) -> None:
    if (left := t - time.time()) > 0:
        time.sleep(left)


def frame_bytes(frames) -> int:
    """The bytes a message's frames (bytes, memoryviews or zmq Frames) put on the wire."""
    return sum(memoryview(f).nbytes for f in frames)


_links: dict[float, Link] = {}


def link_of(context) -> Link | None:
    """The worker's link if its context caps it: one per process and rate, as a warm container keeps
    its network interface between invocations."""
    mbps = getattr(context, "bandwidth_mbps", 0.0) or 0.0
    if mbps <= 0:
        return None
    return _links.setdefault(mbps, Link(mbps))
