"""One decentralised worker's shell around its pure state (``pool.py``, ``ledger.py``): the messages.

Three threads share the state under one lock, each holding it only briefly:

- the training loop (``worker.py``) asks :meth:`Node.next_action` what to do; sends steals and gossip
  exchanges without waiting (:meth:`Node.post_steal`, :meth:`Node.post_mix`), takes their answers when
  they come (:meth:`Node.poll`), and broadcasts its epoch reports (:meth:`Node.report`);
- the receive thread (``peers.Inbox``, its handlers in ``answers.py``) answers peers at once from the state: steals from the tail of the
  queue, gossip exchanges with this worker's current parameters and gradient, snapshots, pings; and
  applies notices (reports, deaths, the recorder's rows, averages, stop);
- the service thread watches peers (``pool.watched``: the next live rank; the recorder watches all),
  sends the notices other threads leave it, and, in the lowest live rank, does the recorder's duty
  (``recorder.RecorderDuty``: adopt a dead worker's missing batches, snapshot and evaluate each complete
  epoch, stop the job at the end).

A peer that does not answer a steal, a gossip exchange, a snapshot or a ping within ``--peer-timeout-s``
is dead: every live worker is told (and told again by whoever hears it first), it is dropped from
pairing and stealing, and what it held is trained by others. A worker told it was declared dead leaves
the job with one line.
"""

from __future__ import annotations

import json
import logging
import queue
import random
import threading
import time
from typing import Callable

import numpy as np

from dorylus_py.awake import awake_now
from dorylus_py.config import TrainConfig
from dorylus_py.decentral.answers import PeerRequests, is_int
from dorylus_py.decentral.batches import batch_count
from dorylus_py.decentral.ledger import EpochLedger
from dorylus_py.decentral.peers import Inbox, Links
from dorylus_py.decentral.pool import Report, Steal, WorkPool, watched
from dorylus_py.decentral.recorder import RecorderDuty
from dorylus_py.protocol import Message, ProtocolError

log = logging.getLogger(__name__)


class Node(PeerRequests):
    def __init__(self, cfg: TrainConfig, rank: int, world: int, key: bytes, params: Callable[[], np.ndarray],
                 share: Callable[[], tuple[dict[str, np.ndarray], dict]], make_recorder: Callable[[], object],
                 host: str = "127.0.0.1", bind_host: str | None = None, transport: tuple = (Inbox, Links)):
        """``params()``: a copy of this worker's parameters; ``share()``: what it sends a gossip partner
        (its parameters, maybe its last gradient); both called with :attr:`lock` held;
        ``make_recorder()``: this worker's ``Recorder``, made now in rank 0 (the first recorder), or when
        this worker becomes the recorder; ``transport``: the classes of its inbox and links (ZeroMQ's,
        ``peers.py``; tests put an in-memory network in their place)."""
        self.cfg, self.rank, self.world, self.key = cfg, rank, world, key
        self.per_epoch = batch_count(cfg.clusters, cfg.clusters_per_batch)
        self.timeout = cfg.peer_timeout_s
        self.lock = threading.Lock()
        self.wake = threading.Condition(self.lock)  # the training loop waits on it when idle
        self.pool = WorkPool(rank, world, cfg.epochs, self.per_epoch, cfg.seed)
        self.ledger = EpochLedger(world, cfg.epochs, self.per_epoch)
        self.params, self.share, self.make_recorder = params, share, make_recorder
        self.pending: dict[int, tuple[str, int, int, float]] = {}  # request id -> (op, peer, epoch, sent at: awake_now())
        self.sent: dict[int, np.ndarray] = {}  # request id -> the parameters a gossip request sent
        self.grads_seen: dict[int, int] = {}  # peer -> the step of its latest gradient taken here
        self.n_params = len(params())
        self.mailbox: list[tuple[str, np.ndarray]] = []  # peers' parameters to mix in, averages to apply
        self.kept: dict[int, np.ndarray] = {}  # epoch -> the snapshot sent for it (--average-every)
        self.best_params: np.ndarray | None = None
        self.deaths: dict[int, dict] = {}
        self.cycle: float | None = None  # this worker's seconds per batch (moving average)
        self.rng = random.Random(cfg.seed * 7_919 + rank)  # gossip partners
        self.error: str | None = None  # why this worker leaves the job with an error
        self.summary: dict | None = None  # set in the worker that wrote the final record
        self.recorder = make_recorder() if rank == 0 else None  # ready before the start: the first recorder
        self.duty: RecorderDuty | None = None
        self._links = transport[1]
        self.inbox = transport[0](rank, world, key, host, bind_host)
        self.address = self.inbox.address
        self._outbox: queue.Queue = queue.Queue()  # notices the receive thread wants sent (it has no links)
        self._poked = threading.Event()
        self._closing = threading.Event()
        self._service = threading.Thread(target=self._serve, name="service", daemon=True)

    # --- life cycle --------------------------------------------------------------------------------

    def start(self, addresses: list[str]) -> None:
        """Every worker is ready (the rendezvous gave their addresses): the clock starts."""
        self.start_time = time.perf_counter()
        stopping = lambda: self.pool.stopped  # noqa: E731
        self.main_links = self._links(self.rank, self.key, addresses, give_up=stopping)
        self.service_links = self._links(self.rank, self.key, addresses, give_up=lambda: self._closing.is_set())
        self.inbox.start(self._handle)
        self._service.start()

    def close(self) -> None:
        if self.duty is not None:
            self.duty.close()
        self._closing.set()
        self._poked.set()
        if self._service.is_alive():
            self._service.join(timeout=self.timeout + 10)
        self.inbox.close()
        for links in (getattr(self, "main_links", None), getattr(self, "service_links", None)):
            if links is not None:
                links.close()

    # --- what the training loop asks ---------------------------------------------------------------

    def next_action(self):
        with self.lock:
            return self.pool.next_action()

    def post_steal(self, action: Steal) -> None:
        """Ask ``action.peers`` for batches; the answers are taken by :meth:`poll` (or :meth:`await_steal`)."""
        for peer in action.peers:
            self._post(peer, "steal", action.epoch, {"epoch": action.epoch, "cycle": self.cycle})

    def post_mix(self, shared: tuple[dict[str, np.ndarray], dict]) -> int:
        """Send this worker's parameters (and gradient) to a random live peer, which mixes them in at its
        next step and answers with its own, mixed in here at our next step. Never waited on. The peer,
        or -1 when none is left."""
        with self.lock:
            peers = [p for p in self.pool.live() if p != self.rank]
        if not peers:
            return -1
        peer = self.rng.choice(peers)
        tensors, fields = shared
        if (request_id := self._post(peer, "mix", 0, fields, tensors)) is not None:
            self.sent[request_id] = tensors["params"]
        return peer

    def poll(self, wait_s: float = 0.0) -> None:
        """Take the answers that have come; a request unanswered for ``--peer-timeout-s`` declares its peer dead."""
        for peer, reply in self.main_links.collect(wait_s):
            self._on_answer(peer, reply)
        now = awake_now()  # this process's running time: a freeze of ours is not the peer's silence
        for request_id, (op, peer, epoch, sent) in list(self.pending.items()):
            if now - sent > self.timeout:
                del self.pending[request_id]
                self.sent.pop(request_id, None)
                self._unanswered(op, peer, epoch, None)

    def await_steal(self) -> None:
        """Nothing to train before a steal that is out is answered: wait for one answer (bounded)."""
        out = {i for i, (op, *_) in self.pending.items() if op == "steal"}
        while out and out <= self.pending.keys() and not self.pool.stopped:
            self.poll(0.05)

    def _post(self, peer: int, op: str, epoch: int, fields: dict | None, tensors: dict | None = None) -> int | None:
        """Send a request; its id, or None if it could not even be queued (the peer stopped reading)."""
        request_id = self.main_links.post(peer, op, fields, tensors)
        if request_id < 0:
            self._unanswered(op, peer, epoch, None)
            return None
        self.pending[request_id] = (op, peer, epoch, awake_now())
        return request_id

    def _on_answer(self, peer: int, reply: Message) -> None:
        op, _, epoch, _ = self.pending.pop(reply.get("id"), ("late", peer, 0, 0.0))
        sent = self.sent.pop(reply.get("id"), None)
        if not self.answered(reply, peer, f"a {op} request", self.main_links):
            self._unanswered(op, peer, epoch, reply)
            return
        if reply.op == "batches":  # even a late answer's batches are taken: they left the peer's queue
            items = reply.get("items")
            if not isinstance(items, list) or not all(
                    isinstance(i, list) and len(i) == 2 and is_int(i[0]) and is_int(i[1])
                    and 1 <= i[0] <= self.cfg.epochs and 0 <= i[1] < self.per_epoch for i in items):
                log.warning("worker %d: worker %d answered a steal with bad batches", self.rank, peer)
                items = []
            with self.lock:
                self.pool.on_steal_reply(peer, epoch, [(e, b) for e, b in items])
        elif reply.op == "params" and sent is not None:
            try:
                mail = self._shared_of(peer, reply, sent)
            except ProtocolError as e:
                log.warning("worker %d: a bad answer from worker %d: %s", self.rank, peer, e)
                return
            with self.lock:
                self.mailbox.extend(mail)

    def _unanswered(self, op: str, peer: int, epoch: int, reply: Message | None) -> None:
        """A request got no answer in time (``reply`` None: the peer is dead), or a refusal."""
        if reply is None:
            self.answered(None, peer, f"a {op} request", self.main_links)
        if op == "steal":  # nothing from that peer
            with self.lock:
                self.pool.on_steal_reply(peer, epoch, [])

    def report(self, action: Report, loss_sum: float, count: int, tasks: list[dict], exchanges: int) -> None:
        """Record this worker's report and broadcast it to every live peer."""
        fields = {"epoch": action.epoch, "batches": list(action.batches), "left": action.left,
                  "loss_sum": loss_sum, "count": count, "exchanges": exchanges}
        with self.lock:
            self.ledger.add(self.rank, action.epoch, list(action.batches), action.left, loss_sum, count, tasks, exchanges)
            peers = [p for p in self.pool.live() if p != self.rank]
        blob = np.frombuffer(json.dumps(tasks).encode(), np.uint8)  # task rows ride as bytes: no header limit
        for p in peers:
            self.main_links.tell(p, "report", fields, {"tasks": blob})
        self._poked.set()

    def wait(self, timeout_s: float) -> None:
        """Idle: until something changes (stop, adopted work) or ``timeout_s``."""
        with self.wake:
            self.wake.wait(timeout_s)

    def take_mailbox(self) -> list[tuple[str, np.ndarray]]:
        """The peers' parameters and averages received since the last step (call with :attr:`lock` held)."""
        mail, self.mailbox = self.mailbox, []
        return mail

    # --- deaths ------------------------------------------------------------------------------------

    def declare_dead(self, rank: int, why: str, links: Links | None = None) -> None:
        """``rank`` is gone: drop it, tell every live peer (and it, should it be alive after all)."""
        with self.lock:
            if not self.pool.on_peer_dead(rank):
                return
            peers = [p for p in self.pool.live() if p != self.rank] + [rank]
            self.deaths[rank] = {"rank": rank, "why": why, "noticed_at": round(time.time(), 3)}
            self.wake.notify_all()
        log.warning("worker %d: worker %d is gone (%s); %s", self.rank, rank, why,
                    "the job stops" if self.cfg.mode == "allreduce" else "the others take over its batches")
        if self.cfg.mode == "allreduce":
            self._fail(f"worker {rank} is gone ({why}); --mode allreduce cannot go on without every worker")
        for p in peers:
            if links is None:
                self.send_later(p, "dead", {"dead": rank, "why": why})
            else:
                links.tell(p, "dead", {"dead": rank, "why": why})
        self._poked.set()

    def answered(self, reply: Message | None, peer: int, what: str, links: Links) -> bool:
        """Whether ``reply`` is an answer to use. None (no answer in time) declares ``peer`` dead; "you were
        declared dead" makes this worker leave; another refusal is logged."""
        if reply is None:
            if not self.pool.stopped and not self._closing.is_set():
                self.declare_dead(peer, f"no answer to {what} within {self.timeout:g} s", links)
            return False
        if reply.op == "error":
            if reply.get("declared_dead"):
                self._left_out(peer)
            else:
                log.warning("worker %d: worker %d refused %s: %s", self.rank, peer, what, reply.get("reason"))
            return False
        return True

    def _left_out(self, by: int) -> None:
        with self.lock:
            if self.pool.stopped:
                return
            self.pool.on_peer_dead(self.rank)
            self.error = f"worker {self.rank} was declared dead by worker {by} (too slow to answer); it leaves the job"
            self.wake.notify_all()

    def _fail(self, error: str) -> None:
        """Stop this worker with ``error`` (a synchronous job that lost a worker, a recorder that failed)."""
        with self.lock:
            self.error = self.error or error
            self.pool.stop()
            self.wake.notify_all()

    # --- the service thread: watching peers, and the recorder's duty -------------------------------

    def _serve(self) -> None:
        ping_every = min(1.0, self.timeout / 3)
        next_ping = time.monotonic()
        while not self._closing.is_set():
            self._poked.clear()
            self._flush()
            if time.monotonic() >= next_ping and not self.pool.stopped:
                with self.lock:
                    targets = watched(self.rank, self.pool.live())
                for peer, answer in self.service_links.ask_all(targets, "ping", timeout_s=self.timeout).items():
                    self.answered(answer, peer, "a ping", self.service_links)
                next_ping = time.monotonic() + ping_every
            try:
                self._recorder_duty()
            except Exception as e:  # a record that cannot be written stops the job with its reason
                log.exception("worker %d: the recorder failed", self.rank)
                self.stop_all(f"the recorder (worker {self.rank}) failed: {e}")
            self._poked.wait(max(0.0, next_ping - time.monotonic()))
        self._flush()  # the last rows, the stop

    def _flush(self) -> None:
        while not self._outbox.empty():
            self.service_links.tell(*self._outbox.get())

    def _recorder_duty(self) -> None:
        with self.lock:
            mine = not self.pool.stopped and self.pool.live()[0] == self.rank
        if mine:
            if self.duty is None:  # rank 0 at the start, or a takeover
                self.duty = RecorderDuty(self, self.recorder or self.make_recorder())
                self.recorder = None
            self.duty.step()

    def send_later(self, peer: int, op: str, fields: dict | None = None, tensors: dict | None = None) -> None:
        """A notice from a thread without links (receive thread, evaluator), sent by the service thread."""
        self._outbox.put((peer, op, fields, tensors))
        self.poke()

    def poke(self) -> None:
        """Wake the service thread: something for the recorder, or notices to send."""
        self._poked.set()

    def stop_all(self, error: str | None) -> None:
        """Stop the job: every live worker (``error``: with it, as their one line), then this one."""
        with self.lock:
            peers = [p for p in self.pool.live() if p != self.rank]
        for p in peers:
            self.send_later(p, "stop", {"error": error} if error else {})
        if error:
            self._fail(error)
        with self.lock:
            self.pool.stop()
            self.wake.notify_all()
