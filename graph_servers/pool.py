"""``--lambdas auto`` on a graph server: the thin shell around the pure
:class:`~dorylus_py.pipeline.autotune.PoolTuner`. Each turn of the server's loop it reads how the
pool of leases stands (the graph server's ``load()``) and whether a graph job runs, feeds the tuner,
and carries out its decision: the pool resizes, the server log says why, and ``tasks.jsonl`` gets a
``resize`` row."""

from __future__ import annotations

import logging
import time

from dorylus_py.pipeline.autotune import PoolTuner, TunerPolicy
from dorylus_py.platforms.base import Platform
from dorylus_py.serving.job import JobSpec
from dorylus_py.settings import AUTO

log = logging.getLogger("dorylus.graph_server")


class AutoPool:
    def __init__(self, platform: Platform, tuner: PoolTuner, rank: int):
        self.platform, self.tuner, self.rank = platform, tuner, rank

    @classmethod
    def of(cls, spec: JobSpec, platform: Platform, rank: int, tasks_per_epoch: int) -> AutoPool | None:
        """A tuner for this server's pool under ``--lambdas auto`` (None otherwise), its windows an epoch
        long."""
        if spec.config.lambdas is not AUTO or not platform.resizable:
            return None
        start, low, high = spec.lambda_share  # the run plan's
        return cls(platform, PoolTuner(start, TunerPolicy(low=low, high=high, min_tasks=max(4, tasks_per_epoch // 2))),
                   rank)

    def finished(self, key, seconds: float) -> None:
        """A task's result came ``seconds`` after it was sent: its run time, by kind (training and evaluation apart)."""
        self.tuner.finished(key.kind if key.train else f"e{key.kind}", seconds)

    def tick(self, graph_running: bool, epoch: int) -> dict | None:
        """Measure the pool; on a decision, resize it and return the ``tasks.jsonl`` row saying so."""
        load, now, before = self.platform.load(), time.time(), self.tuner.size
        decision = self.tuner.sample(now, load.ready, load.waiting, load.busy, graph_running, epoch)
        if decision is None:
            return None
        self.platform.resize(decision.size)
        log.info("graph server %d lambdas %d -> %d in epoch %d: %s", self.rank, before, decision.size, epoch,
                 decision.reason)
        return {"kind": "resize", "train": True, "server": self.rank, "chunk": None, "epoch": epoch, "layer": None,
                "attempt": 0, "where": "autotuner", "start": now, "end": now, "billed_ms": 0, "memory_mb": 0,
                "ok": True, "error": "", "size": decision.size, "reason": decision.reason}
