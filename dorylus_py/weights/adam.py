"""Adam (Kingma & Ba, 2015) with L2 weight decay, as ``torch.optim.Adam`` computes it, element by element.

Written with plain numpy ufuncs (each one correctly rounded, none fused), so an element's update
depends only on that element: a tensor updated whole or as row blocks on several weight servers
gives the same bits (torch's kernels fuse multiply-adds in their vectorised body but not in its
tail, so where a block ends changes the last bit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass
class AdamParam:
    w: np.ndarray  # the weights (float32); replaced, never written in place (versions share them)
    decay: float  # L2 coefficient added to the gradient
    m: np.ndarray | None = None  # first moment
    v: np.ndarray | None = None  # second moment
    step: int = 0

    def __post_init__(self):
        self.m = np.zeros_like(self.w) if self.m is None else self.m
        self.v = np.zeros_like(self.w) if self.v is None else self.v


def adam_step(p: AdamParam, grad: np.ndarray, lr: float, betas=(0.9, 0.999), eps: float = 1e-8) -> None:
    """One step of ``p`` with gradient ``grad``; new arrays for ``w``, ``m``, ``v``."""
    b1, b2 = betas
    g = grad.astype(np.float32) + np.float32(p.decay) * p.w if p.decay else grad.astype(np.float32)
    p.step += 1
    p.m = p.m + np.float32(1 - b1) * (g - p.m)
    p.v = p.v * np.float32(b2) + np.float32(1 - b2) * (g * g)
    step_size = lr / (1 - b1**p.step)
    denom = np.sqrt(p.v) / np.float32(math.sqrt(1 - b2**p.step)) + np.float32(eps)
    p.w = p.w - np.float32(step_size) * (p.m / denom)
