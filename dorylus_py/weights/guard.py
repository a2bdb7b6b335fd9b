"""Which gradients a weight store takes (issue 52): a key of an epoch its layer can be in, and values
that one Adam step survives and that are not orders of magnitude above what the job's chunks send.

**The key window** (:class:`KeyWindow`, one per layer). A graph server starts a chunk's epoch ``e``
only while every chunk of the job is at ``e - S`` or later (the staleness bound,
``pipeline/chunks.py``; in sync mode every epoch trains on the last one's update, so ``S = 0``). So
when a gradient of epoch ``e`` is sent, every chunk has sent its gradients of the epochs before
``e - S``. The layer *is in* the epoch of its furthest-behind chunk: the first epoch whose gradient of
that chunk has not come. A key up to ``S + SLACK_EPOCHS`` epochs past it is taken (``SLACK_EPOCHS``:
gradients still on their way from another graph server); a later one, or one of an epoch before this
start's first, names no task a graph server can have issued and is refused (issue 52: keys of epoch 25
sent at epoch 7 were taken, and the real ones dropped as duplicates). Every key below the layer's
epoch has come already, so a copy of one is a duplicate.

**The values** (:class:`ScaleGuard`, one per layer), once the key is known to be new:

- *Adam's step must stay finite*: a value ``g`` enters Adam's second moment as ``g * g`` in float32,
  which overflows past 1.8e19 (values of 1e30 passed the finiteness check, made the second moment
  ``inf`` and every later step zero: training froze). An epoch's sum adds ``expected`` gradients, so
  each value must be at most ``sqrt(float32 max) / (2 x expected)``.
- *The norm must be within* ``SCALE_FACTOR`` *of the running scale*: per block, each chunk's last
  ``HISTORY`` accepted gradient norms are kept and the chunk's scale is their lower median (a majority
  of them must have grown before it grows, so one accepted large gradient does not lift the bound for
  the next); the block's scale is the largest chunk's (chunks differ by orders of magnitude, or are
  exactly zero: on 2 graph servers of 2 chunks, Cora's 140 training vertices all lie in 2 of the 4
  chunks, and a chunk without training vertices sends a zero gradient for the last layer), floored at ``FLOOR`` x the layer's largest block
  scale (a block whose gradients were all zero, its units dead, may come back to life). A gradient
  above ``SCALE_FACTOR`` x that would blow Adam's second moment up as well: a step scales by
  ``1/sqrt(v)``, so one gradient ``r`` times the usual slows the steps after it about ``r / 30``-fold
  for hundreds of steps. The rule applies once every chunk of the job has sent the layer a gradient in
  this start (before that, only the finiteness of the step bounds one). On 15 genuine runs (GCN, GAT,
  GraphSAGE, sync and async; docs/architecture.md, Security) the largest gradient was 13.7x its scale.

A refused key is *taken* with no effect (the store marks it come, so an epoch's update is not waited
for forever, and adds nothing for it): :class:`GradientRefused`.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from dorylus_py.errors import DorylusError

SLACK_EPOCHS = 2  # past S: gradients of the epochs before still on their way from another graph server
SCALE_FACTOR = 1e3  # a gradient's norm over its block's running scale that is refused
HISTORY = 5  # accepted norms kept per chunk and block: its scale is their lower median
FLOOR = 1e-3  # a block's scale is at least this much of its layer's largest block's
ADAM_LIMIT = math.sqrt(float(np.finfo(np.float32).max)) / 2  # a summed value whose square float32 holds, halved


class KeyRefused(DorylusError):
    """A gradient key outside its layer's window: nothing of it is taken."""


class GradientRefused(DorylusError):
    """A gradient of a new key refused for its values: the key is taken, the gradient has no effect."""


@dataclass(frozen=True)
class WindowSpec:
    """A job's key window: its graph servers' chunk counts, this start's first epoch, the staleness bound
    (0 in sync mode)."""

    chunk_counts: tuple[int, ...]
    first: int
    staleness: int

    def for_layer(self) -> "KeyWindow":
        return KeyWindow(self.chunk_counts, self.first, self.staleness + SLACK_EPOCHS)


class KeyWindow:
    """The epochs one layer takes gradients of: up to ``ahead`` past the epoch its furthest-behind chunk
    is in, from ``first`` (this start's first epoch) on."""

    def __init__(self, chunk_counts: tuple[int, ...], first: int, ahead: int):
        self.first, self.ahead = first, ahead
        self.next = {(s, c): first for s, n in enumerate(chunk_counts) for c in range(n)}  # first not come
        self.early: set[tuple[int, int, int]] = set()  # keys come before an earlier one of their chunk
        self.furthest = 0  # the most epochs a taken key was past the layer's epoch (the end log line)

    @property
    def epoch(self) -> int:
        """The epoch the layer is in: its furthest-behind chunk's first epoch whose gradient has not come."""
        return min(self.next.values())

    def check(self, key: tuple[int, int, int]) -> None:
        epoch, server, chunk = key
        if (server, chunk) not in self.next:
            raise KeyRefused(f"gradient key {list(key)}: no chunk {chunk} of graph server {server} in this job")
        if epoch < self.first:
            raise KeyRefused(f"gradient key {list(key)}: epoch {epoch} is before this start's first, {self.first}")
        if epoch > self.epoch + self.ahead:
            raise KeyRefused(f"gradient key {list(key)}: epoch {epoch} is more than {self.ahead} past the epoch "
                               f"the layer is in ({self.epoch}); no graph server can have run it yet")

    def came(self, key: tuple[int, int, int]) -> None:
        """``key`` was taken (applied or refused for its values)."""
        epoch, server, chunk = key
        self.furthest = max(self.furthest, epoch - self.epoch)
        self.early.add(key)
        while (self.next[(server, chunk)], server, chunk) in self.early:
            self.early.discard((self.next[(server, chunk)], server, chunk))
            self.next[(server, chunk)] += 1


class ScaleGuard:
    """One layer's running gradient scale per block (each chunk's recent accepted norms), and the rules above."""

    def __init__(self, blocks: list[str], expected: int):
        self.expected = expected
        self.norms: dict[str, dict[tuple[int, int], deque]] = {name: {} for name in blocks}  # block -> chunk -> norms
        self.worst = 0.0  # the largest ratio of a taken gradient's norm to its block's scale (the end log line)

    def scale(self, name: str) -> float:
        """A block's running scale: the largest chunk's lower median of its recent norms."""
        return max((sorted(seen)[(len(seen) - 1) // 2] for seen in self.norms[name].values()), default=0.0)

    def check(self, chunk: tuple[int, int], grads: dict[str, np.ndarray]) -> dict[str, float]:
        """The norm of each block's gradient, or :class:`GradientRefused`."""
        limit = ADAM_LIMIT / self.expected
        norms = {}
        for name, g in grads.items():
            top = float(np.abs(g).max()) if g.size else 0.0
            if top > limit:
                raise GradientRefused(f"{name}: a gradient value of {top:.3g}; {self.expected} such summed would "
                                      f"overflow Adam's second moment (at most {limit:.3g})")
            flat = g.ravel().astype(np.float64)
            norms[name] = math.sqrt(float(np.dot(flat, flat)))
        if any(len(seen) < self.expected for seen in self.norms.values()):
            return norms  # not every chunk has sent one yet: no scale to go by
        scales = {name: self.scale(name) for name in self.norms}
        floor = FLOOR * max(scales.values(), default=0.0)
        for name, norm in norms.items():
            scale = max(scales[name], floor)
            if norm > SCALE_FACTOR * scale:
                raise GradientRefused(f"{name}: gradient norm {norm:.3g} is over {SCALE_FACTOR:g} times the running "
                                      f"scale {scale:.3g} (of every chunk's recent ones)")
            if scale:
                self.worst = max(self.worst, norm / scale)
        return norms

    def came(self, chunk: tuple[int, int], norms: dict[str, float]) -> None:
        for name, norm in norms.items():
            self.norms[name].setdefault(chunk, deque(maxlen=HISTORY)).append(norm)
