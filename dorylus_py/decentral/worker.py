"""One worker of decentralised training: Cluster-GCN batches, with gossip or all-reduce between workers.

``gossip``: take a batch from the coordinator's pool, compute its gradient, and every ``gossip_every``
local steps average it with a partner's (the pair the coordinator formed), then step. A fast worker
simply trains more batches. ``allreduce`` (the baseline): each epoch's batches are dealt out round-robin
and every step averages all workers' gradients, so each step waits for the slowest worker.
At an epoch's end every worker sends its parameters to the coordinator and continues from their average.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from dorylus_py.config import TrainConfig
from dorylus_py.decentral.batches import Batch, ClusterBatches
from dorylus_py.decentral.coordinator import CoordinatorClient
from dorylus_py.models.gcn import GCN


def parse_straggler(spec: str) -> tuple[int, float]:
    """``RANK:FACTOR`` -> (rank, factor); ``""`` -> (-1, 1.0). Checked by ``TrainConfig.check``."""
    if not spec:
        return -1, 1.0
    rank, factor = spec.split(":")
    return int(rank), float(factor)


def exchange(flat: torch.Tensor, partner: int, tag: int) -> torch.Tensor:
    """Swap ``flat`` with ``partner``: both post their receive and their send together, then wait.

    One operation per direction on the pair, with a tag unique to the round: never several sends (or
    receives) in flight on one gloo pair, which is where gloo mismatches and hangs. Both directions at
    once cost one latency instead of two in turn (measured here: 2.9 ms against 3.8 ms per exchange
    under load). NCCL gets them as one grouped call, so neither side's operation blocks the other's;
    gloo gets them plainly (grouping costs gloo about 0.3 ms an exchange here).
    """
    other = torch.empty_like(flat)
    if dist.get_backend() == "nccl":
        works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, other, partner, tag=tag),
                                        dist.P2POp(dist.isend, flat, partner, tag=tag)])
    else:
        works = [dist.irecv(other, partner, tag=tag), dist.isend(flat, partner, tag=tag)]
    for work in works:
        work.wait()
    return other


@dataclass
class EpochLog:
    loss_sum: float = 0.0
    count: int = 0
    tasks: list = field(default_factory=list)

    def task(self, kind: str, epoch: int, rank: int, start: float, **extra) -> None:
        self.tasks.append({"kind": kind, "train": True, "server": rank, "chunk": None, "epoch": epoch,
                           "start": start, "end": time.time(), "where": "worker", **extra})


class Worker:
    def __init__(self, cfg: TrainConfig, batches: ClusterBatches, dims: list[int], rank: int, world: int,
                 client: CoordinatorClient, device: str, comm_device: str = "cpu"):
        """``comm_device``: where tensors are exchanged (the GPU with NCCL; the CPU with gloo)."""
        self.cfg, self.batches, self.rank, self.world, self.client, self.device = cfg, batches, rank, world, client, device
        self.comm_device = comm_device
        self.model = GCN(dims, cfg.dropout, seed=cfg.seed).to(device)  # same initial weights everywhere
        self.model.seed = cfg.seed * 1_000_003 + rank  # but each worker its own dropout masks
        for w in self.model.weights:  # gradients live in place, exchanged and averaged as one vector
            w.grad = torch.zeros_like(w)
        first, rest = list(self.model.weights)[:1], list(self.model.weights)[1:]
        groups = [{"params": first, "weight_decay": cfg.weight_decay}] + ([{"params": rest, "weight_decay": 0.0}] if rest else [])
        self.opt = torch.optim.Adam(groups, lr=cfg.lr)
        slow_rank, factor = parse_straggler(cfg.straggler)
        self.slowdown = factor if slow_rank == rank else 1.0
        self.steps = 0
        self.prefetch = ThreadPoolExecutor(1, thread_name_prefix="prefetch")  # builds leased batches ahead
        self.ahead: tuple[tuple[int, int], Future] | None = None  # ((epoch, batch), its build)

    def run(self) -> int:
        """Train until the coordinator says stop; return the number of batches this worker trained."""
        epoch, trained, first = 1, 0, None
        self.client.ask("hello")  # everyone starts together
        with self.prefetch:
            while epoch:
                log = EpochLog()
                batches = self._gossip_epoch(epoch, log, first) if self.cfg.mode == "gossip" else self._allreduce_epoch(epoch, log)
                trained += batches
                params = torch.nn.utils.parameters_to_vector(self.model.parameters()).detach().cpu().numpy()
                reply = self.client.ask("epoch_end", {"epoch": epoch, "loss_sum": log.loss_sum, "count": log.count,
                                                      "batches": batches, "tasks": log.tasks}, {"params": params})
                avg = torch.from_numpy(np.array(reply.tensors["params"])).to(self.device)
                torch.nn.utils.vector_to_parameters(avg, self.model.parameters())
                epoch, first = reply["next"], reply.get("batch")
        return trained

    # --- one batch ---------------------------------------------------------------------------------

    def _build(self, epoch: int, index: int) -> tuple[Batch, float]:
        """Batch ``index`` of ``epoch`` and the seconds it took to build (the straggler's sleep counts them)."""
        t0 = time.perf_counter()
        return self.batches.batch(epoch, index), time.perf_counter() - t0

    def _gradient(self, epoch: int, index: int, built: tuple[Batch, float], log: EpochLog) -> None:
        """Forward and backward on batch ``index``; ``.grad`` of each weight holds the result."""
        t0, c0 = time.time(), time.perf_counter()
        b, build_s = built
        self.model.train()
        self.opt.zero_grad(set_to_none=False)
        self.steps += 1
        logits = self.model(b.adj, b.x, self.steps)
        n = int(b.train.sum())
        if n:
            loss = F.cross_entropy(logits[b.train], b.y[b.train])
            loss.backward()
            log.loss_sum += loss.item() * n
            log.count += n
        if self.slowdown > 1.0:  # --straggler: this worker's compute takes FACTOR times as long
            time.sleep((self.slowdown - 1.0) * (build_s + time.perf_counter() - c0))
        log.task("batch", epoch, self.rank, t0, batch=index, nodes=len(b.nodes), train_nodes=n)

    def _grads(self) -> torch.Tensor:
        return torch.cat([w.grad.reshape(-1) for w in self.model.weights]).to(self.comm_device)

    def _set_grads(self, flat: torch.Tensor) -> None:
        flat = flat.to(self.device)
        at = 0
        for w in self.model.weights:
            w.grad.copy_(flat[at:at + w.numel()].view_as(w))
            at += w.numel()

    # --- the two modes -----------------------------------------------------------------------------

    def _gossip_epoch(self, epoch: int, log: EpochLog, first: int | None) -> int:
        """Train pool batches until the pool is drained; return how many.

        At a gossip point the pair request reports the batch just trained and its answer leases the next,
        which is built on the prefetch thread while the gradients are exchanged. Once the pool is empty
        an answer also names this worker's first batch of the next epoch (``ahead``), built while the
        epoch ends; the next epoch's ``model`` answer leases it (``first``).
        """
        done, finished, index = 0, None, first
        while True:
            if index is None:
                reply = self.client.ask("claim", {"epoch": epoch, "finished": finished})
                self._build_ahead(epoch + 1, reply.get("ahead"))
                if reply.op == "drained":
                    return done
                index = reply["batch"]
            finished = None
            self._gradient(epoch, index, self._built(epoch, index), log)
            done += 1
            if self.steps % self.cfg.gossip_every == 0:
                t0 = time.time()
                pair = self.client.ask("pair", {"epoch": epoch, "finished": index})
                index = pair["batch"]
                self._build_ahead(epoch, index)
                self._build_ahead(epoch + 1, pair.get("ahead"))
                partner = pair["partner"]
                if partner >= 0:
                    mine = self._grads()
                    self._set_grads((mine + exchange(mine, partner, pair["round"] % (1 << 20))) / 2)
                log.task("gossip", epoch, self.rank, t0, partner=partner)
            else:
                finished, index = index, None
            self.opt.step()

    def _allreduce_epoch(self, epoch: int, log: EpochLog) -> int:
        """Train this worker's share of the epoch's batches (dealt round-robin), one all-reduce per step.

        Each next batch, and the next epoch's first, is built while the all-reduce (or the epoch's end)
        waits, as gossip builds its next batch during its exchange.
        """
        mine = list(range(self.rank, self.batches.batches_per_epoch, self.world))
        steps = -(-self.batches.batches_per_epoch // self.world)
        for s in range(steps):
            if s < len(mine):
                self._gradient(epoch, mine[s], self._built(epoch, mine[s]), log)
                self._build_ahead(epoch, mine[s + 1] if s + 1 < len(mine) else None)
                flat = torch.cat([self._grads(), torch.ones(1, device=self.comm_device)])
            else:  # this worker has no batch left this step: it adds nothing but still takes part
                flat = torch.zeros(sum(w.numel() for w in self.model.weights) + 1, device=self.comm_device)
            t0 = time.time()
            dist.all_reduce(flat)
            log.task("allreduce", epoch, self.rank, t0)
            self._set_grads(flat[:-1] / flat[-1])
            self.opt.step()
        self._build_ahead(epoch + 1, mine[0] if mine else None)
        return len(mine)

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
