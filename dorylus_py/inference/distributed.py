"""Predictions through the graph servers, for a prepared store: the training pipeline's evaluation forward
alone (``JobSpec.forward_only``), one epoch, no gradients, no weight updates.

The weight servers start from the trained weights as from a checkpoint (zero Adam state) at version 1,
the version a synchronous epoch 1 evaluates with; each graph server runs the evaluation stages of the
model's stage list over its partition and sends the driver its vertices' logits and last hidden layer
(``outputs``), which are put back in the dataset's vertex order. Everything else (starting the
processes, hello, start, heartbeats, stopping them) is the training driver's (``cluster/``).
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path

import numpy as np

from dorylus_py.cluster.driver_link import DriverLink, ServerLost
from dorylus_py.cluster.launcher import JobPlan, _Run
from dorylus_py.config import TrainConfig
from dorylus_py.errors import ConfigError, DorylusError
from dorylus_py.inference.predict import Predictions, check_fits
from dorylus_py.inference.trained import TrainedModel
from dorylus_py.partition.store import PartitionStore
from dorylus_py.protocol import ProtocolError

BACKENDS = ("local", "cpu")  # where the tensor work of a forward through the graph servers runs


def forward_config(trained: TrainedModel, store: str, backend: str) -> TrainConfig:
    """The run's model settings on ``backend``, as one synchronous epoch over ``store``'s partitions."""
    if backend not in BACKENDS:
        raise ConfigError(f"--backend must be one of {', '.join(BACKENDS)} for predict, got {backend!r}")
    model = {k: getattr(trained.config, k) for k in ("model", "layers", "hidden", "heads", "out_heads",
                                                     "negative_slope", "seed", "threads")}
    cfg = TrainConfig(**model, data=store, backend=backend, mode="sync", epochs=1, fuse="off",
                      graph_servers=PartitionStore.open(store).num_parts, checkpoint_every=0)
    cfg.check()
    cfg.check_devices_here()
    return cfg


def checkpoint_of(trained: TrainedModel) -> dict[str, np.ndarray]:
    """The trained weights as a checkpoint the weight servers start from: version 1, zero Adam state."""
    state: dict[str, np.ndarray] = {"epoch": np.array(0, np.int64)}
    for name, w in trained.weights.items():
        state |= {f"{name}:W": w, f"{name}:adam_m": np.zeros_like(w), f"{name}:adam_v": np.zeros_like(w),
                  f"{name}:adam_step": np.array(0, np.int64), f"{name}:version": np.array(1, np.int64)}
    return state


def predict_distributed(trained: TrainedModel, store: str, backend: str = "local", embeddings: bool = False,
                        graph=None) -> Predictions:
    """``trained``'s outputs for every vertex of the prepared ``store``, through its graph servers; ``graph``:
    the store put back together, if already read (for the labels and masks of ``Predictions``)."""
    graph = graph if graph is not None else PartitionStore.open(store).assemble()
    check_fits(trained, graph)
    if embeddings and trained.spec.num_layers < 2:
        raise ConfigError(f"--embeddings: the model in {trained.run_dir} has 1 layer, so no hidden layer")
    cfg = forward_config(trained, store, backend)
    plan = JobPlan.of(cfg, store, trained.feature_norm, cfg.weight_servers)
    plan = dataclasses.replace(plan, spec=dataclasses.replace(plan.spec, forward_only=True))
    logs = Path(tempfile.mkdtemp(prefix="dorylus-predict-"))
    link = DriverLink(logs, None, cfg.hang_timeout_s)
    try:
        run = _Run(cfg, plan, None, str(logs), None, checkpoint_of(trained), False)
        run.start(link)
        parts = _collect(link, plan.graph_servers, cfg.wait_timeout_s)
    except ServerLost as e:
        raise DorylusError(f"{e}; predict stops (server logs in {logs / 'logs'})") from None
    finally:
        link.stop()
    shutil.rmtree(logs, ignore_errors=True)
    logits, hidden = assemble(parts, graph.num_nodes, trained.num_classes)
    return Predictions(graph, np.arange(graph.num_nodes, dtype=np.int64), logits, hidden if embeddings else None)


def _collect(link: DriverLink, graph_servers: int, wait_s: float) -> list[dict[str, np.ndarray]]:
    """Every graph server's ``outputs``, until each has said it finished."""
    parts: dict[str, dict] = {}
    finished: set[str] = set()
    while len(finished) < graph_servers:
        name, msg = link.recv(wait_s)
        if not name or not name.startswith("graph-server-"):
            continue
        if msg.op == "outputs":
            if name in parts:
                link.rejections.add("invalid", ProtocolError(f"a second outputs message from {name}"))
                continue
            parts[name] = dict(msg.tensors)
        elif msg.op == "epoch_stats" and msg.get("finished") is True:
            finished.add(name)
    missing = sorted(f"graph-server-{k}" for k in range(graph_servers) if f"graph-server-{k}" not in parts)
    if missing:
        raise DorylusError(f"{', '.join(missing)} finished without sending its outputs")
    return list(parts.values())


def assemble(parts: list[dict[str, np.ndarray]], n: int, classes: int) -> tuple[np.ndarray, np.ndarray | None]:
    """The graph servers' rows in vertex order, checked: every vertex exactly once, the widths agreed."""
    logits = np.zeros((n, classes), np.float32)
    hidden = None
    seen = np.zeros(n, np.int64)
    for part in parts:
        ids, rows = np.asarray(part.get("ids")), np.asarray(part.get("logits"))
        if ids.ndim != 1 or ids.dtype != np.int64 or rows.shape != (len(ids), classes) or \
                (len(ids) and (ids.min() < 0 or ids.max() >= n)):
            raise ProtocolError(f"outputs of {len(ids)} vertices do not fit a graph of {n} vertices and {classes} classes")
        np.add.at(seen, ids, 1)
        logits[ids] = rows
        if "embeddings" in part:
            emb = np.asarray(part["embeddings"])
            if emb.ndim != 2 or len(emb) != len(ids) or (hidden is not None and emb.shape[1] != hidden.shape[1]):
                raise ProtocolError(f"embeddings of shape {emb.shape} for {len(ids)} vertices")
            hidden = np.zeros((n, emb.shape[1]), np.float32) if hidden is None else hidden
            hidden[ids] = emb
    if not (seen == 1).all():
        raise ProtocolError(f"the graph servers' outputs cover {int((seen > 0).sum())} of {n} vertices, "
                            f"{int((seen > 1).sum())} more than once")
    return logits, hidden
