"""PNG plots of run records: accuracy against wall time and against dollars, and a pipeline timeline."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from dorylus_py.cost.task_names import EVALUATION, terms_for, timeline_name  # noqa: E402

SIZE = (8, 4.5)  # inches; 100 dpi -> 800 x 450 pixels
TIMELINE_SIZE = (8, 6)  # 800 x 600: room for the legend of the work and of its terms
DPI = 100
ACCURACY_FILES = ("accuracy_vs_time.png", "accuracy_vs_cost.png")
TIMELINE_FILE = re.compile(r"timeline_[^/]+\.png")  # timeline_<run>.png
COLOURS = {  # by the name a timeline shows (task_names.py)
    "ApplyVertex": "tab:blue", "ApplyVertex backward": "tab:orange", "loss": "tab:red", EVALUATION: "tab:purple",
    "Gather": "tab:green", "Gather backward": "tab:olive",
    "ApplyEdge": "tab:pink", "ApplyEdge backward": "tab:brown", "attention backward": "tab:gray",  # GAT
    "last layer, fused": "darkred", "activation": "lime", "activation backward": "darkkhaki",  # GCN's fused last layer
    "mini-batch": "tab:blue", "gossip exchange": "tab:green", "all-reduce": "tab:orange",  # gossip, all-reduce
    "waiting to steal work": "tab:gray",
}  # fmt: skip
OTHER_COLOURS = ("black", "gold", "teal", "navy", "salmon")  # kinds a newer version records


def is_plot_file(rel: str, is_dir: bool) -> bool:
    """A file ``report --plots`` writes (``atomic.Owned``): what ``--overwrite`` may replace in its folder."""
    return not is_dir and (rel in ACCURACY_FILES or TIMELINE_FILE.fullmatch(rel) is not None)


def accuracy_plots(runs: list[tuple[str, list[dict], float]], out_dir: Path) -> list[Path]:
    """``runs``: (name, metrics rows, USD per second of the run). Writes two PNGs, returns their paths."""
    paths = []
    for x_label, fname, x_of in [("wall time (s)", ACCURACY_FILES[0], lambda m, rate: m["wall_s"]),
                                 ("cost (USD, as if on AWS)", ACCURACY_FILES[1], lambda m, rate: m["wall_s"] * rate)]:
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
    """Tasks per (server, chunk) lane over time, coloured by their work; None if the run has no tasks."""
    tasks = [t for t in tasks if t["kind"] != "lease"]  # a Lambda's lease: billing, not work
    if not tasks:
        return None
    fig = timeline_figure(name, tasks)
    fig.savefig(path)
    plt.close(fig)
    return path


def timeline_figure(name: str, tasks: list[dict]):
    """The timeline: a bar per task, a lane per graph server's chunk (its graph work in a lane of its own; a
    gossip or all-reduce worker's in one), each epoch's start marked above, and a legend of the work and of
    the terms it uses (Gather, ApplyVertex, Scatter ...)."""
    t0 = min(t["start"] for t in tasks)
    lanes = sorted({_lane(t) for t in tasks})
    lane_of = {lane: i for i, lane in enumerate(lanes)}
    fig, ax = plt.subplots(figsize=TIMELINE_SIZE, dpi=DPI, layout="constrained")
    names = list(dict.fromkeys([*COLOURS, *sorted({timeline_name(t["kind"], t.get("train", True)) for t in tasks})]))
    others = iter(OTHER_COLOURS * len(names))
    handles = []
    for work in names:
        spans = [t for t in tasks if timeline_name(t["kind"], t.get("train", True)) == work]
        if not spans:
            continue
        colour = COLOURS.get(work) or next(others)
        ax.barh([lane_of[_lane(t)] for t in spans], [t["end"] - t["start"] for t in spans],
                left=[t["start"] - t0 for t in spans], height=0.8, color=colour, linewidth=0)
        handles.append(Patch(color=colour, label=work))
    ax.set_yticks(range(len(lanes)), [_lane_label(*lane) for lane in lanes])
    ax.set_xlabel("seconds since the first task")
    _epoch_marks(ax, tasks, t0)
    # outside the axes, above and below them: inside, they would cover the bars
    fig.legend(handles=handles, loc="outside upper center", fontsize="small", ncol=min(len(handles), 4), frameon=False,
               title=f"pipeline timeline: {name}")
    terms = terms_for(h.get_label() for h in handles)
    if terms:
        fig.legend(handles=[Patch(visible=False)] * len(terms), labels=[f"{t}: {m}" for t, m in terms],
                   loc="outside lower center", fontsize="x-small", handlelength=0, handletextpad=0, frameon=False)
    return fig


def _lane(task: dict) -> tuple[str, int, int]:
    """(where, server, chunk): a worker's lane, a chunk's, or its server's graph work (chunk -1)."""
    where = "worker" if task.get("where") == "worker" else "server"
    return where, task["server"], -1 if task["chunk"] is None else task["chunk"]


def _lane_label(where: str, server: int, chunk: int) -> str:
    if where == "worker":
        return f"worker {server}"
    return f"server {server}, " + ("graph" if chunk < 0 else f"chunk {chunk}")


def _epoch_marks(ax, tasks: list[dict], t0: float) -> None:
    """A dotted line where each epoch's first task starts, named on an axis above the bars."""
    starts: dict[int, float] = {}
    for t in tasks:
        if t.get("epoch") is not None:
            starts[t["epoch"]] = min(starts.get(t["epoch"], t["start"]), t["start"])
    if not starts:
        return
    for start in starts.values():
        ax.axvline(start - t0, color="0.4", linestyle=":", linewidth=1)
    top = ax.secondary_xaxis("top")
    top.set_xticks([s - t0 for s in starts.values()], [f"epoch {e}" for e in starts], fontsize="small")
    top.tick_params(length=0)
