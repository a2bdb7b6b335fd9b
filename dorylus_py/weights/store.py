"""The weight server's state, without sockets: versioned weights, gradient accumulation, Adam.

A store holds named arrays (this server's row blocks of the model's tensors, ``weights/blocks.py``),
each belonging to a layer; a layer's arrays are pulled, updated and versioned together. Version ``v``
of a layer is its weights after ``v`` updates. With ``update="epoch"`` the store sums
``expected`` chunk gradients (an epoch's worth: every chunk of every graph server), in the order of
their keys so that the sum does not depend on the order they came in, then takes one Adam step: in sync mode that is exactly full-batch training; in async mode the gradients may come
from different epochs, and the step is taken as soon as the last one arrives, with no barrier. With
``update="chunk"`` it takes one step per chunk gradient as it arrives. **Stashing**: a forward pull may *hold* the version
it got under a task key; the chunk's backward pulls that same version, and its gradient push releases
the hold; versions older than the newest are freed once no chunk holds them. Every gradient carries a
key ``(epoch, server, chunk)``; a key seen before is a duplicate (a relaunched task) and is ignored,
so no gradient is ever applied twice. A new key must lie in its layer's window, and its values must pass
the scale rules (``guard.py``): a key outside is refused with nothing taken; values that fail are
refused with the key taken and nothing added (an epoch's update then sums the others; with ``chunk``
updates the version moves on unchanged), so the updates still count one per key.

**Stale steps** (``stale_step``, async): a gradient computed at version ``v`` when the newest is ``v + d``
is ``d`` updates stale. ``inverse`` multiplies it by ``1/(d+1)`` before it enters its update or its
epoch's sum (Zhang et al. 2016's staleness-aware SGD; Adam's moments see the scaled gradient);
``inverse-lr`` leaves the gradient (and the moments) as it is and divides the step's learning rate by
``d + 1``, ``d`` the mean over the step's gradients (Adam divides a gradient's scale out of its step,
so only the first weighs a stale gradient against a fresh one of the same sum).

**Predicted weights** (``predict``, async): a training task of epoch ``e`` would train on version
``(e - 1) x updates per epoch`` in sync mode; when the version it pulls is ``d`` updates behind that (its
chunk ran ahead of the last epoch's gradients), it gets ``W_v + d (W_v - W_(v-1))``, the weights
extrapolated along the last update (SpecTrain, PipeMare: Adam's steps change slowly from one to the
next). The prediction is a function of ``(v, e)``, so the backward of a stashed version gets the same
arrays as its forward; the gradient is applied to the real weights; only the last update is kept per
version for it.

**Epoch snapshots**: at every version that ends an epoch's worth of updates (every version with epoch
updates, every ``updates_per_epoch``-th with chunk updates) the store keeps a copy of the weights and
Adam's state: the newest ``keep`` of them, and every one the driver has not yet released (it
releases each epoch once recorded). A checkpoint or the best epoch's weights are read from
them, so every layer is taken at the same epoch even while training has moved on (a consistent
checkpoint without stopping anyone).
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field

import numpy as np

from dorylus_py.errors import DorylusError
from dorylus_py.weights.adam import AdamParam, adam_step
from dorylus_py.weights.guard import GradientRefused, KeyWindow, ScaleGuard, WindowSpec


class WeightError(DorylusError):
    """A request the weight store cannot serve (unknown layer, freed version, shape mismatch)."""


class VersionFreed(WeightError):
    """A pull of a version freed since: a race an async job with several weight servers meets (the lead
    answered a version that another server has let go already), not a sign of a hostile peer."""


MAX_SNAPSHOTS = 64  # per layer: the most a driver that does not release them can make a weight server keep
STALE_STEPS = ("none", "inverse", "inverse-lr")  # as sections.py lists them (the Lambda's image holds no settings)
STATE_FIELDS = ("W", "adam_m", "adam_v", "adam_step", "version")  # what a checkpoint keeps per array


@dataclass
class _Layer:
    params: dict[str, AdamParam]  # this server's arrays of the layer, by name, with their Adam state
    versions: dict[int, dict[str, np.ndarray]]  # version -> arrays, what is still held or newest
    scale: ScaleGuard  # the running gradient scale of each array (guard.py)
    window: KeyWindow | None = None  # the epochs whose keys it takes (guard.py); None: any
    holds: dict[int, set] = field(default_factory=lambda: defaultdict(set))  # version -> task keys
    pending: dict = field(default_factory=dict)  # epoch updates: gradient key -> gradients (None: refused), until the step
    lags: dict = field(default_factory=dict)  # epoch updates: gradient key -> its staleness d, until the step
    seen: set = field(default_factory=set)  # gradient keys ever applied or accumulated
    deltas: dict = field(default_factory=dict)  # predict: version -> {name: W_v - W_(v-1)}, while v is kept
    version: int = 0
    snapshots: OrderedDict = field(default_factory=OrderedDict)  # version -> state at an epoch boundary


class WeightStore:
    def __init__(
        self,
        weights: dict[int, dict[str, np.ndarray]],
        lr: float,
        weight_decay: dict[str, float],
        update: str = "epoch",
        expected: int = 1,
        keep: int = 4,
        stale_step: str = "none",
        predict: bool = False,
        window: WindowSpec | None = None,
    ):
        """``weights``: layer -> {name: initial array} (this server's blocks); ``weight_decay``: name -> L2
        coefficient (absent: 0). ``expected``: gradients per ``epoch`` update (all chunks of all graph
        servers). ``keep``: epoch snapshots kept per layer. ``stale_step``: ``none``, ``inverse`` or
        ``inverse-lr`` (above). ``window``: the job's key window (``guard.py``; None: keys of any epoch)."""
        if update not in ("epoch", "chunk"):
            raise ValueError(f"update must be 'epoch' or 'chunk', not {update!r}")
        self.update = update
        if stale_step not in STALE_STEPS:
            raise ValueError(f"stale_step must be one of {STALE_STEPS}, not {stale_step!r}")
        self.stale_step = stale_step
        self.predict = predict
        self.expected = expected
        self.keep = keep
        self.released = -1  # the driver has recorded every epoch up to this version (see release)
        self.lr = lr
        self.updates_per_epoch = expected if update == "chunk" else 1
        self.layers: dict[int, _Layer] = {}
        for layer, arrays in sorted(weights.items()):
            ps = {name: AdamParam(np.array(w, dtype=np.float32), weight_decay.get(name, 0.0))
                  for name, w in sorted(arrays.items())}
            self.layers[layer] = _Layer(ps, {0: _weights(ps)}, ScaleGuard(list(ps), expected),
                                        None if window is None else window.for_layer())
        self.updates = 0
        self.predicted = 0  # pulls answered with predicted weights
        for layer in self.layers:
            self._snapshot(layer)

    def latest(self, layer: int) -> int:
        return self._layer(layer).version

    def pull(self, layer: int, version: int | None = None, hold: tuple | None = None,
             epoch: int | None = None) -> tuple[int, dict] | None:
        """The layer's arrays at ``version`` (newest if None); None while that version does not exist yet.
        ``epoch``: a training task's, whose weights are predicted when the store predicts (above)."""
        st = self._layer(layer)
        v = st.version if version is None else version
        self._not_too_far(layer, v)
        if v > st.version:
            return None
        if v not in st.versions:
            if hold is None and v in st.snapshots:  # an older epoch's weights (best epoch, early stop)
                return v, {name: st.snapshots[v][f"{name}:W"] for name in st.params}
            raise VersionFreed(f"layer {layer} version {v} was freed (newest is {st.version})")
        if hold is not None:
            if tuple(hold) in st.seen:  # its gradient is in: nothing would ever release the hold
                raise WeightError(f"layer {layer}: hold {list(hold)} names a task whose gradient came already")
            st.holds[v].add(tuple(hold))
        ahead = self.ahead(v, epoch) if self.predict and epoch is not None else 0
        if ahead and v in st.deltas:
            self.predicted += 1
            return v, {n: w + np.float32(ahead) * st.deltas[v][n] for n, w in st.versions[v].items()}
        return v, st.versions[v]

    def ahead(self, version: int, epoch: int) -> int:
        """How many updates ``version`` is behind the one a training task of ``epoch`` would use in sync
        mode (every update of the epochs before it); never more than the store can be ahead."""
        return max(0, min((epoch - 1) * self.updates_per_epoch - version, self.keep * self.updates_per_epoch))

    def push(self, layer: int, version: int, key: tuple, grads: dict[str, np.ndarray]) -> bool:
        """Add a chunk's gradient (one array per array of the layer here); False when ``key`` was seen
        before (a duplicate, ignored). Other names or shapes, or a key outside the layer's window, raise
        (nothing taken); values the scale rules refuse raise :class:`GradientRefused`, the key taken."""
        st = self._layer(layer)
        key = tuple(key)
        if set(grads) != set(st.params):
            raise WeightError(f"layer {layer}: gradients for {sorted(grads)}, expected {sorted(st.params)}")
        for name, grad in grads.items():
            if grad.shape != st.params[name].w.shape:
                raise WeightError(f"{name}: gradient shape {list(grad.shape)} != weights {list(st.params[name].w.shape)}")
        if key in st.seen:
            return False
        if st.window is not None:
            st.window.check(key)
        try:
            norms = st.scale.check(key[1:], grads)
        except GradientRefused:
            self._take(layer, version, key, None)
            raise
        st.scale.came(key[1:], norms)
        self._take(layer, version, key, grads)
        return True

    def _take(self, layer: int, version: int, key: tuple, grads: dict[str, np.ndarray] | None) -> None:
        """A new key's gradients (None: refused, they count as come and add nothing) into the layer's update."""
        st = self.layers[layer]
        st.seen.add(key)
        if st.window is not None:
            st.window.came(key)
        self._release(st, version, key)
        lag = max(st.version - int(version), 0)
        g = None if grads is None else {name: np.array(grad, dtype=np.float32) for name, grad in grads.items()}
        if g is not None and self.stale_step == "inverse" and lag:
            g = {name: grad * np.float32(1 / (lag + 1)) for name, grad in g.items()}
        if self.update == "chunk":
            self._step(layer, g, lag if self.stale_step == "inverse-lr" else 0)
            return
        st.pending[key], st.lags[key] = g, lag
        if len(st.pending) < self.expected:
            return
        # summed in key order (the same bits whatever the arrival order); a refused key adds nothing
        order = [k for k in sorted(st.pending) if st.pending[k] is not None]
        total = None
        if order:
            total = {n: st.pending[order[0]][n].copy() for n in st.params}
            for k in order[1:]:
                for n in st.params:
                    total[n] += st.pending[k][n]
        mean_lag = sum(st.lags[k] for k in order) / len(order) if order and self.stale_step == "inverse-lr" else 0
        self._step(layer, total, mean_lag)
        st.pending.clear()
        st.lags.clear()

    def pushed(self, layer: int, key: tuple) -> bool:
        """Whether the gradient of ``key`` has come for ``layer`` (its holds are released)."""
        return tuple(key) in self._layer(layer).seen

    def state(self, layer: int, version: int | None = None) -> dict[str, np.ndarray] | None:
        """What a checkpoint keeps of ``layer`` at ``version`` (an epoch boundary; None: the newest
        one): ``NAME:FIELD`` for each array here and each of :data:`STATE_FIELDS` (weights, Adam's
        moments and step, the version). None while that version is to come."""
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
        snap = {}
        for name, p in st.params.items():
            snap |= {f"{name}:W": p.w, f"{name}:adam_m": p.m, f"{name}:adam_v": p.v,
                     f"{name}:adam_step": np.array(float(p.step), np.float64),
                     f"{name}:version": np.array(st.version, np.int64)}
        st.snapshots[st.version] = snap
        self._prune(st)

    def release(self, version: int) -> None:
        """The driver has recorded every epoch up to ``version``: snapshots before it may go (the
        newest ``keep`` always stay). Until then they are kept, so a driver that falls behind the
        training (a loaded machine) still finds the epoch it asks for, up to ``MAX_SNAPSHOTS``."""
        self.released = max(self.released, version)
        for st in self.layers.values():
            self._prune(st)

    def _prune(self, st: _Layer) -> None:
        while len(st.snapshots) > self.keep and (next(iter(st.snapshots)) < self.released
                                                 or len(st.snapshots) > MAX_SNAPSHOTS):
            st.snapshots.popitem(last=False)

    def restore(self, layer: int, state: dict[str, np.ndarray]) -> None:
        """Continue from a checkpoint (``NAME:FIELD`` arrays, as :meth:`state` gives them): weights,
        Adam's moments and step, and the version count."""
        st = self._layer(layer)
        missing = [f"{n}:{f}" for n in st.params for f in STATE_FIELDS if f"{n}:{f}" not in state]
        if missing:
            raise WeightError(f"layer {layer}: the checkpoint lacks {', '.join(missing[:4])}")
        versions = {int(state[f"{n}:version"]) for n in st.params}
        if len(versions) != 1:
            raise WeightError(f"layer {layer}: the checkpoint's arrays are at different versions {sorted(versions)}")
        for name, p in st.params.items():
            arrays = [np.array(state[f"{name}:{f}"], dtype=np.float32) for f in ("W", "adam_m", "adam_v")]
            if any(a.shape != p.w.shape for a in arrays):
                raise WeightError(f"{name}: checkpoint arrays {[list(a.shape) for a in arrays]} != model {list(p.w.shape)}")
            p.w, p.m, p.v = arrays
            p.step = int(state[f"{name}:adam_step"])
        st.version = versions.pop()
        st.versions = {st.version: _weights(st.params)}
        st.snapshots.clear()
        self._snapshot(layer)

    def held_versions(self, layer: int) -> list[int]:
        return sorted(self._layer(layer).versions)

    def _step(self, layer: int, grads: dict[str, np.ndarray] | None, lag: float = 0) -> None:
        """One Adam step (``grads`` None: every gradient of it was refused, and the version moves on with
        the weights as they are); ``lag``: the gradients' staleness the learning rate is divided by (``inverse-lr``)."""
        st = self.layers[layer]
        lr = self.lr / (lag + 1) if lag else self.lr
        before = _weights(st.params)
        if grads is not None:
            for name, p in st.params.items():
                adam_step(p, grads[name], lr)
        st.version += 1
        st.versions[st.version] = _weights(st.params)
        if self.predict:
            st.deltas[st.version] = {n: st.params[n].w - w for n, w in before.items()}
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
            st.deltas.pop(v, None)

    def _layer(self, layer: int) -> _Layer:
        try:
            return self.layers[layer]
        except KeyError:
            raise WeightError(f"layer {layer} is not held by this weight server") from None


def _weights(params: dict[str, AdamParam]) -> dict[str, np.ndarray]:
    """The arrays of one version (Adam replaces ``w`` on every step, so no copy is needed)."""
    return {name: p.w for name, p in params.items()}
