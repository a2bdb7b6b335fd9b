"""The run record of a decentralised job, kept by its recorder: the lowest live rank.

Once every batch of an epoch is reported trained, the recorder's service thread takes a snapshot of the
live workers' parameters (they answer from their receive threads and go on training) and averages it;
with ``--average-every E``, every E-th average is sent back and each worker shifts its parameters by
(average - its snapshot), keeping what it learnt since. An evaluator thread evaluates the averages in
order on the whole graph, with the batches' normalisation, and writes the rows; the row's time is the
snapshot's, so an evaluation that lags does not move it. Accuracies are exact ratios (correct / count),
times are rounded to 0.1 ms: plain numbers, not float32 noise. A recorder that takes over after the
previous one died rewrites the record from the ledger every worker keeps (rows, task rows, best model).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from pathlib import Path

import numpy as np
import torch

from dorylus_py.config import TrainConfig
from dorylus_py.data.graph import Graph
from dorylus_py.decentral.batches import batch_input
from dorylus_py.models import architecture, build_module, spec_of
from dorylus_py.protocol import ProtocolError
from dorylus_py.training.record import BestTracker, RunRecord, run_summary
from dorylus_py.training.reference import accuracy, input_features, model_dims, model_weights

log = logging.getLogger(__name__)


def set_flat(model: torch.nn.Module, flat: torch.Tensor) -> None:
    """Copy a flat parameter vector into ``model``'s parameters, in place."""
    with torch.no_grad():
        at = 0
        for p in model.parameters():
            p.copy_(flat[at:at + p.numel()].view_as(p))
            at += p.numel()


class Recorder:
    def __init__(self, cfg: TrainConfig, graph: Graph, run_dir: Path, config: dict, rank: int):
        self.cfg, self.rank = cfg, rank
        self.start = time.perf_counter()  # the node sets it to the moment every worker was ready
        self.adj = batch_input(architecture(cfg.model), graph, None, cfg.diag_lambda)
        self.x = torch.from_numpy(np.ascontiguousarray(input_features(cfg, graph)))
        self.y = torch.from_numpy(graph.labels)
        self.masks = {s: torch.from_numpy(graph.mask(s)) for s in ("train", "val", "test")}
        self.model = build_module(spec_of(cfg, model_dims(cfg, graph)), 0.0, 0.0, cfg.seed)
        # The launcher (or rank 0) checked the folder and put the data and logs in it: start the record
        # afresh there (a recorder taking over rewrites it all) without touching those.
        self.record = RunRecord(run_dir, config, continue_after=0)
        self.best, self.best_params = BestTracker(), None

    def catch_up(self, rows: list[dict], tasks: list[list[dict]], best_params: np.ndarray | None) -> None:
        """Taking over from a dead recorder: write what it had recorded (its rows, each with its epoch's
        task rows), as every worker's ledger holds it."""
        for row, epoch_tasks in zip(rows, tasks):
            self.record.log_epoch(row)
            self.record.log_tasks(epoch_tasks)
            self.best.update(row["epoch"], row["val_acc"], row["test_acc"])
        self.best_params = best_params

    def evaluate(self, epoch: int, params: np.ndarray, wall: float, loss: float, tasks: list[dict],
                 last_wall_s: float, workers: int) -> tuple[dict, bool]:
        """Evaluate and record the averaged parameters of ``epoch``, snapshot ``wall`` seconds after the
        start (``loss``: the mean training loss of its batches; ``last_wall_s``: the previous row's time);
        the row, and whether it is the best yet."""
        wall = round(wall, 4)
        set_flat(self.model, torch.from_numpy(params))
        self.model.eval()
        with torch.no_grad():
            logits = self.model(self.adj, self.x)
        acc = {s: accuracy(logits, self.y, m) for s, m in self.masks.items()}
        row = {"epoch": epoch, "loss": float(f"{loss:.6g}"), "train_acc": acc["train"], "val_acc": acc["val"],
               "test_acc": acc["test"], "epoch_s": round(wall - last_wall_s, 4), "wall_s": wall, "workers": workers}
        self.record.log_epoch(row)
        self.record.log_tasks(tasks)
        best = self.best.update(epoch, acc["val"], acc["test"])
        if best:  # written now, so a run interrupted later still has its best model
            self.best_params = params
            self.record.save_weights("best_weights.npz", model_weights(self.model))
        return row, best

    def finish(self, rows: list[dict], batches_per_worker: list[int], params: np.ndarray, **fields) -> dict:
        """Write the summary and the weights (the last averaged model, and the best); return the summary."""
        summary = run_summary(rows, self.best, round(time.perf_counter() - self.start, 3), backend="decentral",
                              mode=self.cfg.mode, batches_trained=sum(batches_per_worker),
                              batches_per_worker=batches_per_worker, recorded_by=self.rank, **fields)
        summary["median_epoch_s"] = round(summary["median_epoch_s"], 4)
        set_flat(self.model, torch.from_numpy(params))
        self.record.save_weights("weights.npz", model_weights(self.model))
        if self.best_params is not None:
            set_flat(self.model, torch.from_numpy(self.best_params))
        self.record.save_weights("best_weights.npz", model_weights(self.model))
        self.record.finish(summary)
        return summary


class RecorderDuty:
    """The lowest live rank's duty besides training: on its service thread (:meth:`step`), adopt a
    dead worker's missing batches and snapshot each complete epoch; on an evaluator thread, evaluate,
    record and broadcast the rows, and stop the job at the end (the ``node`` is a ``node.Node``)."""

    def __init__(self, node, recorder: Recorder):
        self.node, self.recorder, self.cfg = node, recorder, node.cfg
        recorder.start = node.start_time
        with node.lock:  # copied under the lock, written outside it
            rows, best = list(node.ledger.rows), node.best_params
            tasks = [list(node.ledger.epoch[r["epoch"]].tasks) for r in rows]
        recorder.catch_up(rows, tasks, best)
        self.snapshotted = rows[-1]["epoch"] if rows else 0  # the last epoch whose snapshot is taken
        self.last_average: np.ndarray | None = None
        self.queue: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._evaluator, name="evaluator", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join(timeout=60)

    def step(self) -> None:
        node = self.node
        with node.lock:
            live = node.pool.live()
            for epoch, batches in node.ledger.repairs(live).items():
                log.warning("worker %d: training again batches %s of epoch %d (lost with a dead worker)",
                            node.rank, batches, epoch)
                node.pool.adopt(epoch, batches)
                node.wake.notify_all()
            epoch = self.snapshotted + 1
            ready = epoch <= self.cfg.epochs and node.ledger.complete(epoch) and not node.ledger.finished(self.cfg.target_acc)
        if ready:
            self._snapshot(epoch, live)
            self.snapshotted = epoch
            node.poke()  # maybe the next epoch is complete too

    def _snapshot(self, epoch: int, live: list[int]) -> None:
        """Average every live worker's parameters now; queue the average for evaluation."""
        node = self.node
        wall = time.perf_counter() - self.recorder.start
        peers = [p for p in live if p != node.rank]
        keep = bool(self.cfg.average_every) and epoch % self.cfg.average_every == 0
        answers = node.service_links.ask_all(peers, "snapshot", {"epoch": epoch, "keep": keep}, timeout_s=node.timeout)
        with node.lock:
            snapshots = [node.params()]
        for peer, answer in answers.items():
            if node.answered(answer, peer, "a snapshot request", node.service_links):
                try:
                    snapshots.append(node.params_of(answer))
                except ProtocolError as e:
                    log.warning("worker %d: a bad snapshot from worker %d: %s", node.rank, peer, e)
                    answers[peer] = None
        average = np.mean(np.stack(snapshots), axis=0, dtype=np.float64).astype(np.float32)
        if keep:  # every worker that sent a snapshot shifts by (average - its snapshot)
            with node.lock:
                node.mailbox.append(("average", average - snapshots[0]))
            for peer, answer in answers.items():
                if answer is not None and answer.op == "params":
                    node.service_links.tell(peer, "average", {"epoch": epoch}, {"params": average})
        self.queue.put((epoch, average, wall, len(snapshots)))

    def _evaluator(self) -> None:
        node = self.node
        while (item := self.queue.get()) is not None:
            epoch, average, wall, workers = item
            try:
                with node.lock:
                    if node.ledger.finished(self.cfg.target_acc):
                        continue  # snapshots taken before the verdict came: the job is over
                    loss, tasks, rows = node.ledger.loss(epoch), list(node.ledger.epoch[epoch].tasks), node.ledger.rows
                    last = rows[-1]["wall_s"] if rows else 0.0
                row, best = self.recorder.evaluate(epoch, average, wall, loss, tasks, last, workers)
                with node.lock:
                    node.ledger.add_row(row)
                    self.last_average = average
                    if best:
                        node.best_params = average
                    peers = [p for p in node.pool.live() if p != node.rank]
                    finished = node.ledger.finished(self.cfg.target_acc)
                for p in peers:
                    node.send_later(p, "row", {"row": row}, {"best": average} if best else None)
                if finished:
                    self._finish()
            except Exception as e:  # a record that cannot be written stops the job with its reason
                log.exception("worker %d: the recorder failed", node.rank)
                node.stop_all(f"the recorder (worker {node.rank}) failed: {e}")
                return

    def _finish(self) -> None:
        node = self.node
        with node.lock:  # copied under the lock, written outside it
            ledger, final = node.ledger, self.last_average if self.last_average is not None else node.params()
            rows, per_worker, exchanges = list(ledger.rows), list(ledger.batches_per_worker), ledger.exchanges
            fields = {"workers": node.world, "workers_at_end": len(node.pool.live()), "worker_deaths": sorted(node.deaths),
                      "deaths": sorted(node.deaths.values(), key=lambda d: d["noticed_at"])}
        node.summary = self.recorder.finish(rows, per_worker, final, **fields, gossip_rounds=exchanges,
                                            average_every=self.cfg.average_every)
        node.stop_all(None)
