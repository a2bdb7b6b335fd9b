"""Streaming inside a task (``--stream-rows``): which blocks of rows a task works on, and what it adds up.

A row-wise task (ApplyVertex forward and backward, the fused last layer, the loss, evaluation) gives
each row's outputs from that row's inputs alone, so it can run a block of rows at a time: the worker
computes on the first block while the others are still on the link, and sends each block's rows of
the result back while it computes the next (``handler._run_streamed``). What the whole chunk gives,
the weight gradients (``Pᵀ dZ``: a sum over rows), the loss sum and the correct counts, is added up
over the blocks and goes in the last message. Dropout masks are keyed by vertex id, so a block draws
exactly its rows of the chunk's mask, and a streamed result equals the whole-chunk one up to float
rounding (sums in another order, products of smaller blocks).

The graph server cuts a streamed task into parts, one ``task`` message each, sent together
(``graph_servers/server.py``); the worker answers each part (``task_runner.py``).
"""

from __future__ import annotations

import torch

MAX_BLOCKS = 64  # a task's parts all go out at once: they must fit the sockets' queues


def stream_spans(rows: int, block: int) -> list[tuple[int, int]]:
    """Rows ``[lo, hi)`` of each block of a chunk of ``rows`` rows cut into blocks of ``block`` rows,
    or an empty list when it is not streamed (``block`` 0, or a chunk that fits in one block). Blocks
    grow past the size asked where it would make more than ``MAX_BLOCKS``."""
    if not block or rows <= block:
        return []
    block = max(block, -(-rows // MAX_BLOCKS))
    return [(lo, min(lo + block, rows)) for lo in range(0, rows, block)]


class Totals:
    """The sums over a streamed task's blocks: tensors (weight gradients) and fields (``loss_sum``, a
    number; ``correct``, a list of counts)."""

    def __init__(self):
        self.tensors: dict[str, torch.Tensor] = {}
        self.fields: dict = {}

    def add(self, tensors: dict[str, torch.Tensor], fields: dict) -> None:
        for k, v in tensors.items():
            self.tensors[k] = self.tensors[k] + v if k in self.tensors else v
        for k, v in fields.items():
            if k not in self.fields:
                self.fields[k] = v
            elif isinstance(v, list):
                self.fields[k] = [a + b for a, b in zip(self.fields[k], v)]
            else:
                self.fields[k] = self.fields[k] + v

    def result(self) -> tuple[dict[str, torch.Tensor], dict]:
        return self.tensors, self.fields
