"""The driver: start every process of a job, run it, record it, restart it when a server dies, stop it.

Weight servers and graph servers are separate OS processes (``python -m dorylus_py.weights``,
``python -m graph_servers``) in their own sessions, so a Ctrl-C reaches only the driver, which then
stops them all. Each epoch, every graph server sends its statistics and task records; the driver adds
them up into ``metrics.jsonl`` and ``tasks.jsonl``, keeps the best epoch's weights, and every
``checkpoint_interval()`` epochs takes a checkpoint: every tensor's weights and Adam state at the
version that ended that epoch, joined from the weight servers' row blocks (the weight servers keep
epoch snapshots, so the checkpoint is consistent while training runs on). It is written to ``RUN_DIR/checkpoints`` and kept in memory.

Recovery: when a server process dies, hangs or goes silent (:class:`ServerLost`, noticed within
seconds), the driver kills the job's remaining servers, starts a new set and resumes from the last
checkpoint, sending the weight servers its state. In a ``--cluster`` job it cannot start remote
servers: it tells the others to drop the job (servers serve job after job, so each says hello again)
and waits up to ``--replace-timeout-s`` for every rank, the lost one restarted by its supervisor or
systemd. It gives up after ``--max-restarts`` restarts, or at once when a server stopped itself with an
error (a restart would only repeat it), with one line saying why.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from dorylus_py import s3
from dorylus_py.checkpoint import fingerprint, load_checkpoint, model_shapes, save_checkpoint
from dorylus_py.cluster import reports
from dorylus_py.cluster.driver_link import DriverLink, ServerLost
from dorylus_py.config import TrainConfig
from dorylus_py.errors import DorylusError
from dorylus_py.models import spec_of
from dorylus_py.partition.store import PartitionStore
from dorylus_py.plan import plan
from dorylus_py.progress import progress_bar
from dorylus_py.protocol import Message, ProtocolError
from dorylus_py.serving.cluster_spec import ClusterSpec
from dorylus_py.serving.job import JobSpec
from dorylus_py.training.record import BestTracker, RunRecord, run_summary
from dorylus_py.training.reference import TrainResult
from dorylus_py.weights.blocks import Block, join, split, weight_blocks
from dorylus_py.weights.store import STATE_FIELDS

log = logging.getLogger(__name__)
# the graph servers' running totals in every epoch_stats, summed into summary.json: copies relaunched,
# duplicate results refused, weight gradients forwarded and forwards of a key already sent (exactly once: 0)
COUNTS = ("relaunches", "duplicates", "gradients_sent", "gradients_resent")


@dataclass(frozen=True)
class JobPlan:
    """What the driver works out once from the prepared store."""

    spec: JobSpec  # without addresses, first epoch and restart count: those are set per start
    splits: list[int]  # train, val, test vertex counts
    weight_servers: int
    blocks: list[Block]  # the model's weights, by row block and weight server
    fingerprint: dict  # what its checkpoints belong to (checkpoint.py)

    @classmethod
    def of(cls, cfg: TrainConfig, parts_dir, feature_norm: str, weight_servers: int) -> "JobPlan":
        m = PartitionStore.open(parts_dir).manifest
        sizes = [p["nodes"] for p in m["parts"]]
        run = plan(cfg, m["features"], m["classes"], m["nodes"], sizes, weight_servers)  # --chunks auto: a count from here on
        splits = [int(m["summary"][s]) for s in ("train", "val", "test")]  # no partition read
        edges = np.concatenate([[0], np.cumsum([p["nnz"] for p in m["parts"]])]).astype(int).tolist()
        data_dir = str(parts_dir) if s3.is_s3(parts_dir) else str(Path(parts_dir).resolve())
        spec = JobSpec(config=run.config, data_dir=data_dir, feature_norm=feature_norm, dims=run.widths,
                       id_offsets=np.concatenate([[0], np.cumsum(sizes)]).astype(int).tolist(),
                       chunk_counts=run.chunk_counts, edge_offsets=edges, num_train=splits[0], mode=cfg.mode,
                       lambda_share=list(run.lambda_share))
        blocks = weight_blocks(spec_of(run.config, spec.dims).tensors(), weight_servers)
        if len({b.server for b in blocks}) < weight_servers:
            raise DorylusError(f"--weight-servers {weight_servers}: the model's tensors have only {len(blocks)} row "
                               "blocks, so some weight servers would hold nothing")
        return cls(spec, splits, weight_servers, blocks, fingerprint(m, cfg.model, spec.dims))

    @property
    def graph_servers(self) -> int:
        return len(self.spec.chunk_counts)

    def version(self, epoch: int) -> int:
        """The weights version that ends ``epoch``: one update per epoch, or one per chunk gradient."""
        cfg = self.spec.config
        per_epoch = self.spec.total_chunks if cfg.mode == "async" and cfg.async_update == "chunk" else 1
        return epoch * per_epoch


def train_distributed(cfg: TrainConfig, parts_dir, record: RunRecord, feature_norm: str, show_progress: bool = True,
                      cluster: ClusterSpec | None = None, resume_from: str | None = None,
                      checkpoint_dir: str | None = None) -> TrainResult:
    """Run ``cfg`` on the prepared partitions in ``parts_dir``; write ``record``; return the result.

    Without ``cluster`` every process is started here; with it, the servers named in the cluster
    file are expected to connect (started with ``dorylus graph-server`` / ``weight-server``).
    ``resume_from``: a checkpoint folder to continue from; ``checkpoint_dir``: where checkpoints go
    (default ``RUN_DIR/checkpoints``)."""
    n_ws = cfg.weight_servers if cluster is None else len(cluster.weight_servers)
    plan = JobPlan.of(cfg, parts_dir, feature_norm, n_ws)
    if cluster is not None and len(cluster.graph_servers) != plan.graph_servers:
        raise DorylusError(f"the cluster file lists {len(cluster.graph_servers)} graph servers but {parts_dir} "
                           f"has {plan.graph_servers} partitions")
    resumed = (load_checkpoint(resume_from, plan.fingerprint, model_shapes(plan.spec.config, plan.spec.dims))
               if resume_from else None)
    run = _Run(cfg, plan, record, checkpoint_dir or str(record.dir / "checkpoints"), cluster, resumed, show_progress)
    link = DriverLink(record.dir, cluster, cfg.hang_timeout_s)
    try:
        run.go(link)
        summary_fields = run.finish(link)
    except KeyboardInterrupt:
        link.stop()
        raise DorylusError(f"interrupted; every process stopped (run record so far in {record.dir})") from None
    except BaseException:
        link.stop()
        raise
    link.stop()
    if not run.history:
        raise DorylusError("the job ended before its first epoch")
    summary = run_summary(run.history, run.best, time.perf_counter() - run.t0, backend=cfg.backend, mode=cfg.mode,
                          **summary_fields, refused_messages=link.rejections.record())
    record.finish(summary)
    return TrainResult(summary, run.history)


class _Run:
    """One training run across any number of starts of the job's servers."""

    def __init__(self, cfg: TrainConfig, plan: JobPlan, record: RunRecord, checkpoint_dir: str,
                 cluster: ClusterSpec | None, checkpoint: dict | None, show_progress: bool):
        self.cfg, self.plan, self.record, self.checkpoint_dir, self.cluster = cfg, plan, record, checkpoint_dir, cluster
        self.checkpoint = checkpoint  # the newest: arrays TENSOR:FIELD (W0:W, W0:adam_m, ...) and epoch
        self.history: list[dict] = []
        self.best = BestTracker()
        self.restarts = 0
        self.switched: int | None = None
        self.counts = dict.fromkeys(COUNTS, 0)  # of finished starts
        self.current = dict(self.counts)  # of the running start
        self.t0 = self.last = time.perf_counter()
        self.stopped_early = False
        first = self.first_epoch()
        self.bar = progress_bar(total=cfg.epochs, initial=first - 1, desc=f"train ({cfg.backend})", unit="epoch",
                                enabled=show_progress)

    def first_epoch(self) -> int:
        return 1 if self.checkpoint is None else int(self.checkpoint["epoch"]) + 1

    def names(self) -> list[str]:
        return ([f"weight-server-{w}" for w in range(self.plan.weight_servers)]
                + [f"graph-server-{k}" for k in range(self.plan.graph_servers)])

    # --- starts and restarts ---------------------------------------------------------------------

    def go(self, link: DriverLink) -> None:
        while True:
            try:
                self.start(link)
                self.train(link)
                return
            except ServerLost as e:
                if e.deliberate or self.restarts >= self.cfg.max_restarts:
                    why = "" if e.deliberate else f" after {self.restarts} restarts (--max-restarts)"
                    raise DorylusError(f"{e}; the job stops{why}") from None
                self.restart(link, e)

    def start(self, link: DriverLink) -> None:
        names = self.names()
        job = link.begin()  # this start's nonce: nothing of an earlier start or job is accepted in it
        if self.cluster is None:
            for name in names:
                role, _, rank = name.rpartition("-")
                link.spawn(name, "dorylus_py.weights" if role == "weight-server" else "graph_servers", int(rank))
        link.expect(names)
        addresses: dict[str, str] = {}
        # a --cluster restart waits for the lost server to come back (its supervisor, or systemd, starts it)
        wait_s = self.cfg.replace_timeout_s if self.cluster is not None and self.restarts else self.cfg.wait_timeout_s
        deadline = time.monotonic() + wait_s
        while len(addresses) < len(names):
            try:
                name, msg = link.recv(max(0.1, deadline - time.monotonic()))
            except ServerLost:
                raise  # died before its hello: restarted, or the job stops, as after any other death
            except DorylusError:
                missing = ", ".join(n for n in names if n not in addresses)
                raise DorylusError(f"{missing} did not say hello within {wait_s:.0f} s" + (
                    " (--replace-timeout-s: is each server run under a supervisor that restarts it?)"
                    if self.cluster is not None and self.restarts else "")) from None
            if msg.op == "hello":
                addresses[name] = msg["address"]
        first = self.first_epoch()
        sync_now = self.switched is not None and first >= self.switched
        spec = replace(self.plan.spec, first_epoch=first, restart=self.restarts, mode="sync" if sync_now else self.cfg.mode,
                       graph_servers=[addresses[f"graph-server-{k}"] for k in range(self.plan.graph_servers)],
                       weight_servers=[addresses[f"weight-server-{w}"] for w in range(self.plan.weight_servers)])
        for w in range(self.plan.weight_servers):
            state = {} if self.checkpoint is None else self.block_state([b for b in self.plan.blocks if b.server == w])
            link.send(f"weight-server-{w}", Message("start", {"spec": spec.to_wire(), "job": job}, state))
        for k in range(self.plan.graph_servers):
            link.send(f"graph-server-{k}", Message("start", {"spec": spec.to_wire(), "job": job}))
        self.spec = spec

    def restart(self, link: DriverLink, why: ServerLost) -> None:
        """Every server again from the newest checkpoint: those started here are killed and started anew;
        a --cluster job's are told to drop the job (each then says hello for the next) and the lost one is
        waited for, up to --replace-timeout-s, as its supervisor restarts it."""
        if self.cluster is None:
            link.kill_servers()
        else:
            link.release_servers()
        self.restarts += 1
        self.counts = {k: self.counts[k] + self.current[k] for k in self.counts}
        self.current = dict.fromkeys(self.counts, 0)
        done = self.first_epoch() - 1
        self.history = [r for r in self.history if r["epoch"] <= done]
        self.record.rewind_metrics(self.history)
        self.best = BestTracker.over(self.history)
        if self.switched is not None and self.switched > done + 1:
            self.switched = None  # the switch happened after the checkpoint: it may happen again
        self.bar.n = done
        self.bar.refresh()
        where = f"the checkpoint of epoch {done}" if done else "the start"
        how = "restarting every server" if self.cluster is None else \
            f"waiting up to {self.cfg.replace_timeout_s:.0f} s for every server to say hello, to resume"
        log.warning("%s; %s from %s (restart %d of at most %d)", why, how, where, self.restarts, self.cfg.max_restarts)
        self.last = time.perf_counter()

    # --- one start's epochs ------------------------------------------------------------------------

    def train(self, link: DriverLink) -> None:
        k_parts = self.plan.graph_servers
        pending: dict[int, list[dict]] = {}
        finished: set[str] = set()
        frozen: dict[str, int] = {}
        while len(finished) < k_parts:
            name, msg = link.recv(self.cfg.wait_timeout_s)
            try:
                report = self._checked(name, msg)
            except ProtocolError as e:  # a graph server's report that does not add up: counted, not used
                link.rejections.add("invalid", e)
                continue
            if msg.op == "tasks":
                self.record.log_tasks(report)
            elif msg.op == "epoch_stats" and msg.get("finished") is True:
                finished.add(name)
            elif msg.op == "epoch_stats":
                epoch = report["epoch"]
                if any(p["rank"] == report["rank"] for p in pending.get(epoch, [])):
                    link.rejections.add("invalid", ProtocolError(f"a second epoch_stats of epoch {epoch} from {name}"))
                    continue
                pending.setdefault(epoch, []).append(report)
                if len(pending[epoch]) == k_parts:
                    if self.epoch_done(link, epoch, pending.pop(epoch)):
                        return  # the target accuracy is reached
                    for w in range(self.plan.weight_servers):  # recorded: its snapshot may go
                        link.send(f"weight-server-{w}", Message("release", {"version": self.plan.version(epoch)}))
                    for k in range(k_parts):  # and the graph servers may run on (DRIVER_LAG)
                        link.send(f"graph-server-{k}", Message("recorded", {"epoch": epoch}))
            elif msg.op == "switch":
                frozen[name] = report
                if len(frozen) == k_parts:
                    self.switched = max(frozen.values())
                    for k in range(k_parts):
                        link.send(f"graph-server-{k}", Message("switch", {"at_epoch": self.switched}))

    def _checked(self, name: str, msg: Message):
        """What a graph server reported, checked (``reports.py``); None for what needs no checking."""
        if not name.startswith("graph-server-"):
            raise ProtocolError(f"{msg.op} from {name}, which is no graph server")
        if msg.op == "tasks":
            return reports.task_rows(msg)
        if msg.op == "epoch_stats" and msg.get("finished") is not True:
            return reports.epoch_stats(msg, int(name.rpartition("-")[2]), self.cfg.epochs)
        if msg.op == "switch":
            return reports.frozen_at(msg, self.cfg.epochs)
        return None

    def epoch_done(self, link: DriverLink, epoch: int, parts: list[dict]) -> bool:
        """Record an epoch every graph server finished; True when the run should stop here."""
        cfg = self.cfg
        correct = np.sum([p["correct"] for p in parts], axis=0)
        counts = np.sum([p["counts"] for p in parts], axis=0)
        acc = [float(c / n) if n else float("nan") for c, n in zip(correct, counts)]
        now = time.perf_counter()
        row = {"epoch": epoch, "loss": sum(p["loss_sum"] for p in parts) / self.plan.splits[0],
               "train_acc": acc[0], "val_acc": acc[1], "test_acc": acc[2], "epoch_s": now - self.last, "wall_s": now - self.t0,
               "servers": [p.get("usage", {}) for p in sorted(parts, key=lambda p: p["rank"])]}
        self.last = now
        self.current = {c: sum(p[c] for p in parts) for c in COUNTS}
        self.history.append(row)
        self.best.update(epoch, acc[1], acc[2])
        if self.record.log_epoch(row):  # the best of the whole record (a resumed run's earlier epochs too)
            self.record.save_weights("best_weights.npz", self.weights(link, epoch))
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{row['loss']:.4f}", val=f"{acc[1]:.3f}", refresh=False)
        interval = cfg.checkpoint_interval()
        if interval and epoch % interval == 0:
            self.take_checkpoint(link, epoch)
        if cfg.target_acc and acc[1] >= cfg.target_acc:
            self.stopped_early = True
            return True
        if cfg.switch_threshold and self.switched is None and acc[1] >= cfg.target_acc - cfg.switch_threshold:
            self.switched = 0  # ask every graph server to freeze, then fix the epoch
            for k in range(self.plan.graph_servers):
                link.send(f"graph-server-{k}", Message("switch", {}))
        return False

    # --- weights and checkpoints -----------------------------------------------------------------

    def state(self, link: DriverLink, epoch: int) -> dict[str, np.ndarray]:
        """Every tensor's ``TENSOR:FIELD`` (weights, Adam's moments and step, version) as it was at the
        end of ``epoch``, joined from every weight server's blocks."""
        blocks: dict[str, np.ndarray] = {}
        for w, address in enumerate(self.spec.weight_servers):
            reply = link.ask(address, Message("pull_state", {"version": self.plan.version(epoch)}),
                             f"weight server {w}'s state at epoch {epoch}")
            blocks.update({k: np.array(t) for k, t in reply.tensors.items()})
        return {k: v for f in STATE_FIELDS for k, v in join(blocks, f":{f}").items()}

    def block_state(self, blocks: list[Block]) -> dict[str, np.ndarray]:
        """The checkpoint's state of ``blocks`` (``BLOCK:FIELD``), for a weight server's ``start``."""
        missing = sorted({f"{b.tensor}:{f}" for b in blocks for f in STATE_FIELDS} - set(self.checkpoint))
        if missing:
            raise DorylusError(f"the checkpoint does not fit --model {self.cfg.model} as configured: it lacks "
                               f"{', '.join(missing[:3])}")
        out = {}
        for f in ("W", "adam_m", "adam_v"):
            out |= split(blocks, self.checkpoint, f":{f}")
        for f in ("adam_step", "version"):
            out |= {f"{b.name}:{f}": self.checkpoint[f"{b.tensor}:{f}"] for b in blocks}
        return out

    def weights(self, link: DriverLink, epoch: int) -> dict[str, np.ndarray]:
        """Every tensor's weights as they were at the end of ``epoch``, by name (``W0``, ``att_src0``, ...)."""
        return {k[: -len(":W")]: v for k, v in self.state(link, epoch).items() if k.endswith(":W")}

    def take_checkpoint(self, link: DriverLink, epoch: int) -> None:
        arrays = self.state(link, epoch)
        save_checkpoint(self.checkpoint_dir, epoch, arrays, self.plan.fingerprint)
        self.checkpoint = arrays | {"epoch": np.array(epoch, np.int64)}

    def finish(self, link: DriverLink) -> dict:
        """Final weights (and checkpoint) at the last recorded epoch; the run's counts. The graph servers'
        work is done: one dying now does not fail the job."""
        self.bar.close()
        link.retire([f"graph-server-{k}" for k in range(self.plan.graph_servers)])
        if not self.history:
            return {}
        last = self.history[-1]["epoch"]
        self.record.save_weights("weights.npz", self.weights(link, last))
        if self.cfg.checkpoint_interval() and (self.checkpoint is None or int(self.checkpoint["epoch"]) != last):
            self.take_checkpoint(link, last)
        replies = [link.ask(a, Message("ping"), "statistics") for a in self.spec.weight_servers]
        return {**{c: self.counts[c] + self.current[c] for c in COUNTS},
                "weight_updates": sum(r["updates"] for r in replies),
                "duplicate_gradients": sum(r["duplicates"] for r in replies),
                "switched_to_sync_at": self.switched, "restarts": self.restarts}
