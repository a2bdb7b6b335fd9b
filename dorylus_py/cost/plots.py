"""PNG plots of run records: accuracy against wall time and against dollars, and a pipeline timeline."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

SIZE = (8, 4.5)  # inches; 100 dpi -> 800 x 450 pixels
DPI = 100
KIND_COLOURS = {"fwd": "tab:blue", "bwd": "tab:orange", "loss": "tab:red", "eval": "tab:purple",
                "gather": "tab:green", "gather_bwd": "tab:olive", "egather": "tab:cyan",
                "edge_fwd": "tab:pink", "edge_bwd": "tab:brown", "attn_grad": "tab:gray",  # these three: GAT
                "fused": "darkred", "activate": "lime", "activate_bwd": "darkkhaki"}  # GCN's fused last layer


def accuracy_plots(runs: list[tuple[str, list[dict], float]], out_dir: Path) -> list[Path]:
    """``runs``: (name, metrics rows, USD per second of the run). Writes two PNGs, returns their paths."""
    paths = []
    for x_label, fname, x_of in [("wall time (s)", "accuracy_vs_time.png", lambda m, rate: m["wall_s"]),
                                 ("cost (USD, as if on AWS)", "accuracy_vs_cost.png", lambda m, rate: m["wall_s"] * rate)]:
        fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
        for name, metrics, rate in runs:
            ax.plot([x_of(m, rate) for m in metrics], [m["val_acc"] for m in metrics], label=name)
        ax.set_xlabel(x_label)
        ax.set_ylabel("validation accuracy")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        paths.append(out_dir / fname)
        fig.savefig(paths[-1])
        plt.close(fig)
    return paths


def timeline(name: str, tasks: list[dict], path: Path) -> Path | None:
    """Tasks per (server, chunk) lane over time, coloured by kind; None if the run has no tasks."""
    tasks = [t for t in tasks if t["kind"] != "lease"]  # a Lambda's lease: billing, not work
    if not tasks:
        return None
    fig = timeline_figure(name, tasks)
    fig.savefig(path)
    plt.close(fig)
    return path


def timeline_figure(name: str, tasks: list[dict]):
    t0 = min(t["start"] for t in tasks)
    lanes = sorted({(t["server"], -1 if t["chunk"] is None else t["chunk"]) for t in tasks})
    lane_of = {lane: i for i, lane in enumerate(lanes)}
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI, layout="constrained")
    handles = []
    for kind, colour in KIND_COLOURS.items():
        # the evaluation forward (fwd without training) is drawn with the eval colour
        spans = [t for t in tasks if ("eval" if not t.get("train", True) else t["kind"]) == kind]
        if not spans:
            continue
        lanes_y = [lane_of[(t["server"], -1 if t["chunk"] is None else t["chunk"])] for t in spans]
        ax.barh(lanes_y, [t["end"] - t["start"] for t in spans], left=[t["start"] - t0 for t in spans], height=0.8,
                color=colour, linewidth=0)
        handles.append(Patch(color=colour, label=kind))
    ax.set_yticks(range(len(lanes)), [f"s{s} " + ("graph" if c < 0 else f"c{c}") for s, c in lanes])
    ax.set_xlabel("seconds since the first task")
    ax.set_title(f"pipeline timeline: {name}")
    # outside the axes, above them: inside, it would cover the bars of the top rows
    fig.legend(handles=handles, loc="outside upper center", fontsize="small", ncol=len(handles), frameon=False)
    return fig
