"""What goes into the graph server's scheduler (events) and what comes out (instructions).

The scheduler (:mod:`dorylus_py.pipeline.scheduler`) is a pure state machine: the graph server's I/O
shell turns every message, platform completion, finished graph job and clock tick into one of the
events below, calls ``Scheduler.handle(event)``, and carries out the instructions it gets back, in
order. Time only enters as an event field, so the machine can be driven by tests through any
interleaving without sockets, threads or clocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class TaskKey(NamedTuple):
    """One tensor task: at least once launched, exactly once applied."""

    kind: str  # a task kind of the model's stage list: fwd | bwd | loss | fused | eval | edge_fwd | edge_bwd
    train: bool  # False: the evaluation forward (no dropout, newest weights)
    epoch: int
    layer: int
    chunk: int


# --- events ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tick:
    """Time passed: relaunch what is overdue, notice a stall."""

    now: float


@dataclass(frozen=True)
class TaskPulled:
    """A copy of a task asks for its rows: it has started."""

    key: TaskKey
    attempt: int
    now: float


@dataclass(frozen=True)
class TaskResult:
    """A copy of a task pushed its result (``version``: the weights it used, for fwd/bwd)."""

    key: TaskKey
    attempt: int
    now: float
    version: int | None = None


@dataclass(frozen=True)
class TaskEnded:
    """The platform says a copy finished running, well or not (its result, if any, came before)."""

    key: TaskKey
    attempt: int
    ok: bool
    now: float
    error: str = ""


@dataclass(frozen=True)
class RowsArrived:
    """A peer's rows for one of its chunks arrived (phase fwd/efwd: its ``Z`` rows that are our ghosts;
    bwd: its chunk's contribution to our vertices' gradients; ebwd: to our GAT source scores'
    gradients) and were stored by the shell."""

    phase: str
    epoch: int
    layer: int
    src: int
    chunks: int = 1  # how many of the peer's chunks it stands for (sync contributions: all, summed)


@dataclass(frozen=True)
class PeerProgress:
    """A peer's slowest chunk is in ``min_epoch`` (for the staleness bound)."""

    src: int
    min_epoch: int


@dataclass(frozen=True)
class GraphDone:
    """A graph job (Gather or its backward; ``chunk`` None: all rows at once) finished."""

    stage: str
    epoch: int
    layer: int
    chunk: int | None
    now: float


@dataclass(frozen=True)
class Freeze:
    """The driver asks to switch back to sync: start no epoch beyond those already started."""


@dataclass(frozen=True)
class SwitchAt:
    """The driver fixed the epoch from which every server runs synchronously."""

    epoch: int


@dataclass(frozen=True)
class DriverRecorded:
    """The driver has recorded every epoch up to ``epoch`` (its snapshots on the weight servers may go)."""

    epoch: int


# --- instructions ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Invoke:
    """Launch a copy of a task (the same event every time, but for the attempt number)."""

    key: TaskKey
    attempt: int
    version: int | None  # weights version to pull; None: the newest
    hold: tuple | None  # async training forward: keep that version for the chunk's backward


@dataclass(frozen=True)
class Serve:
    """Answer a pull with the task's rows."""

    key: TaskKey


@dataclass(frozen=True)
class Cancel:
    """Answer a pull or a push: this task is already done or no longer wanted; the copy stops."""

    key: TaskKey
    reason: str


@dataclass(frozen=True)
class Accept:
    """The first result of a task: write it into the server's buffers (before what follows)."""

    key: TaskKey


@dataclass(frozen=True)
class SendRows:
    """Send peers what a finished task or graph job of ``chunk`` produced: ``fwd``/``efwd``: the chunk's
    new ``Z_l`` rows (GCN's fused last layer: its ``P̃`` rows) that they hold as ghosts; ``bwd``: its
    contribution to their vertices' ``dZ_l``; ``ebwd``: to their vertices' source-score gradients (GAT)."""

    phase: str
    epoch: int
    layer: int
    chunk: int


@dataclass(frozen=True)
class ForwardGradient:
    """Pass an accepted backward task's weight gradient to the weight server."""

    key: TaskKey
    version: int


@dataclass(frozen=True)
class RunGraph:
    """Do graph work, for one chunk's rows, or all rows when ``chunk`` is None (sync mode): the graph
    stage named ``stage`` of the model's stage list (``gather``/``egather``: ``G_l = A Z_l [+ S_l]``;
    ``gather_bwd``: ``dZ_l = Aᵀ dG_l``; ``attn_grad``: GAT's per-edge ``dα``; ``activate``/``activate_bwd``:
    the fused last layer's input ``P̃ = dropout(σ(G_{L-2}))`` and its backward)."""

    stage: str
    epoch: int
    layer: int
    chunk: int | None


@dataclass(frozen=True)
class SendProgress:
    min_epoch: int


@dataclass(frozen=True)
class ReportEpoch:
    epoch: int


@dataclass(frozen=True)
class Frozen:
    """Tell the driver how far this server goes asynchronously (the first epoch it has not started)."""

    at_epoch: int


@dataclass(frozen=True)
class Finished:
    """Every epoch is done and reported."""


@dataclass(frozen=True)
class Stuck:
    """The job cannot go on here; ``reason`` is the one line the driver shows."""

    reason: str
