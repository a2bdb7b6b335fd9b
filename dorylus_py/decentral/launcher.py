"""Start a decentralised (gossip or all-reduce) job: locally, or as one process of a ``torchrun`` job.

Locally, ``dorylus train --mode gossip --workers W`` clusters the graph once, writes it and the
clusters into RUN_DIR (the workers read them), runs the coordinator in a thread of this process and
starts W worker processes (``python -m dorylus_py.decentral``). Under ``torchrun`` (``RANK`` and
``WORLD_SIZE`` set), every process runs one worker; rank 0 also runs the coordinator on
``MASTER_PORT + 1`` and writes the run record. The coordinator evaluates the averaged model on the
whole graph at each epoch's end; that is what ``metrics.jsonl`` holds.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch

from dorylus_py.config import TrainConfig
from dorylus_py.data.formats import write_npz
from dorylus_py.data.graph import Graph
from dorylus_py.decentral.batches import ClusterBatches, batch_count, enhanced_adjacency
from dorylus_py.decentral.coordinator import Coordinator, CoordinatorClient
from dorylus_py.decentral.worker import Worker
from dorylus_py.errors import DorylusError
from dorylus_py.jobkey import KEY_ENV, load_job_key, new_key
from dorylus_py.models.gcn import GCN
from dorylus_py.partition.partitioners import assign
from dorylus_py.progress import progress_bar, status
from dorylus_py.training.record import BestTracker, RunRecord, run_summary
from dorylus_py.training.reference import (
    TrainResult,
    accuracy,
    input_features,
    model_dims,
    model_weights,
)


class EpochRecorder:
    """The coordinator's ``on_epoch``: evaluate the averaged model on the whole graph and record it."""

    def __init__(self, cfg: TrainConfig, graph: Graph, record: RunRecord, show_progress: bool):
        self.cfg, self.record = cfg, record
        self.adj = enhanced_adjacency(graph.indptr, graph.indices, np.arange(graph.num_nodes), graph.num_nodes,
                                      cfg.diag_lambda)
        self.x = torch.from_numpy(np.ascontiguousarray(input_features(cfg, graph)))
        self.y = torch.from_numpy(graph.labels)
        self.masks = {s: torch.from_numpy(graph.mask(s)) for s in ("train", "val", "test")}
        self.model = GCN(model_dims(cfg, graph), 0.0)
        self.best, self.best_weights, self.history, self.batches = BestTracker(), None, [], 0
        self.started()
        self.bar = progress_bar(total=cfg.epochs, desc=f"train ({cfg.mode}, {cfg.workers} workers)", unit="epoch",
                                enabled=show_progress)

    def started(self) -> None:
        """The clock starts when every worker is ready (the coordinator's ``on_start``)."""
        self.start = self.last = time.perf_counter()

    def __call__(self, epoch: int, params: np.ndarray, stats: dict, tasks: list[dict]) -> bool:
        now = stats["ended_at"]  # evaluation overlaps the next epoch; the time is the epoch's end
        torch.nn.utils.vector_to_parameters(torch.from_numpy(params), self.model.parameters())
        self.model.eval()
        with torch.no_grad():
            logits = self.model(self.adj, self.x)
        acc = {s: accuracy(logits, self.y, m) for s, m in self.masks.items()}
        row = {"epoch": epoch, "loss": stats["loss_sum"] / max(stats["count"], 1), "train_acc": acc["train"],
               "val_acc": acc["val"], "test_acc": acc["test"], "epoch_s": now - self.last, "wall_s": now - self.start,
               "workers": stats["workers"]}
        self.last = now
        self.history.append(row)
        self.record.log_epoch(row)
        self.record.log_tasks(tasks)
        self.batches += sum(t["kind"] == "batch" for t in tasks)
        if self.best.update(epoch, acc["val"], acc["test"]):
            self.best_weights = model_weights(self.model)
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{row['loss']:.4f}", val=f"{acc['val']:.3f}", refresh=False)
        return not (self.cfg.target_acc and acc["val"] >= self.cfg.target_acc)

    def finish(self, extra: dict) -> TrainResult:
        self.bar.close()
        if not self.history:
            raise DorylusError("the job ended before its first epoch")
        summary = run_summary(self.history, self.best, time.perf_counter() - self.start, backend="decentral",
                              mode=self.cfg.mode, batches_trained=self.batches, **extra)
        self.record.save_weights("weights.npz", model_weights(self.model))
        self.record.save_weights("best_weights.npz", self.best_weights)
        self.record.finish(summary)
        return TrainResult(summary, self.history)


def pool_size(cfg: TrainConfig) -> int:
    """Batches in the coordinator's work pool each epoch; all-reduce deals them out itself (0)."""
    return batch_count(cfg.clusters, cfg.clusters_per_batch) if cfg.mode == "gossip" else 0


def run_worker(cfg: TrainConfig, graph: Graph, owner: np.ndarray | None, rank: int, world: int, coordinator: str,
               init_method: str, key: bytes) -> int:
    """One worker: join the process group, train until the coordinator says stop, leave it."""
    device = cfg.resolved_device()
    # NCCL needs one GPU per rank; with more workers than GPUs they share them and talk through gloo.
    backend = "nccl" if device.startswith("cuda") and world <= torch.cuda.device_count() else "gloo"
    if device == "cuda":
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', rank)) % torch.cuda.device_count()}"
    torch.distributed.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                                         timeout=timedelta(seconds=cfg.wait_timeout_s))
    client = CoordinatorClient(coordinator, key, rank, cfg.wait_timeout_s)
    try:
        batches = ClusterBatches(graph, input_features(cfg, graph), cfg.clusters, cfg.clusters_per_batch,
                                 cfg.diag_lambda, cfg.seed, device, owner=owner)
        comm = device if backend == "nccl" else "cpu"
        return Worker(cfg, batches, model_dims(cfg, graph), rank, world, client, device, comm).run()
    finally:
        client.close()
        torch.distributed.destroy_process_group()


def train_decentral(cfg: TrainConfig, graph: Graph, run_dir: Path, config: dict, overwrite: bool = False,
                    show_progress: bool = True) -> TrainResult | None:
    """Run ``cfg`` (mode gossip or allreduce); return the result (None on a non-zero torchrun rank)."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return _under_torchrun(cfg, graph, run_dir, config, overwrite, show_progress)
    record = RunRecord(run_dir, config, overwrite=overwrite)
    status(f"clustering into {cfg.clusters} METIS parts")
    np.save(run_dir / "clusters.npy", assign(graph, cfg.clusters, "metis", cfg.seed))
    write_npz(graph, run_dir / "graph.npz")
    (run_dir / "logs").mkdir(exist_ok=True)
    key = new_key()
    procs: list[subprocess.Popen] = []
    recorder = EpochRecorder(cfg, graph, record, show_progress)
    coord = Coordinator(cfg.workers, pool_size(cfg), key, cfg.epochs, recorder, alive=lambda r: procs[r].poll() is None,
                        seed=cfg.seed, wait_timeout_s=cfg.wait_timeout_s, on_start=recorder.started)
    init = f"tcp://127.0.0.1:{_free_port()}"
    threads = cfg.threads or max(1, (os.cpu_count() or 1) // cfg.workers)
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=str(threads), **{KEY_ENV: key.hex()})
    try:
        for r in range(cfg.workers):
            with open(run_dir / "logs" / f"worker-{r}.log", "w") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "dorylus_py.decentral", "--run-dir", str(run_dir), "--rank", str(r),
                     "--world", str(cfg.workers), "--coordinator", coord.address, "--init", init],
                    stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))
        coord.start()
        while not coord.done.wait(0.2):
            if cfg.mode == "allreduce":  # a synchronous job cannot go on without every worker
                for r, p in enumerate(procs):
                    if p.poll() not in (None, 0):
                        raise DorylusError(f"worker {r} exited with code {p.returncode}{_last_line(run_dir, r)} "
                                           f"(log: {run_dir / 'logs' / f'worker-{r}.log'})")
        if coord.error is not None:
            raise DorylusError(f"{coord.error}{_last_line(run_dir, coord.deaths[-1]) if coord.deaths else ''}")
        _wait_or_kill(procs, 30)
    except KeyboardInterrupt:
        raise DorylusError(f"interrupted; every worker stopped (run record so far in {run_dir})") from None
    finally:
        _wait_or_kill(procs, 0)
        coord.close()
    return recorder.finish({"workers": cfg.workers, **coord.stats()})


def worker_process(argv=None) -> int:
    """``python -m dorylus_py.decentral``: one worker started by :func:`train_decentral`."""
    import argparse

    from dorylus_py.cluster.node import exit_with_parent, run_main
    from dorylus_py.data.formats import read_npz

    ap = argparse.ArgumentParser(description="one decentralised worker (started by `dorylus train --mode gossip`)")
    ap.add_argument("--run-dir", required=True, help="run folder with config.json, graph.npz and clusters.npy")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--coordinator", required=True, help="tcp://HOST:PORT")
    ap.add_argument("--init", required=True, help="torch.distributed init method, tcp://HOST:PORT")
    args = ap.parse_args(argv)

    def main() -> None:
        exit_with_parent(3)
        run = Path(args.run_dir)
        saved = json.loads((run / "config.json").read_text())
        cfg = TrainConfig(**{k: v for k, v in saved.items() if k in TrainConfig.__dataclass_fields__})
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        run_worker(cfg, read_npz(run / "graph.npz"), np.load(run / "clusters.npy"), args.rank, args.world,
                   args.coordinator, args.init, load_job_key())

    return run_main(main)


def _under_torchrun(cfg, graph, run_dir, config, overwrite, show_progress) -> TrainResult | None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    host, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "29500"))
    if not os.environ.get(KEY_ENV):  # not the rendezvous id: anyone who can see the command line knows that
        raise DorylusError(f"under torchrun, export {KEY_ENV} (the same in every process; `dorylus keys gen DIR` "
                           "writes one)")
    key = load_job_key()
    cfg = TrainConfig(**(cfg.to_dict() | {"workers": world}))
    owner = assign(graph, cfg.clusters, "metis", cfg.seed)  # deterministic: the same in every process
    coord_addr = f"tcp://{host}:{port + 1}"
    if rank != 0:
        run_worker(cfg, graph, owner, rank, world, coord_addr, "env://", key)
        return None
    record = RunRecord(run_dir, config | {"workers": world}, overwrite=overwrite)
    recorder = EpochRecorder(cfg, graph, record, show_progress)
    coord = Coordinator(world, pool_size(cfg), key, cfg.epochs, recorder, seed=cfg.seed,
                        wait_timeout_s=cfg.wait_timeout_s, host="0.0.0.0", port=port + 1,
                        on_start=recorder.started).start()
    try:
        run_worker(cfg, graph, owner, 0, world, coord_addr.replace(host, "127.0.0.1"), "env://", key)
        coord.done.wait(cfg.wait_timeout_s)
        if coord.error is not None:
            raise DorylusError(str(coord.error))
    finally:
        coord.close()
    return recorder.finish({"workers": world, **coord.stats()})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _last_line(run_dir: Path, rank: int) -> str:
    path = run_dir / "logs" / f"worker-{rank}.log"
    lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()] if path.exists() else []
    return f": {lines[-1]}" if lines else ""


def _wait_or_kill(procs: list[subprocess.Popen], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for p in procs:
        try:
            p.wait(timeout=max(0.01, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)
