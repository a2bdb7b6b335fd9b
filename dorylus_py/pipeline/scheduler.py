"""The graph server's scheduler: a pure state machine, events in, instructions out.

It decides everything a graph server does with its chunks, in ``sync`` and ``async`` mode alike:
which tensor task to launch (and with which weights version), when a copy is overdue or lost and gets
relaunched, which result takes effect (the first; exactly once) and what follows from it (rows and
gradient contributions to the peers, the weight gradient to the weight server), when graph work runs
(and what a finished graph job sends the peers),
when an epoch is reported, and when the switch back to sync happens. It holds no sockets, threads,
tensors or clocks: :mod:`graph_servers.server` feeds it events (see :mod:`.events`) and carries out
what it returns.

``sync``: at every stage every chunk waits for all the others; a graph stage runs once for all rows,
and only when every peer's rows for it have come (one message per peer chunk: ``peer_chunks`` in
all), so sync mode computes exactly full-batch training. ``async``: chunks move on their own within
the staleness bound (:class:`.chunks.ChunkPipeline`); a training forward holds the newest weights
version for its chunk's backward (weight stashing).

The model enters only as its stage list (:mod:`.stages`): which stages are tensor tasks, what each
reads from and sends to the peers, which weights it pulls and whether it carries a gradient. The
rules (exactly-once, relaunch, staleness, stashing) are the same for every task kind.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from dorylus_py.pipeline.chunks import ChunkPipeline
from dorylus_py.pipeline.events import (
    Accept,
    Cancel,
    DriverRecorded,
    Finished,
    ForwardGradient,
    Freeze,
    Frozen,
    GraphDone,
    Invoke,
    PeerProgress,
    ReportEpoch,
    RowsArrived,
    RunGraph,
    SendProgress,
    SendRows,
    Serve,
    Stuck,
    SwitchAt,
    TaskEnded,
    TaskKey,
    TaskPulled,
    TaskResult,
    Tick,
)  # fmt: skip
from dorylus_py.pipeline.stages import Stage, task_stages
from dorylus_py.pipeline.tasks import RelaunchPolicy, TaskTracker

# No epoch starts more than this many past the last one the driver recorded: the weight servers keep each
# epoch's snapshot until the driver has recorded it, at most MAX_SNAPSHOTS (64) a layer (weights/store.py),
# so a driver that falls behind (a loaded machine) holds the training back instead of finding its epoch's
# snapshot gone.
DRIVER_LAG = 32


@dataclass
class Scheduler:
    rank: int
    chunks: int
    layers: int
    epochs: int
    mode: str  # sync | async
    staleness: int = 1
    peers: tuple = ()  # ranks of the other graph servers
    peer_chunks: int = 0  # messages a sync graph stage waits for: the peers' chunks, all together
    first_epoch: int = 1
    policy: RelaunchPolicy = field(default_factory=RelaunchPolicy)
    stall_s: float = 300.0  # no progress for this long: stuck
    workers: int = 0  # tasks the platform runs at once (the relaunch allowance counts the queue); 0: unbounded
    stages: tuple[Stage, ...] = ()  # the model's stage list; empty: GCN's
    epoch_gate: int = 1  # sync: an epoch starts while the slowest server is at most this many epochs behind
    local_barrier: bool = False  # async: a graph stage waits for this server's other chunks (ChunkPipeline)
    sync_epochs: int = 0  # async: epochs 1..sync_epochs run as sync mode does, the rest asynchronously
    fresh_wait_s: float = 0.0  # async: a graph stage waits up to this long for the peers' rows of its epoch

    def __post_init__(self):
        self.pipe = ChunkPipeline(self.chunks, self.layers, self.epochs, self.staleness, first=self.first_epoch,
                                  stages=self.stages, local_barrier=self.local_barrier)
        self.by_task = task_stages(self.pipe.stages)
        self.tracker = TaskTracker(self.policy, workers=self.workers)
        self.sync = self.mode == "sync" or self.first_epoch <= self.sync_epochs
        self.peer_min = {p: self.first_epoch for p in self.peers}
        self.arrived: Counter = Counter()  # (phase, epoch, layer) -> peer messages stored
        self.held: dict[tuple, float] = {}  # fresh_wait_s: (chunk, epoch, stage index) -> when it began to wait
        self.fwd_version: dict[tuple, int] = {}  # async: (layer, chunk) -> version its training forward used
        self.invocations: dict[TaskKey, tuple] = {}  # running key -> (version, hold), the same for every copy
        self.reported = self.first_epoch - 1
        self.told = self.first_epoch  # the min epoch peers last heard from us
        self.switch_at: int | None = None  # async: no epoch from this one on starts asynchronously
        self.switch_final = False
        self.recorded = self.first_epoch - 1  # the driver has recorded every epoch up to this one
        self.graph_busy = False  # sync: the all-rows graph job is out
        self.finished = False
        self.now = 0.0
        self.last_progress: float | None = None

    # --- the one entry point ---------------------------------------------------------------------

    def handle(self, event) -> list:
        now = getattr(event, "now", None)
        if now is not None:
            self.now = max(self.now, now)
        if self.last_progress is None:
            self.last_progress = self.now
        out = getattr(self, f"_on_{type(event).__name__}")(event)
        if not self.finished:
            out += self._advance()
        return out

    # --- events ----------------------------------------------------------------------------------

    def _on_Tick(self, e: Tick) -> list:
        if self.finished:
            return []
        gone = self.tracker.exhausted()
        if gone is not None:
            key, error = gone
            return [Stuck(f"task {self._name(key)} failed {self.tracker.attempts(key)} times; last error: {error}")]
        if self.now - self.last_progress > self.stall_s:
            return [Stuck(f"no progress for {self.stall_s:.0f} s ({self.describe()})")]
        return []

    def _on_TaskPulled(self, e: TaskPulled) -> list:
        if self.tracker.pulled(e.key, e.attempt, e.now):
            return [Serve(e.key)]
        return [Cancel(e.key, "already done" if e.key in self.tracker.done else "not running here")]

    def _on_TaskResult(self, e: TaskResult) -> list:
        key = e.key
        if not self.tracker.complete(key, e.now, e.attempt):
            return [Cancel(key, "duplicate")]
        self.invocations.pop(key, None)
        self.last_progress = self.now
        out: list = [Accept(key)]
        stage = self.by_task[(key.kind, key.train, key.layer)]
        if stage.weights == "hold" and not self.sync:
            self.fwd_version[(key.layer, key.chunk)] = int(e.version)
        out += [SendRows(phase, key.epoch, layer, key.chunk) for phase, layer in stage.sends]
        if stage.gradient:
            out.append(ForwardGradient(key, int(e.version)))
        self.pipe.done(key.chunk)
        return out

    def _on_TaskEnded(self, e: TaskEnded) -> list:
        self.tracker.ended(e.key, e.attempt, e.ok, e.error)
        return []

    def reads_ahead(self, phase: str, epoch: int, layer: int) -> bool:
        """Whether a peer's ``phase`` rows of ``layer`` and ``epoch`` come before any chunk here has started
        the stage that reads them (its Gather, or its backward's): that read will then be of its own
        epoch's rows (counted for the end log line: how stale an async run's reads were)."""
        at = next((i for i, s in enumerate(self.pipe.stages) if s.train and s.layer == layer and phase in s.needs), None)
        if at is None:
            return False
        return all(self.pipe.position(c) < (epoch, at) or self.pipe.position(c) == (epoch, at) and not self.pipe.busy[c]
                   for c in range(self.chunks))

    def expects_peer_epoch(self, epoch: int) -> bool:
        """Whether a peer's rows or progress may be of ``epoch``: within the staleness bound (and a little
        slack) of where this server is, and an epoch the job runs. A peer's message of any other epoch
        is malformed and refused before it is stored (rows of no such epoch would overwrite live ones)."""
        slack = self.staleness + 2
        return max(self.first_epoch, self.pipe.min_epoch() - slack) <= epoch <= min(self.epochs, self.pipe.min_epoch() + slack)

    def _on_RowsArrived(self, e: RowsArrived) -> list:
        self.arrived[(e.phase, e.epoch, e.layer)] += e.chunks
        return []

    def _on_PeerProgress(self, e: PeerProgress) -> list:
        if e.src in self.peer_min:
            self.peer_min[e.src] = max(self.peer_min[e.src], e.min_epoch)
        return []

    def _on_GraphDone(self, e: GraphDone) -> list:
        self.last_progress = self.now
        chunks = range(self.chunks) if e.chunk is None else (e.chunk,)
        stage = self.pipe.current(chunks[0])  # sync: every chunk is at it
        out = [SendRows(phase, e.epoch, layer, c) for c in chunks for phase, layer in stage.sends]
        if e.chunk is None:
            self.graph_busy = False
        for c in chunks:
            self.pipe.done(c)
        return out

    def _on_Freeze(self, e: Freeze) -> list:
        p = self.pipe
        started = max(ep if (st or busy) else ep - 1 for ep, st, busy in zip(p.epoch, p.stage, p.busy))
        if self.switch_at is None:
            self.switch_at = started + 1
        return [Frozen(self.switch_at)]

    def _on_SwitchAt(self, e: SwitchAt) -> list:
        self.switch_at, self.switch_final = e.epoch, True
        return []

    def _on_DriverRecorded(self, e: DriverRecorded) -> list:
        self.recorded = max(self.recorded, e.epoch)
        return []

    def driver_stop(self) -> int:
        """The first epoch that may not start yet: :data:`DRIVER_LAG` past the driver's last recorded one."""
        return self.recorded + DRIVER_LAG + 1

    # --- what follows from the state ---------------------------------------------------------------

    def _advance(self) -> list:
        out = [Invoke(key, attempt, *self.invocations[key]) for key, attempt in self.tracker.due(self.now)]
        out += self._start_ready()
        while self.reported < self.epochs and self.pipe.epoch_complete(self.reported + 1):
            self.reported += 1
            self.last_progress = self.now
            out.append(ReportEpoch(self.reported))
            low = self.pipe.min_epoch()
            self.tracker.forget_before(min([low, *self.peer_min.values()]) - 1)
            for tag in [t for t in self.arrived if t[1] < low]:
                del self.arrived[tag]
        if self.pipe.min_epoch() != self.told:
            self.told = self.pipe.min_epoch()
            out.append(SendProgress(self.told))
        if self.reported >= self.epochs:
            self.finished = True
            out.append(Finished())
        return out

    def _start_ready(self) -> list:
        if self.mode == "async":  # with barriers: the first --sync-epochs, and every epoch from a final switch on
            low = self.pipe.min_epoch()  # (each flip once every chunk finished the epochs before it, none started)
            self.sync = low <= self.sync_epochs or (self.switch_final and low >= self.switch_at)
        if self.sync:
            return self._start_sync()
        out = []
        stop = self.driver_stop() if self.switch_at is None else min(self.switch_at, self.driver_stop())
        for c, epoch, stage in self.pipe.ready(self.slowest(), stop):
            if self._waits_for_peers(c, epoch, stage):
                continue
            self.pipe.started(c)
            out.append(self._start(c, epoch, stage))
        return out

    def _waits_for_peers(self, chunk: int, epoch: int, stage: Stage) -> bool:
        """``fresh_wait_s``: a graph stage that reads the peers' rows waits for theirs of its own epoch (one
        message per peer chunk), but no longer than ``fresh_wait_s``; then it reads what has come."""
        if not self.fresh_wait_s or stage.task is not None or not stage.needs:
            return False
        at = (chunk, epoch, self.pipe.stage[chunk])
        if all(self.arrived[(phase, epoch, stage.layer)] >= self.peer_chunks for phase in stage.needs):
            self.held.pop(at, None)
            return False
        if self.now - self.held.setdefault(at, self.now) < self.fresh_wait_s:
            return True
        del self.held[at]
        return False

    def _start_sync(self) -> list:
        if self.graph_busy:
            return []
        epoch, index = self.pipe.behind()
        if epoch > self.epochs:
            return []
        stage = self.pipe.stages[index]
        at = [c for c in range(self.chunks) if self.pipe.position(c) == (epoch, index)]
        if index == 0 and (epoch - self.slowest() > self.epoch_gate or epoch >= self.driver_stop()):
            return []  # a peer still finishes an older epoch (after a switch from async; with --remat, the last
            # one: its evaluation rows land where our next training rows would), or the driver lags (DRIVER_LAG)
        if any(self.arrived[(phase, epoch, stage.layer)] < self.peer_chunks for phase in stage.needs):
            return []  # a peer's rows for this stage have not all come
        if stage.task is not None:
            todo = [c for c in at if not self.pipe.busy[c]]
            for c in todo:
                self.pipe.started(c)
            return [self._start(c, epoch, stage) for c in todo]
        if len(at) < self.chunks:
            return []  # a chunk is still behind
        self.graph_busy = True
        for c in at:
            self.pipe.started(c)
        return [RunGraph(stage.name, epoch, stage.layer, None)]

    def _start(self, chunk: int, epoch: int, stage: Stage):
        if stage.task is None:
            return RunGraph(stage.name, epoch, stage.layer, chunk)
        key = TaskKey(stage.task, stage.train, epoch, stage.layer, chunk)
        self.tracker.launch(key, self.now)
        hold = (epoch, self.rank, chunk) if stage.weights == "hold" and not self.sync else None
        self.invocations[key] = (self._version(key, stage), hold)
        return Invoke(key, 1, *self.invocations[key])

    def _version(self, key: TaskKey, stage: Stage) -> int | None:
        """Sync trains on ``epoch - 1`` and evaluates on ``epoch``; async forwards take the newest
        (training ones hold it), and a backward the one its forward used."""
        if stage.weights is None:
            return None
        if not self.sync:
            return self.fwd_version.get((key.layer, key.chunk)) if stage.weights == "stashed" else None
        return key.epoch - 1 if key.train else key.epoch

    def slowest(self) -> int:
        return min([self.pipe.min_epoch(), *self.peer_min.values()])

    def describe(self) -> str:
        stages = [f"{self.pipe.epoch[c]}:{self.pipe.current(c).name}/{self.pipe.current(c).layer}" for c in range(self.chunks)]
        return (f"chunks at {', '.join(stages)}; peers at {self.peer_min}; tasks out {len(self.tracker.running)}; "
                f"the driver has recorded epoch {self.recorded}")

    def validate(self) -> None:
        """Invariants, for tests."""
        self.pipe.validate()
        assert set(self.invocations) == set(self.tracker.running)
        for key in self.tracker.running:
            assert self.pipe.busy[key.chunk] and self.pipe.epoch[key.chunk] == key.epoch
            assert self.tracker.in_flight(key) <= self.policy.max_copies

    def _name(self, key: TaskKey) -> str:
        stage = self.by_task[(key.kind, key.train, key.layer)]
        return f"{stage.name} epoch {key.epoch} layer {key.layer} chunk {key.chunk}"
