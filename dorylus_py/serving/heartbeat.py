"""A server's heartbeat: it tells the driver every second that the process lives and that its serving
loop turns, on a thread and a socket of its own, and ends the process when the driver is gone or the
loop has stood still for the job's hang timeout (so a loop stuck in a send is not kept alive by its
heartbeat)."""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING

import zmq

from dorylus_py.awake import awake_now
from dorylus_py.protocol import Message, ProtocolError
from dorylus_py.protocol.transport import dealer, receive
from dorylus_py.timescale import scaled

if TYPE_CHECKING:
    from dorylus_py.serving.node import ServerNode

log = logging.getLogger("dorylus_py.serving.node")
HEARTBEAT_S = 1.0  # a server says it lives this often
SILENCE_S = 6.0  # a process not heard from for this long is presumed dead (well within 10 s)


class Heartbeat:
    """Tell the driver every ``HEARTBEAT_S`` that this process lives, and how many turns its serving loop
    has made; exit (one log line) once the driver has not answered for ``silence_s`` (code 3), or once
    the loop has not turned for the node's hang timeout (code 4: a loop stuck in a send or a bug; the
    driver or the supervisor starts a new process). Runs on a thread with a socket of its own."""

    def __init__(self, node: "ServerNode", silence_s: float | None = None):
        self.node, self.silence_s = node, scaled(SILENCE_S) if silence_s is None else silence_s
        # this job's, as a party of its own: its beats overtake the loop's queued messages to a driver that
        # lags (their sequence numbers would then run more than the replay window ahead of those messages,
        # which the driver would refuse: an epoch's stats lost)
        self.session = node.session.sibling()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        node = self.node
        sock = dealer(zmq.Context.instance(), node.driver_address, node.gate)
        heard = turned = awake_now()  # the time this process ran: a freeze of its own is not the driver's silence
        last = 0  # no turn yet: a server still building its state is not hung
        try:
            while not self._stop.is_set():
                turns = node.turns
                if turns != last:
                    last, turned = turns, awake_now()
                beat = Message("heartbeat", {"role": node.role, "rank": node.rank, "turns": turns})
                try:
                    sock.send_multipart(self.session.encode(beat, node.driver_address), zmq.NOBLOCK)
                except zmq.Again:
                    pass  # the driver is not reading: its silence is counted below
                deadline = time.monotonic() + scaled(HEARTBEAT_S)
                while (left := deadline - time.monotonic()) > 0 and sock.poll(int(left * 1000) + 1):
                    try:
                        if self.session.decode(receive(sock, self.session.limits), self.session.id).op == "heartbeat":
                            heard = awake_now()
                    except ProtocolError:
                        pass  # not from our driver: it proves nothing
                if self._stop.is_set():
                    return
                if awake_now() - heard > self.silence_s:
                    self._exit(3, f"the driver has not answered for {self.silence_s:.0f} s")
                if last and awake_now() - turned > node.hang_timeout_s:
                    self._exit(4, f"the serving loop has not turned for {node.hang_timeout_s:.0f} s (hung)")
        finally:
            sock.close(0)

    def _exit(self, code: int, why: str) -> None:
        log.error("%s %d: %s; exiting", self.node.role, self.node.rank, why)
        logging.shutdown()
        os._exit(code)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * scaled(HEARTBEAT_S))
