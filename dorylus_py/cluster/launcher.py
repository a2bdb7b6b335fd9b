"""The driver: start every process of a job on this machine, run it, record it, stop it cleanly.

Weight servers and graph servers are separate OS processes (``python -m dorylus_py.weights``,
``python -m graph_servers``) in their own sessions, so a Ctrl-C reaches only the driver, which then
stops them all. They bind any free port and say hello with their address; the driver answers each
with ``start`` and the full address map. Each epoch, every graph server sends its statistics and task
records; the driver adds them up into ``metrics.jsonl`` and ``tasks.jsonl``. A child that dies, a
silence longer than the wait timeout, or Ctrl-C stops the job with a one-line reason; no child is left.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import zmq

from dorylus_py.cluster.spec import ClusterSpec
from dorylus_py.config import TrainConfig
from dorylus_py.errors import DorylusError
from dorylus_py.partition import s3
from dorylus_py.partition.store import PartitionStore
from dorylus_py.progress import progress_bar
from dorylus_py.protocol import Message, decode, encode
from dorylus_py.training.record import BestTracker, RunRecord, run_summary
from dorylus_py.training.reference import TrainResult


class Job:
    def __init__(self, cfg: TrainConfig, parts_dir: Path, run_dir: Path, feature_norm: str,
                 cluster: ClusterSpec | None = None):
        self.cfg, self.parts_dir, self.run_dir, self.feature_norm = cfg, parts_dir, run_dir, feature_norm
        self.cluster = cluster
        self.ctx = zmq.Context.instance()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        if cluster is None:  # everything on this machine
            self.token = secrets.token_hex(16)
            port = self.router.bind_to_random_port("tcp://127.0.0.1")
            self.address = f"tcp://127.0.0.1:{port}"
        else:  # servers started elsewhere from the same cluster file and token
            self.token = os.environ.get("DORYLUS_TOKEN", "")
            if not self.token:
                raise DorylusError("a --cluster job needs the shared job token in DORYLUS_TOKEN")
            self.address = cluster.driver
            try:
                self.router.bind(f"tcp://*:{ClusterSpec.host_port(cluster.driver)[1]}")
            except zmq.ZMQError as e:
                raise DorylusError(f"cannot listen on {cluster.driver} ({e})") from None
        self.procs: dict[str, tuple[subprocess.Popen, Path]] = {}
        self.identities: dict[str, bytes] = {}
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)

    # --- processes -------------------------------------------------------------------------------

    def spawn(self, name: str, module: str, rank: int) -> None:
        log_path = self.run_dir / "logs" / f"{name}.log"
        env = dict(os.environ, DORYLUS_TOKEN=self.token, PYTHONUNBUFFERED="1")
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", module, "--driver", self.address, "--rank", str(rank)],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )
        self.procs[name] = (proc, log_path)

    def check_children(self) -> None:
        for name, (proc, log_path) in self.procs.items():
            code = proc.poll()
            if code is not None:
                tail = [line for line in log_path.read_text(errors="replace").splitlines() if line.strip()][-1:]
                why = f": {tail[0].strip()}" if tail else ""
                raise DorylusError(f"{name} exited with code {code}{why} (log: {log_path})")

    def stop(self) -> None:
        for ident in self.identities.values():
            try:
                self.router.send_multipart([ident, *encode(Message("stop"), self.token)], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        deadline = time.monotonic() + 10
        for proc, _ in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self.procs.clear()
        self.router.close(0)

    # --- messages --------------------------------------------------------------------------------

    def recv(self, timeout_s: float) -> tuple[bytes, Message]:
        """Next message from any child; checks for dead children while waiting."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.router.poll(200):
                frames = self.router.recv_multipart(copy=False)
                return frames[0].bytes, decode(frames[1:], self.token)
            self.check_children()
        raise DorylusError(f"no word from the servers for {timeout_s:.0f} s (logs: {self.run_dir / 'logs'})")

    def send(self, name: str, msg: Message) -> None:
        self.router.send_multipart([self.identities[name], *encode(msg, self.token)], copy=False)


def train_distributed(cfg: TrainConfig, parts_dir: Path, record: RunRecord, feature_norm: str,
                      show_progress: bool = True, cluster: ClusterSpec | None = None) -> TrainResult:
    """Run ``cfg`` on the prepared partitions in ``parts_dir``; write ``record``; return the result.

    Without ``cluster`` every process is started here; with it, the servers named in the cluster
    file are expected to connect (started with ``dorylus graph-server`` / ``weight-server``)."""
    store = PartitionStore.open(parts_dir)
    m = store.manifest
    k_parts = m["partitions"]
    n_ws = cfg.weight_servers if cluster is None else len(cluster.weight_servers)
    if cluster is not None and len(cluster.graph_servers) != k_parts:
        raise DorylusError(f"the cluster file lists {len(cluster.graph_servers)} graph servers but {parts_dir} "
                           f"has {k_parts} partitions")
    sizes = [p["nodes"] for p in m["parts"]]
    id_offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int).tolist()
    splits = np.zeros(3, dtype=np.int64)
    for k in range(k_parts):
        part = store.load(k, verify=False)
        splits += [int(np.asarray(part.train_mask).sum()), int(np.asarray(part.val_mask).sum()), int(np.asarray(part.test_mask).sum())]
    dims = [m["features"]] + [cfg.hidden] * (cfg.layers - 1) + [m["classes"]]
    total_chunks = sum(max(1, min(cfg.chunks, s)) for s in sizes)

    first_epoch, resume_from = 1, None
    if cfg.resume:
        from dorylus_py.checkpoint import checkpoint_root, load_checkpoint

        resume_from = checkpoint_root(str(parts_dir))
        first_epoch = int(load_checkpoint(resume_from)["epoch"]) + 1  # the CLI checked it is <= cfg.epochs
    job = Job(cfg, parts_dir, record.dir, feature_norm, cluster)
    data_dir = str(parts_dir) if s3.is_s3(parts_dir) else str(Path(parts_dir).resolve())
    start = time.perf_counter()
    history: list[dict] = []
    best = BestTracker()
    try:
        if cluster is None:
            for w in range(n_ws):
                job.spawn(f"weight-server-{w}", "dorylus_py.weights", w)
            for k in range(k_parts):
                job.spawn(f"graph-server-{k}", "graph_servers", k)
        addresses: dict[str, str] = {}
        while len(addresses) < n_ws + k_parts:
            ident, msg = job.recv(cfg.wait_timeout_s)
            if msg.op == "hello":
                name = f"{msg['role']}-{msg['rank']}"
                addresses[name] = msg["address"]
                job.identities[name] = ident
        ws_addrs = [addresses[f"weight-server-{w}"] for w in range(n_ws)]
        gs_addrs = [addresses[f"graph-server-{k}"] for k in range(k_parts)]
        common = {"dims": dims, "seed": cfg.seed, "mode": cfg.mode, "weight_servers": ws_addrs}
        for w in range(n_ws):
            job.send(f"weight-server-{w}", Message("start", common | {
                "resume_from": resume_from, "lr": cfg.lr, "weight_decay": cfg.weight_decay, "expected_grads": total_chunks,
                "async_update": cfg.async_update}))
        for k in range(k_parts):
            job.send(f"graph-server-{k}", Message("start", common | {
                "data_dir": data_dir, "feature_norm": feature_norm, "chunks": cfg.chunks,
                "id_offsets": id_offsets, "graph_servers": gs_addrs, "dropout": cfg.dropout,
                "num_train": int(splits[0]), "epochs": cfg.epochs, "backend": cfg.backend, "lambdas": cfg.lambdas,
                "lambda_latency_ms": cfg.lambda_latency_ms, "lambda_fail_rate": cfg.lambda_fail_rate,
                "lambda_memory_mb": cfg.lambda_memory_mb, "lambda_timeout_s": cfg.lambda_timeout_s,
                "lambda_function": cfg.lambda_function, "aws_region": cfg.aws_region, "aws_profile": cfg.aws_profile,
                "lambda_endpoint": cfg.lambda_endpoint, "lambda_run_here": cfg.lambda_run_here,
                "tensor_threads": cfg.tensor_threads, "device": cfg.resolved_device(), "relaunch_min_s": cfg.relaunch_min_s,
                "relaunch_factor": cfg.relaunch_factor, "wait_timeout_s": cfg.wait_timeout_s,
                "staleness": cfg.staleness, "first_epoch": first_epoch}))

        pending: dict[int, list[dict]] = {}
        finished: set[int] = set()
        bar = progress_bar(total=cfg.epochs, initial=first_epoch - 1, desc=f"train ({cfg.backend})", unit="epoch",
                           enabled=show_progress)
        stats = {"relaunches": 0, "duplicates": 0}
        switched, frozen = None, {}
        last = time.perf_counter()
        while len(finished) < k_parts:
            _, msg = job.recv(cfg.wait_timeout_s)
            if msg.op == "tasks":
                record.log_tasks([json.loads(line) for line in bytes(msg.tensors["jsonl"]).decode().splitlines()])
            elif msg.op == "epoch_stats" and msg.get("finished"):
                finished.add(int(msg["rank"]))
            elif msg.op == "epoch_stats":
                epoch = int(msg["epoch"])
                pending.setdefault(epoch, []).append(msg.fields)
                if len(pending[epoch]) < k_parts:
                    continue
                parts = pending.pop(epoch)
                correct = np.sum([p["correct"] for p in parts], axis=0)
                counts = np.sum([p["counts"] for p in parts], axis=0)
                acc = [float(c / n) if n else float("nan") for c, n in zip(correct, counts)]
                now = time.perf_counter()
                row = {"epoch": epoch, "loss": sum(p["loss_sum"] for p in parts) / int(splits[0]),
                       "train_acc": acc[0], "val_acc": acc[1], "test_acc": acc[2],
                       "epoch_s": now - last, "wall_s": now - start}
                last = now
                stats = {"relaunches": sum(p["relaunches"] for p in parts), "duplicates": sum(p["duplicates"] for p in parts)}
                history.append(row)
                record.log_epoch(row)
                best.update(epoch, acc[1], acc[2])
                bar.update(1)
                bar.set_postfix(loss=f"{row['loss']:.4f}", val=f"{acc[1]:.3f}", refresh=False)
                if cfg.checkpoint_every and epoch % cfg.checkpoint_every == 0:
                    _checkpoint(job, ws_addrs, len(dims) - 1, parts_dir, epoch)
                if cfg.target_acc and acc[1] >= cfg.target_acc:
                    break
                if cfg.switch_threshold and switched is None and acc[1] >= cfg.target_acc - cfg.switch_threshold:
                    switched, frozen = 0, {}  # ask every graph server to freeze, then fix the epoch
                    for k in range(k_parts):
                        job.send(f"graph-server-{k}", Message("switch", {}))
            elif msg.op == "switch":
                frozen[int(msg["rank"])] = int(msg["frozen_at"])
                if len(frozen) == k_parts:
                    switched = max(frozen.values())
                    for k in range(k_parts):
                        job.send(f"graph-server-{k}", Message("switch", {"at_epoch": switched}))
        bar.close()
        record.save_weights("weights.npz", _final_weights(job, ws_addrs, len(dims) - 1))
        if cfg.checkpoint_every and history and history[-1]["epoch"] % cfg.checkpoint_every:
            _checkpoint(job, ws_addrs, len(dims) - 1, parts_dir, history[-1]["epoch"])
        stats |= _weight_stats(job, ws_addrs) | {"switched_to_sync_at": switched}
    except KeyboardInterrupt:
        job.stop()
        raise DorylusError(f"interrupted; every process stopped (run record so far in {record.dir})") from None
    except BaseException:
        job.stop()
        raise
    job.stop()

    if not history:
        raise DorylusError("the job ended before its first epoch")
    summary = run_summary(history, best, time.perf_counter() - start, backend=cfg.backend, mode=cfg.mode, **stats)
    record.finish(summary)
    return TrainResult(summary, history)


def _ask(job: Job, address: str, msg: Message, what: str) -> Message:
    sock = job.ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    try:
        sock.send_multipart(encode(msg, job.token))
        if not sock.poll(30_000):
            raise DorylusError(f"no reply from {address} for {what}")
        return decode(sock.recv_multipart(), job.token)
    finally:
        sock.close(0)


def _final_weights(job: Job, ws_addrs: list[str], layers: int) -> dict[str, np.ndarray]:
    return {
        f"W{layer}": np.array(_ask(job, ws_addrs[layer % len(ws_addrs)], Message("pull_weights", {"layer": layer, "version": None}),
                                   f"layer {layer}'s weights").tensors["W"])
        for layer in range(layers)
    }


def _checkpoint(job: Job, ws_addrs: list[str], layers: int, store, epoch: int) -> None:
    from dorylus_py.checkpoint import checkpoint_root, save_checkpoint

    arrays = {}
    for layer in range(layers):
        reply = _ask(job, ws_addrs[layer % len(ws_addrs)], Message("pull_state", {"layer": layer}), f"layer {layer}'s state")
        arrays.update({f"{name}{layer}": np.array(t) for name, t in reply.tensors.items()})
    save_checkpoint(checkpoint_root(str(store)), epoch, arrays)


def _weight_stats(job: Job, ws_addrs: list[str]) -> dict:
    replies = [_ask(job, a, Message("ping"), "statistics") for a in ws_addrs]
    return {"weight_updates": sum(r["updates"] for r in replies), "duplicate_gradients": sum(r["duplicates"] for r in replies)}
