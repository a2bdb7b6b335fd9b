"""What the workers reported of each epoch, and what the recorder decides from it. Pure: no sockets.

Every worker broadcasts its reports (``pool.Report``: the batches of an epoch it trained, whether it has
left the epoch, its loss sums and task rows) to every live peer, so every worker holds the same ledger
and any of them can take over as the recorder, which is always the lowest live rank. The recorder:

- evaluates epoch ``e`` once its batches are all reported trained (:meth:`EpochLedger.next_to_record`),
  in order, while the workers go on;
- adopts what a dead worker took with it: once every live worker has left an epoch and some of its
  batches were never reported, they are missing for good; the recorder trains them (and its peers may
  steal them), once (:meth:`EpochLedger.repairs`);
- stops the job after the last epoch, or once validation accuracy reaches the target
  (:meth:`EpochLedger.finished`).

The recorder's metrics rows are broadcast too (:meth:`EpochLedger.add_row`), so a recorder that takes
over rewrites the whole record.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field


@dataclass
class EpochReports:
    trained: set[int] = field(default_factory=set)  # batches someone reported trained
    left: set[int] = field(default_factory=set)  # ranks that left the epoch
    loss_sum: float = 0.0  # sum over trained batches of mean loss x train vertices
    count: int = 0  # train vertices behind loss_sum
    tasks: list[dict] = field(default_factory=list)  # tasks.jsonl rows
    adopted: set[int] = field(default_factory=set)  # batches this worker adopted as the recorder ...
    adopted_among: tuple[int, ...] = ()  # ... while these were the live workers


class EpochLedger:
    def __init__(self, world: int, epochs: int, per_epoch: int):
        self.world, self.epochs, self.per_epoch = world, epochs, per_epoch
        self.epoch: dict[int, EpochReports] = defaultdict(EpochReports)
        self.batches_per_worker = [0] * world
        self.exchanges = 0  # gossip exchanges the workers started
        self.rows: list[dict] = []  # metrics rows recorded so far, in epoch order

    def add(self, rank: int, epoch: int, batches: list[int], left: bool, loss_sum: float = 0.0, count: int = 0,
            tasks: list[dict] | None = None, exchanges: int = 0) -> None:
        """One worker's report (its own, or a peer's as broadcast)."""
        reports = self.epoch[epoch]
        reports.trained.update(batches)
        if left:
            reports.left.add(rank)
        reports.loss_sum += loss_sum
        reports.count += count
        reports.tasks.extend(tasks or ())
        self.batches_per_worker[rank] += len(batches)
        self.exchanges += exchanges

    @property
    def recorded(self) -> int:
        """The last epoch evaluated and recorded (0: none yet)."""
        return self.rows[-1]["epoch"] if self.rows else 0

    def complete(self, epoch: int) -> bool:
        return len(self.epoch[epoch].trained) == self.per_epoch

    def next_to_record(self) -> int | None:
        """The next epoch to evaluate, if all its batches are in (epochs are recorded in order)."""
        e = self.recorded + 1
        return e if e <= self.epochs and self.complete(e) else None

    def repairs(self, live: list[int]) -> dict[int, list[int]]:
        """Batches of epochs every live worker has left that nobody reported and this worker has not yet
        adopted: a dead worker's. Marked adopted; the caller trains them. After a further death they are
        adopted again (a peer may have stolen them from the recorder and died)."""
        out = {}
        for e, reports in sorted(self.epoch.items()):
            if e > self.recorded and set(live) <= reports.left and not self.complete(e):
                if reports.adopted_among != tuple(live):
                    reports.adopted, reports.adopted_among = set(), tuple(live)
                missing = sorted(set(range(self.per_epoch)) - reports.trained - reports.adopted)
                if missing:
                    reports.adopted.update(missing)
                    out[e] = missing
        return out

    def add_row(self, row: dict) -> None:
        """The recorder's metrics row of the next epoch (recorded here, or broadcast by the recorder)."""
        if row["epoch"] == self.recorded + 1:
            self.rows.append(row)

    def finished(self, target_acc: float) -> bool:
        """The last epoch is recorded, or the last recorded one reached the target validation accuracy."""
        if not self.rows:
            return False
        return self.recorded >= self.epochs or bool(target_acc and self.rows[-1]["val_acc"] >= target_acc)

    def loss(self, epoch: int) -> float:
        """Mean training loss over the train vertices of the epoch's batches."""
        r = self.epoch[epoch]
        return r.loss_sum / r.count if r.count else float("nan")
