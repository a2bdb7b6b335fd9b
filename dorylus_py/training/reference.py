"""The reference trainer: single-process, full-batch training of any model (GCN, GAT, GraphSAGE) in torch.

It is the correctness oracle of every distributed backend (sync mode must reproduce its per-epoch
loss), so it stays small and obviously right: one forward with dropout, softmax cross-entropy over
the train split, Adam with L2 weight decay on the tensors the model names (GCN: the first layer;
GAT and GraphSAGE: every weight but the biases), then one forward without dropout to measure
accuracy on each split.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from dorylus_py.config import TrainConfig
from dorylus_py.data.graph import Graph, row_normalized
from dorylus_py.errors import ConfigError
from dorylus_py.models import build_module, spec_of
from dorylus_py.progress import progress_bar
from dorylus_py.training.record import BestTracker, RunRecord, end_status, run_summary


def model_dims(cfg: TrainConfig, graph: Graph) -> list[int]:
    return cfg.widths(graph.num_features, graph.num_classes)


def resolve_feature_norm(cfg: TrainConfig, graph: Graph) -> str:
    """``auto`` becomes ``row`` for non-negative (bag-of-words-like) features, else ``none``."""
    return feature_norm_for(cfg.feature_norm, bool((graph.features >= 0).all()), graph.source)


def feature_norm_for(choice: str, non_negative: bool, source: str) -> str:
    """:func:`resolve_feature_norm` from what is known of the features (a prepared store's manifest)."""
    if choice == "row" and not non_negative:
        raise ConfigError(f"{source}: --feature-norm row needs non-negative features; use none")
    if choice == "auto":
        return "row" if non_negative else "none"
    return choice


def input_features(cfg: TrainConfig, graph: Graph) -> np.ndarray:
    """The features the first layer sees, after the configured normalisation."""
    return row_normalized(graph.features) if resolve_feature_norm(cfg, graph) == "row" else graph.features


def accuracy(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> float:
    """correct / count as a Python float (nan for an empty split): the ratio the distributed runs record,
    printed as it is (0.46, not float32's 0.46000000834)."""
    total = int(mask.sum())
    return int((logits[mask].argmax(dim=1) == labels[mask]).sum()) / total if total else float("nan")


@dataclass
class TrainResult:
    summary: dict  # what summary.json holds
    history: list[dict]  # the metrics.jsonl rows


def train_reference(
    graph: Graph, cfg: TrainConfig, record: RunRecord | None = None, show_progress: bool = True
) -> TrainResult:
    """Train on ``graph``; log each epoch to ``record`` (if given); return the summary and history."""
    cfg.check()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    spec = spec_of(cfg, model_dims(cfg, graph))
    model = build_module(spec, cfg.dropout, cfg.attention_dropout(), cfg.seed)
    adj = model.graph_input(graph)
    x = torch.from_numpy(np.ascontiguousarray(input_features(cfg, graph)))
    y = torch.from_numpy(graph.labels)
    masks = {s: torch.from_numpy(graph.mask(s)) for s in ("train", "val", "test")}
    train_idx = masks["train"].nonzero().squeeze(1)
    tensors = model.tensors()
    groups = [{"params": [tensors[t.name] for t in spec.tensors() if t.decay], "weight_decay": cfg.weight_decay},
              {"params": [tensors[t.name] for t in spec.tensors() if not t.decay], "weight_decay": 0.0}]
    opt = torch.optim.Adam([g for g in groups if g["params"]], lr=cfg.lr)

    best = BestTracker()
    start = time.perf_counter()
    bar = progress_bar(range(1, cfg.epochs + 1), desc="train", unit="epoch", enabled=show_progress)
    history: list[dict] = []
    try:
        for epoch in bar:
            t0 = time.perf_counter()
            model.train()
            opt.zero_grad(set_to_none=True)
            logits = model(adj, x, epoch)
            loss = F.cross_entropy(logits[train_idx], y[train_idx])
            loss.backward()
            opt.step()
            model.eval()
            with torch.no_grad():
                logits = model(adj, x)
            acc = {s: accuracy(logits, y, m) for s, m in masks.items()}
            now = time.perf_counter()
            row = {
                "epoch": epoch,
                "loss": loss.item(),
                "train_acc": acc["train"],
                "val_acc": acc["val"],
                "test_acc": acc["test"],
                "epoch_s": now - t0,
                "wall_s": now - start,
            }
            history.append(row)
            if best.update(epoch, acc["val"], acc["test"]) and record is not None:
                record.keep_best_weights(model_weights(model))
            if record is not None:
                record.log_epoch(row)
            bar.set_postfix(loss=f"{row['loss']:.4f}", val=f"{acc['val']:.3f}", refresh=False)
            if cfg.target_acc and acc["val"] >= cfg.target_acc:
                break
    except BaseException as e:
        bar.close()
        if record is not None:
            record.abort(end_status(e), backend=cfg.backend, job_s=time.perf_counter() - start)
        raise
    bar.close()

    summary = run_summary(history, best, time.perf_counter() - start, backend=cfg.backend)
    if record is not None:
        record.save_weights("weights.npz", model_weights(model))
        summary = record.finish(summary)
    return TrainResult(summary, history)


def model_weights(model) -> dict[str, np.ndarray]:
    """A model's weights as ``weights.npz`` stores them, by tensor name (``W0``, ``att_src0``, ``b0``, ...)."""
    return {name: w.detach().cpu().numpy().copy() for name, w in model.tensors().items()}
