"""The weight server's state, without sockets: versioned weights, gradient accumulation, Adam.

Version ``v`` of a layer is its weights after ``v`` updates. With ``update="epoch"`` the store sums
``expected`` chunk gradients (an epoch's worth: every chunk of every graph server), in the order of
their keys so that the sum does not depend on the order they came in, then takes one Adam step: in sync mode that is exactly full-batch training; in async mode the gradients may come
from different epochs, and the step is taken as soon as the last one arrives, with no barrier. With
``update="chunk"`` it takes one step per chunk gradient as it arrives. **Stashing**: a forward pull may *hold* the version
it got under a task key; the chunk's backward pulls that same version, and its gradient push releases
the hold; versions older than the newest are freed once no chunk holds them. Every gradient carries a
key ``(epoch, server, chunk)``; a key seen before is a duplicate (a relaunched task) and is ignored,
so no gradient is ever applied twice.

**Epoch snapshots**: at every version that ends an epoch's worth of updates (every version with epoch
updates, every ``updates_per_epoch``-th with chunk updates) the store keeps a copy of the weights and
Adam's state, the newest ``keep`` of them. A checkpoint or the best epoch's weights are read from
them, so every layer is taken at the same epoch even while training has moved on (a consistent
checkpoint without stopping anyone).
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field

import numpy as np
import torch

from dorylus_py.errors import DorylusError


class WeightError(DorylusError):
    """A request the weight store cannot serve (unknown layer, freed version, shape mismatch)."""


@dataclass
class _Layer:
    param: torch.nn.Parameter
    versions: dict[int, np.ndarray]  # version -> weights, what is still held or newest
    holds: dict[int, set] = field(default_factory=lambda: defaultdict(set))  # version -> task keys
    pending: dict = field(default_factory=dict)  # epoch updates: gradient key -> gradient, until the step
    seen: set = field(default_factory=set)  # gradient keys ever applied or accumulated
    version: int = 0
    snapshots: OrderedDict = field(default_factory=OrderedDict)  # version -> state at an epoch boundary


class WeightStore:
    def __init__(
        self,
        weights: dict[int, np.ndarray],
        lr: float,
        weight_decay: dict[int, float],
        update: str = "epoch",
        expected: int = 1,
        keep: int = 4,
    ):
        """``weights``: layer -> initial matrix (this server's shard). ``expected``: gradients per
        ``epoch`` update (all chunks of all graph servers). ``keep``: epoch snapshots kept per layer."""
        if update not in ("epoch", "chunk"):
            raise ValueError(f"update must be 'epoch' or 'chunk', not {update!r}")
        self.update = update
        self.expected = expected
        self.keep = keep
        self.updates_per_epoch = expected if update == "chunk" else 1
        self.layers: dict[int, _Layer] = {}
        params = []
        for layer, w in sorted(weights.items()):
            p = torch.nn.Parameter(torch.tensor(w, dtype=torch.float32))
            self.layers[layer] = _Layer(p, {0: p.detach().numpy().copy()})
            params.append({"params": [p], "weight_decay": weight_decay.get(layer, 0.0)})
        self.optimizer = torch.optim.Adam(params, lr=lr)
        self.updates = 0
        for layer in self.layers:
            self._snapshot(layer)

    def latest(self, layer: int) -> int:
        return self._layer(layer).version

    def pull(self, layer: int, version: int | None = None, hold: tuple | None = None) -> tuple[int, np.ndarray] | None:
        """Weights of ``version`` (newest if None); None while that version does not exist yet."""
        st = self._layer(layer)
        v = st.version if version is None else version
        self._not_too_far(layer, v)
        if v > st.version:
            return None
        if v not in st.versions:
            if hold is None and v in st.snapshots:  # an older epoch's weights (best epoch, early stop)
                return v, st.snapshots[v]["W"]
            raise WeightError(f"layer {layer} version {v} was freed (newest is {st.version})")
        if hold is not None:
            st.holds[v].add(tuple(hold))
        return v, st.versions[v]

    def push(self, layer: int, version: int, key: tuple, grad: np.ndarray) -> bool:
        """Add a chunk's gradient; False when ``key`` was seen before (a duplicate, ignored)."""
        st = self._layer(layer)
        key = tuple(key)
        if grad.shape != tuple(st.param.shape):
            raise WeightError(f"layer {layer}: gradient shape {list(grad.shape)} != weights {list(st.param.shape)}")
        if key in st.seen:
            return False
        st.seen.add(key)
        self._release(st, version, key)
        g = torch.from_numpy(np.array(grad, dtype=np.float32))
        if self.update == "chunk":
            self._step(layer, g)
        else:
            st.pending[key] = g
            if len(st.pending) == self.expected:  # summed in key order: the same bits whatever the arrival order
                self._step(layer, torch.stack([st.pending[k] for k in sorted(st.pending)]).sum(0))
                st.pending.clear()
        return True

    def state(self, layer: int, version: int | None = None) -> dict[str, np.ndarray] | None:
        """What a checkpoint keeps of ``layer`` at ``version`` (an epoch boundary; None: the newest
        one): weights, Adam's moments and step, the version. None while that version is to come."""
        st = self._layer(layer)
        v = next(reversed(st.snapshots)) if version is None else version
        self._not_too_far(layer, v)
        if v > st.version:
            return None
        if v not in st.snapshots:
            raise WeightError(f"layer {layer}: no epoch snapshot at version {v} (kept: {list(st.snapshots)})")
        return st.snapshots[v]

    def _not_too_far(self, layer: int, version: int) -> None:
        """A pull waits for a version to come, but not for one no run this size could reach soon."""
        ahead = self.keep * self.updates_per_epoch
        if not 0 <= version <= self.layers[layer].version + ahead:
            raise WeightError(f"layer {layer} version {version} is out of reach (newest {self.layers[layer].version})")

    def _snapshot(self, layer: int) -> None:
        st = self.layers[layer]
        if st.version % self.updates_per_epoch:
            return
        adam = self.optimizer.state.get(st.param, {})
        zeros = np.zeros(tuple(st.param.shape), np.float32)
        st.snapshots[st.version] = {
            "W": st.versions[st.version],
            "adam_m": adam["exp_avg"].numpy().copy() if "exp_avg" in adam else zeros,
            "adam_v": adam["exp_avg_sq"].numpy().copy() if "exp_avg_sq" in adam else zeros,
            "adam_step": np.array(float(adam.get("step", 0.0)), np.float64),
            "version": np.array(st.version, np.int64),
        }
        while len(st.snapshots) > self.keep:
            st.snapshots.popitem(last=False)

    def restore(self, layer: int, state: dict[str, np.ndarray]) -> None:
        """Continue from a checkpoint: weights, Adam's moments and step, and the version count."""
        st = self._layer(layer)
        w = torch.from_numpy(np.array(state["W"], dtype=np.float32))
        if tuple(w.shape) != tuple(st.param.shape):
            raise WeightError(f"layer {layer}: checkpoint weights {list(w.shape)} != model {list(st.param.shape)}")
        with torch.no_grad():
            st.param.copy_(w)
        self.optimizer.state[st.param] = {
            "step": torch.tensor(float(state["adam_step"]), dtype=torch.float32),
            "exp_avg": torch.from_numpy(np.array(state["adam_m"], dtype=np.float32)),
            "exp_avg_sq": torch.from_numpy(np.array(state["adam_v"], dtype=np.float32)),
        }
        st.version = int(state["version"])
        st.versions = {st.version: st.param.detach().numpy().copy()}
        st.snapshots.clear()
        self._snapshot(layer)

    def held_versions(self, layer: int) -> list[int]:
        return sorted(self._layer(layer).versions)

    def _step(self, layer: int, grad: torch.Tensor) -> None:
        st = self.layers[layer]
        for other in self.layers.values():
            other.param.grad = None
        st.param.grad = grad
        self.optimizer.step()  # only this layer has a gradient; Adam skips the others
        st.param.grad = None
        st.version += 1
        st.versions[st.version] = st.param.detach().numpy().copy()
        self.updates += 1
        self._snapshot(layer)
        self._free(st)

    def _release(self, st: _Layer, version: int, key: tuple) -> None:
        # every version the key holds: a relaunched forward may have pulled (and held) a newer one
        for holders in st.holds.values():
            holders.discard(key)
        self._free(st)

    @staticmethod
    def _free(st: _Layer) -> None:
        for v in [v for v in st.versions if v < st.version and not st.holds.get(v)]:
            del st.versions[v]
            st.holds.pop(v, None)

    def _layer(self, layer: int) -> _Layer:
        try:
            return self.layers[layer]
        except KeyError:
            raise WeightError(f"layer {layer} is not held by this weight server") from None
