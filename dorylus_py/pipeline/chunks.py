"""Where each chunk of one graph server stands: its epoch, its stage, whether work is out for it.

Each chunk (an interval of the server's vertices) walks the model's stage list every epoch
(:mod:`.stages`; for GCN)::

    fwd 0, gather 0, ..., fwd L-1, gather L-1, loss,            (training forward)
    gather_bwd L-1, bwd L-1, ..., gather_bwd 0, bwd 0,           (backward)
    efwd 0, egather 0, ..., efwd L-1, egather L-1, eval          (evaluation forward, no dropout)

(with GCN's fused last layer, ``fwd L-1 .. bwd L-1`` is :func:`.stages.fused_last_layer`'s five stages).

*Tensor* stages (fwd, loss, bwd, efwd, eval, and GAT's ApplyEdge stages) are tasks for a tensor
worker; *graph* stages are done by the server itself. Asynchronously no chunk waits for another within an epoch (graph stages read the
freshest values present); the only gate is **bounded staleness**: a chunk may start epoch ``e`` only
while ``e - slowest <= S``, where ``slowest`` is the lowest epoch any chunk of any server is still in.
The slowest chunk itself always passes the gate, so the pipeline cannot deadlock. With ``local_barrier``
a graph stage also waits until every chunk of this server has reached it: the rows it reads from its
own server are then of its epoch, and only peers' rows can be stale (the furthest-behind chunk always
passes, so this cannot deadlock either). Synchronously every
chunk waits at every stage for all the others (:meth:`ChunkPipeline.behind`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dorylus_py.pipeline.stages import Stage, vertex_stages


@dataclass
class ChunkPipeline:
    chunks: int
    layers: int
    epochs: int
    staleness: int
    epoch: list[int] = field(default_factory=list)  # per chunk: the epoch it is in (epochs + 1 = finished)
    stage: list[int] = field(default_factory=list)  # per chunk: index into the stage list
    busy: list[bool] = field(default_factory=list)  # per chunk: its current stage's work is out
    first: int = 1  # the epoch every chunk starts in (after a checkpoint: its epoch + 1)
    stages: tuple[Stage, ...] = ()  # the model's stage list; empty: GCN's (vertex_stages)
    local_barrier: bool = False  # async: graph stages wait for this server's other chunks

    def __post_init__(self):
        self.stages = tuple(self.stages) or tuple(vertex_stages(self.layers))
        if max(s.layer for s in self.stages) + 1 != self.layers:
            raise ValueError(f"the stage list has {max(s.layer for s in self.stages) + 1} layers, not {self.layers}")
        self.epoch = [self.first] * self.chunks
        self.stage = [0] * self.chunks
        self.busy = [False] * self.chunks

    def min_epoch(self) -> int:
        return min(self.epoch)

    def finished(self) -> bool:
        return self.min_epoch() > self.epochs

    def current(self, chunk: int) -> Stage:
        return self.stages[self.stage[chunk]]

    def position(self, chunk: int) -> tuple[int, int]:
        return self.epoch[chunk], self.stage[chunk]

    def behind(self) -> tuple[int, int]:
        """The position (epoch, stage) of the chunk furthest behind."""
        return min(self.position(c) for c in range(self.chunks))

    def ready(self, slowest: int, stop_before: int | None = None) -> list[tuple[int, int, Stage]]:
        """Asynchronous: ``(chunk, epoch, stage)`` that may start now; ``slowest`` is the lowest
        epoch in the job. No chunk starts epoch ``stop_before`` or later (the switch back to sync)."""
        out = []
        last = self.epochs if stop_before is None else min(self.epochs, stop_before - 1)
        for c in range(self.chunks):
            e = self.epoch[c]
            if self.busy[c] or e > last:
                continue
            if self.stage[c] == 0 and e - slowest > self.staleness:
                continue  # too far ahead: wait for the slowest chunk
            if self.local_barrier and self.current(c).task is None and self.behind() < (e, self.stage[c]):
                continue  # a graph stage: another chunk of this server has not written its rows yet
            out.append((c, e, self.current(c)))
        return out

    def started(self, chunk: int) -> None:
        """The chunk's current stage is out: a tensor task, or a graph job."""
        self.busy[chunk] = True

    def done(self, chunk: int) -> bool:
        """The chunk's current stage finished; returns True when that completed its epoch."""
        self.busy[chunk] = False
        self.stage[chunk] += 1
        if self.stage[chunk] == len(self.stages):
            self.stage[chunk] = 0
            self.epoch[chunk] += 1
            return True
        return False

    def epoch_complete(self, epoch: int) -> bool:
        """Every chunk has finished ``epoch``."""
        return self.min_epoch() > epoch

    def validate(self) -> None:
        for c in range(self.chunks):
            assert self.first <= self.epoch[c] <= self.epochs + 1
            assert 0 <= self.stage[c] < len(self.stages)
            assert not (self.busy[c] and self.epoch[c] > self.epochs)
        assert max(self.epoch) - self.min_epoch() <= self.staleness + 1
