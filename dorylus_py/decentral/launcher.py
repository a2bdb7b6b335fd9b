"""Start a decentralised (gossip or all-reduce) job: locally, or as one process of a ``torchrun`` job.

Locally, ``dorylus train --mode gossip --workers W`` checks the run folder, clusters the graph once,
writes it and the clusters into RUN_DIR (the workers read them), and starts W worker processes
(``python -m dorylus_py.decentral``). It takes no part in training: it serves the start-up rendezvous (a
bounded store on loopback where each worker publishes its address, ``store.py``), follows ``metrics.jsonl`` for the progress bar,
says when a worker dies, and reads the record the workers wrote. Under ``torchrun`` (``RANK`` and
``WORLD_SIZE`` set) every process runs one worker and the rendezvous is torchrun's store. In both, the
store's values are signed with the job key (``rendezvous.py``), and the record is written by the
recorder, the lowest live rank (``node.py``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from dorylus_py import children
from dorylus_py.config import SECTION_OF, TrainConfig
from dorylus_py.data.formats import write_npz
from dorylus_py.data.graph import Graph
from dorylus_py.decentral.batches import ClusterBatches
from dorylus_py.decentral.node import Node
from dorylus_py.decentral.recorder import Recorder
from dorylus_py.decentral.rendezvous import SignedStore, rendezvous, run_id
from dorylus_py.decentral.store import StoreClient, StoreServer
from dorylus_py.decentral.worker import Trainer
from dorylus_py.errors import DorylusError
from dorylus_py.jobkey import KEY_ENV, load_job_key, new_key
from dorylus_py.serving.node import PARENT_ENV
from dorylus_py.partition.partitioners import assign
from dorylus_py.progress import progress_bar, status
from dorylus_py.training.record import RunRecord, end_record, end_status
from dorylus_py.training.reference import TrainResult, input_features, model_dims


def run_worker(cfg: TrainConfig, graph: Graph, owner: np.ndarray | None, rank: int, world: int, store: SignedStore,
               key: bytes, run_dir: Path, config: dict, host: str = "127.0.0.1", bind_host: str | None = None) -> dict | None:
    """One worker: set up, meet the others at ``store``, train until the recorder stops the job.
    Returns the run's summary if this worker wrote the final record, else None."""
    device = cfg.resolved_device()
    # NCCL needs one GPU per rank; with more workers than GPUs they share them and talk through gloo.
    backend = "nccl" if device.startswith("cuda") and world <= torch.cuda.device_count() else "gloo"
    if device == "cuda":
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', rank)) % torch.cuda.device_count()}"
    if cfg.mode == "allreduce":
        dist.init_process_group(backend, store=dist.PrefixStore("allreduce", store.store), rank=rank, world_size=world,
                                timeout=timedelta(seconds=cfg.wait_timeout_s))
    try:
        batches = ClusterBatches(graph, input_features(cfg, graph), cfg.clusters, cfg.clusters_per_batch,
                                 cfg.diag_lambda, cfg.seed, device, owner=owner, model=cfg.model)
        trainer = Trainer(cfg, batches, model_dims(cfg, graph), rank, world, device,
                          device if backend == "nccl" else "cpu")
        node = Node(cfg, rank, world, key, trainer.params, trainer.share,
                    lambda: Recorder(cfg, graph, run_dir, config, rank), host, bind_host)
        try:
            node.start(rendezvous(store, rank, world, node.address, cfg.wait_timeout_s))
            trainer.run(node)
        finally:
            node.close()
        return node.summary
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def train_decentral(cfg: TrainConfig, graph: Graph, run_dir: Path, config: dict, overwrite: bool = False,
                    show_progress: bool = True) -> TrainResult | None:
    """Run ``cfg`` (mode gossip or allreduce); the result, or None in a torchrun process that did not
    write the record."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return _under_torchrun(cfg, graph, run_dir, config, overwrite)
    RunRecord(run_dir, config, overwrite=overwrite).close()  # checks the folder before anything starts
    status(f"clustering into {cfg.clusters} METIS parts")
    np.save(run_dir / "clusters.npy", assign(graph, cfg.clusters, "metis", cfg.seed))
    write_npz(graph, run_dir / "graph.npz")
    (run_dir / "logs").mkdir(exist_ok=True)
    key = new_key()
    store = StoreServer(key, cfg.workers)
    threads = cfg.threads or max(1, (os.cpu_count() or 1) // cfg.workers)
    env = children.env(PYTHONUNBUFFERED="1", OMP_NUM_THREADS=str(threads),
                       **{KEY_ENV: key.hex(), PARENT_ENV: str(os.getpid())})  # the key never on a command line
    procs: list[subprocess.Popen] = []
    bar = progress_bar(total=cfg.epochs, desc=f"train ({cfg.mode}, {cfg.workers} workers)", unit="epoch",
                       enabled=show_progress)
    try:
        for r in range(cfg.workers):
            with open(run_dir / "logs" / f"worker-{r}.log", "w") as log:
                procs.append(subprocess.Popen(
                    children.module("dorylus_py.decentral", "--run-dir", run_dir, "--rank", r,
                                    "--world", cfg.workers, "--store", f"127.0.0.1:{store.port}"),
                    stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))
        _watch(cfg, procs, run_dir, bar)
        if store.refused:
            tqdm.write(f"warning: the rendezvous store refused {store.refused} requests or connections (someone else on "
                       "this machine wrote to it, or tried to)", file=sys.stderr)
    except BaseException as e:  # the workers write the record; a job stopped from here ends it here
        _wait_or_kill(procs, 0)
        end_record(run_dir, end_status(e))
        if isinstance(e, KeyboardInterrupt):
            raise DorylusError(f"interrupted; every worker stopped (run record so far in {run_dir})") from None
        raise
    finally:
        bar.close()
        _wait_or_kill(procs, 0)
        store.close()
    return _result(run_dir)


def _watch(cfg: TrainConfig, procs: list[subprocess.Popen], run_dir: Path, bar) -> None:
    """Until every worker has exited: the progress bar, and a line for each worker that dies."""
    seen, shown, done_at = set(), 0, None
    while [p.poll() for p in procs].count(None):
        for r, p in enumerate(procs):
            if p.returncode not in (None, 0) and r not in seen:
                seen.add(r)
                line = f"worker {r} {_how(p.returncode)}" + (_last_line(run_dir, r) if p.returncode > 0 else "")
                if cfg.mode == "allreduce" or len(seen) == len(procs):
                    raise DorylusError(f"{line} (log: {run_dir / 'logs' / f'worker-{r}.log'})")
                tqdm.write(f"warning: {line}; the other workers go on without it", file=sys.stderr)
        shown = _follow(run_dir, bar, shown)
        if done_at is None and (run_dir / "summary.json").exists():
            done_at = time.monotonic()
        if done_at is not None and time.monotonic() - done_at > cfg.peer_timeout_s + 30:
            break  # the record is written; workers that linger are stopped below
        time.sleep(0.1)  # polling child processes
    _follow(run_dir, bar, shown)


def _result(run_dir: Path) -> TrainResult:
    path = run_dir / "summary.json"
    if not path.exists():
        lines = [f"worker {r}{_last_line(run_dir, r)}" for r in range(len(list((run_dir / "logs").glob("worker-*.log"))))]
        raise DorylusError("the job ended without a record: " + "; ".join(lines))
    history = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return TrainResult(json.loads(path.read_text()), history)


def _follow(run_dir: Path, bar, shown: int) -> int:
    """Advance the progress bar by the epochs the recorder wrote since; how many it has shown."""
    path = run_dir / "metrics.jsonl"
    rows = path.read_text().splitlines() if path.exists() else []
    rows = [json.loads(x) for x in rows if x.endswith("}")]
    if len(rows) > shown:
        bar.update(len(rows) - shown)
        bar.set_postfix(loss=f"{rows[-1]['loss']:.4f}", val=f"{rows[-1]['val_acc']:.3f}", refresh=False)
    return max(shown, len(rows))


def worker_process(argv=None) -> int:
    """``python -m dorylus_py.decentral``: one worker started by :func:`train_decentral`."""
    import argparse

    from dorylus_py.data.formats import read_npz
    from dorylus_py.serving.node import exit_with_parent
    from dorylus_py.serving.process import run_main

    ap = argparse.ArgumentParser(description="one decentralised worker (started by `dorylus train --mode gossip`)")
    ap.add_argument("--run-dir", required=True, help="run folder with config.json, graph.npz and clusters.npy")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--store", required=True, help="the launcher's rendezvous store, HOST:PORT")
    args = ap.parse_args(argv)

    def main() -> None:
        exit_with_parent(3)
        run = Path(args.run_dir)
        config = json.loads((run / "config.json").read_text())
        cfg = TrainConfig.from_dict({k: v for k, v in config.items() if k in SECTION_OF})
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        host, port = args.store.rsplit(":", 1)
        key = load_job_key()
        store = SignedStore(StoreClient(host, int(port), key, cfg.wait_timeout_s), key, run_id())
        print(f"worker {args.rank}: pid {os.getpid()}", flush=True)
        run_worker(cfg, read_npz(run / "graph.npz"), np.load(run / "clusters.npy"), args.rank, args.world, store, key,
                   run, config)

    return run_main(main)


def _under_torchrun(cfg, graph, run_dir, config, overwrite) -> TrainResult | None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    if not os.environ.get(KEY_ENV):  # not the rendezvous id: anyone who can see the command line knows that
        raise DorylusError(f"under torchrun, export {KEY_ENV} (the same in every process; `dorylus keys gen DIR` "
                           "writes one)")
    key = load_job_key()
    cfg = TrainConfig(**(cfg.to_dict() | {"workers": world}))
    config = config | {"workers": world}
    store = SignedStore(dist.PrefixStore(f"dorylus/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", dist.TCPStore(
        master, int(os.environ.get("MASTER_PORT", "29500")), is_master=False, timeout=timedelta(seconds=cfg.wait_timeout_s))),
        key, run_id())
    if rank == 0:
        try:
            RunRecord(run_dir, config, overwrite=overwrite).close()
        except DorylusError as e:
            store.set("abort", str(e))
            raise
    owner = assign(graph, cfg.clusters, "metis", cfg.seed)  # deterministic: the same in every process
    host = _own_address(master)
    summary = run_worker(cfg, graph, owner, rank, world, store, key, run_dir, config, host, "0.0.0.0")
    if summary is None:
        return None
    history = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return TrainResult(summary, history)


def _own_address(master: str) -> str:
    """This machine's address on the route to ``master`` (what peers on other nodes can reach)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((master, 9))  # no packet is sent: this only picks the route
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def _how(code: int) -> str:
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else f"signal {-code}"
        return f"was killed ({name})"
    return f"exited with code {code}"


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
