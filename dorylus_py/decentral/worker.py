"""One worker's training loop: Cluster-GCN batches, with gossip or all-reduce between workers.

``gossip`` (after AD-PSGD, Lian et al., ICML 2018): the worker does what its work pool says
(``pool.py``, through ``node.py``): train a batch (forward, backward, an Adam step), steal batches from a
peer, report an epoch. Every ``--gossip-every k`` steps it sends its parameters to a random live peer and
takes the mean of its own and the peer's answer; the peer's receive thread answers at once with its
current parameters and mixes ours into its own at its next step. Nobody waits for a partner's compute,
and no epoch ends at a barrier: a fast worker trains more batches.

``allreduce`` (the baseline): each epoch's batches are dealt out round-robin and every step averages all
workers' gradients with one ``all_reduce``, so each step waits for the slowest worker. The recorder's
stop rides in the all-reduce, so every worker stops at the same step.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from dorylus_py.config import TrainConfig
from dorylus_py.decentral.batches import Batch, ClusterBatches
from dorylus_py.decentral.node import Node
from dorylus_py.decentral.pool import AwaitSteal, Idle, Report, Steal, Train, deal
from dorylus_py.decentral.recorder import set_flat
from dorylus_py.errors import DorylusError
from dorylus_py.models import build_module, spec_of


def parse_straggler(spec: str) -> tuple[int, float]:
    """``RANK:FACTOR`` -> (rank, factor); ``""`` -> (-1, 1.0). Checked by ``TrainConfig.check``."""
    if not spec:
        return -1, 1.0
    rank, factor = spec.split(":")
    return int(rank), float(factor)


@dataclass
class EpochLog:
    loss_sum: float = 0.0
    count: int = 0
    exchanges: int = 0
    tasks: list = field(default_factory=list)

    def task(self, kind: str, epoch: int, rank: int, start: float, **extra) -> None:
        self.tasks.append({"kind": kind, "train": True, "server": rank, "chunk": None, "epoch": epoch,
                           "start": round(start, 4), "end": round(time.time(), 4), "where": "worker", **extra})


class Trainer:
    def __init__(self, cfg: TrainConfig, batches: ClusterBatches, dims: list[int], rank: int, world: int,
                 device: str, comm_device: str = "cpu"):
        """``comm_device``: where all-reduce runs (the GPU with NCCL; the CPU with gloo)."""
        self.cfg, self.batches, self.rank, self.world, self.device = cfg, batches, rank, world, device
        self.comm_device = comm_device
        spec = spec_of(cfg, dims)
        self.model = build_module(spec, cfg.dropout, cfg.attention_dropout(), cfg.seed).to(device)  # same initial weights everywhere
        self.model.seed = cfg.seed * 1_000_003 + rank  # but each worker its own dropout masks
        self.weights = list(self.model.tensors().values())  # in parameters() order
        for w in self.weights:  # gradients live in place (all-reduce averages them as one vector)
            w.grad = torch.zeros_like(w)
        named = self.model.tensors()
        groups = [{"params": [named[t.name] for t in spec.tensors() if t.decay], "weight_decay": cfg.weight_decay},
                  {"params": [named[t.name] for t in spec.tensors() if not t.decay], "weight_decay": 0.0}]
        self.opt = torch.optim.Adam([g for g in groups if g["params"]], lr=cfg.lr)
        slow_rank, factor = parse_straggler(cfg.straggler)
        self.slowdown = factor if slow_rank == rank else 1.0
        self.steps = 0
        self.last_grad: np.ndarray | None = None  # this worker's latest own gradient, and its step number
        self.grad_step = 0
        self.logs: dict[int, EpochLog] = {}  # epoch -> what this worker did in it, until reported
        self.prefetch = ThreadPoolExecutor(1, thread_name_prefix="prefetch")  # builds the next batch ahead
        # All-reduce builds its next batch while the all-reduce waits. Gossip never waits, so a build
        # thread only helps where a core is free for it; on a busy CPU it only fights for the GIL.
        self.build_ahead = cfg.mode == "allreduce" or device.startswith("cuda") or (os.cpu_count() or 1) >= 2 * world
        self.ahead: tuple[tuple[int, int], Future] | None = None  # ((epoch, batch), its build)

    def params(self) -> np.ndarray:
        """A copy of the parameters as one float32 vector (the node calls it with its lock held)."""
        return torch.cat([p.detach().reshape(-1) for p in self.model.parameters()]).cpu().numpy()

    def run(self, node: Node) -> int:
        """Train until the recorder stops the job; return the number of batches this worker trained."""
        with self.prefetch:
            (self._gossip if self.cfg.mode == "gossip" else self._allreduce)(node)
        if node.error:
            raise DorylusError(node.error)
        return self.steps

    def _log(self, epoch: int) -> EpochLog:
        return self.logs.setdefault(epoch, EpochLog())

    # --- gossip ------------------------------------------------------------------------------------

    def _gossip(self, node: Node) -> None:
        idle_since = None
        while True:
            node.poll()
            action = node.next_action()
            if isinstance(action, Train):
                t0 = time.perf_counter()
                self._train(node, action.epoch, action.batch)
                took = time.perf_counter() - t0
                node.cycle = took if node.cycle is None else 0.7 * node.cycle + 0.3 * took
            elif isinstance(action, Steal):
                node.post_steal(action)
            elif isinstance(action, AwaitSteal):
                t0 = time.time()
                node.await_steal()
                self._log(node.pool.epoch).task("steal_wait", node.pool.epoch, self.rank, t0)
            elif isinstance(action, Report):
                log = self.logs.pop(action.epoch, EpochLog())
                node.report(action, log.loss_sum, log.count, log.tasks, log.exchanges)
            elif isinstance(action, Idle):  # every epoch left: the recorder's stop comes next
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since > self.cfg.wait_timeout_s:
                    raise DorylusError(f"worker {self.rank}: no word from the recorder for {self.cfg.wait_timeout_s:g} s")
                node.wait(0.5)
            else:
                return
            if not isinstance(action, Idle):
                idle_since = None

    def _train(self, node: Node, epoch: int, index: int) -> None:
        """Forward and backward on one batch; the step, with what peers sent since the last one; then,
        every ``--gossip-every`` steps, send the parameters to a random peer."""
        self._gradient(epoch, index, self._built(epoch, index))
        node.poll()
        with node.lock:
            self._step(node.take_mailbox())
            node.pool.trained(epoch, index)
            upcoming, ahead = node.pool.peek(), node.pool.steal_ahead()
        if ahead is not None:
            node.post_steal(ahead)
        if upcoming is not None and self.build_ahead:
            self._build_ahead(*upcoming)
        if self.steps % self.cfg.gossip_every == 0:
            with node.lock:
                shared = self.share()
            partner = node.post_mix(shared)
            log = self._log(epoch)
            log.exchanges += partner >= 0
            log.task("gossip", epoch, self.rank, time.time(), partner=partner)

    def _step(self, mail: list[tuple[str, np.ndarray]]) -> None:
        """The Adam step on our gradient; one more for each gradient a partner sent, as if trained here;
        then the partners' shifts and the recorder's averages."""
        own = torch.cat([w.grad.reshape(-1) for w in self.weights])
        self.opt.step()
        for kind, g in mail:
            if kind == "grad":
                self._set_grads(torch.from_numpy(g).to(self.device))
                self.opt.step()
        self.last_grad, self.grad_step = own.cpu().numpy(), self.steps
        self._apply([m for m in mail if m[0] != "grad"])

    def share(self) -> tuple[dict[str, np.ndarray], dict]:
        """What a gossip partner gets: the parameters and the latest gradient, with its step number
        (the node calls it with its lock held)."""
        if self.last_grad is None:
            return {"params": self.params()}, {}
        return {"params": self.params(), "grad": self.last_grad}, {"grad_step": self.grad_step}

    def _set_grads(self, flat: torch.Tensor) -> None:
        at = 0
        for w in self.weights:
            w.grad.copy_(flat[at:at + w.numel()].view_as(w))
            at += w.numel()

    def _apply(self, mail: list[tuple[str, np.ndarray]]) -> None:
        """Add the partners' shifts (half-way to each; k of them count 1/k each, so never past their mean)
        and the recorder's averages (all of each)."""
        if not mail:
            return
        flat = torch.cat([p.detach().reshape(-1) for p in self.model.parameters()])
        shifts = [m for m in mail if m[0] == "shift"]
        for kind, shift in mail:  # several exchanges at once: half-way to their mean, not past it
            flat.add_(torch.from_numpy(shift).to(self.device), alpha=1.0 / len(shifts) if kind == "shift" else 1.0)
        set_flat(self.model, flat)

    # --- one batch's gradient ----------------------------------------------------------------------

    def _build(self, epoch: int, index: int) -> tuple[Batch, float]:
        """Batch ``index`` of ``epoch`` and the seconds it took to build (the straggler's sleep counts them)."""
        t0 = time.perf_counter()
        return self.batches.batch(epoch, index), time.perf_counter() - t0

    def _gradient(self, epoch: int, index: int, built: tuple[Batch, float]) -> None:
        """Forward and backward on batch ``index``; ``.grad`` of each weight holds the result."""
        t0, c0 = time.time(), time.perf_counter()
        b, build_s = built
        self.model.train()
        self.opt.zero_grad(set_to_none=False)
        self.steps += 1
        logits = self.model(b.adj, b.x, self.steps)
        n = int(b.train.sum())
        log = self._log(epoch)
        if n:
            loss = F.cross_entropy(logits[b.train], b.y[b.train])
            loss.backward()
            log.loss_sum += loss.item() * n
            log.count += n
        if self.slowdown > 1.0:  # --straggler: this worker's compute takes FACTOR times as long
            time.sleep((self.slowdown - 1.0) * (build_s + time.perf_counter() - c0))
        log.task("batch", epoch, self.rank, t0, batch=index, nodes=len(b.nodes), train_nodes=n)

    # --- all-reduce (the baseline) -----------------------------------------------------------------

    def _allreduce(self, node: Node) -> None:
        """This worker's share of each epoch's batches, one all-reduce per step; the next batch is built
        while the all-reduce waits, as gossip builds its next batch while it trains."""
        per_epoch = self.batches.batches_per_epoch
        mine = list(deal(per_epoch, list(range(self.world)), self.rank))
        n = sum(w.numel() for w in self.weights)
        for epoch in range(1, self.cfg.epochs + 1):
            for s in range(-(-per_epoch // self.world)):
                flat = torch.zeros(n + 2, device=self.comm_device)  # gradient sum, batches, stop votes
                if s < len(mine):
                    self._gradient(epoch, mine[s], self._built(epoch, mine[s]))
                    following = mine[s + 1] if s + 1 < len(mine) else (mine[0] if mine else None)
                    self._build_ahead(epoch if s + 1 < len(mine) else epoch + 1, following)
                    flat[:n] = torch.cat([w.grad.reshape(-1) for w in self.weights]).to(self.comm_device)
                    flat[n] = 1.0
                flat[n + 1] = float(node.pool.stopped)
                t0 = time.time()
                try:
                    dist.all_reduce(flat)
                except RuntimeError as e:  # a peer died mid-collective (gloo says so; NCCL times out)
                    raise DorylusError(node.error or f"worker {self.rank}: the all-reduce failed: {e}") from None
                self._log(epoch).task("allreduce", epoch, self.rank, t0)
                if flat[n] > 0:
                    self._set_grads((flat[:n] / flat[n]).to(self.device))
                    with node.lock:
                        self.opt.step()
                if flat[n + 1] > 0:  # some worker heard the recorder's stop: all stop at this step
                    return
            log = self.logs.pop(epoch, EpochLog())
            node.report(Report(epoch, tuple(mine), left=True), log.loss_sum, log.count, log.tasks, 0)
        deadline = time.monotonic() + self.cfg.wait_timeout_s
        while not node.pool.stopped:
            if time.monotonic() > deadline:
                raise DorylusError(f"worker {self.rank}: no word from the recorder for {self.cfg.wait_timeout_s:g} s")
            node.wait(0.5)

    # --- batches built ahead -----------------------------------------------------------------------

    def _build_ahead(self, epoch: int, index: int | None) -> None:
        """Start building batch ``index`` of ``epoch`` on the prefetch thread (None, or already started: nothing)."""
        if index is not None and (self.ahead is None or self.ahead[0] != (epoch, index)):
            self.ahead = (epoch, index), self.prefetch.submit(self._build, epoch, index)

    def _built(self, epoch: int, index: int) -> tuple[Batch, float]:
        """Batch ``index`` of ``epoch``: the one built ahead if it is that one, else built now."""
        if self.ahead is not None and self.ahead[0] == (epoch, index):
            (_, future), self.ahead = self.ahead, None
            return future.result()
        return self._build(epoch, index)
