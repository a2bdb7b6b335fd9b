"""benchmarks/bench_tta.py's measure: seconds from the first epoch's start to a target validation accuracy,
computed from metrics rows (the benchmark's runs themselves are too long for the suite)."""

import importlib.util
from pathlib import Path

from pytest import approx

spec = importlib.util.spec_from_file_location("bench_tta", Path(__file__).resolve().parents[1] / "benchmarks" / "bench_tta.py")
bench_tta = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_tta)


def rows(*epochs: tuple[float, float]) -> list[dict]:
    """Metrics rows from (epoch_s, val_acc) pairs, wall_s accumulated as the launcher does."""
    out, wall = [], 0.0
    for i, (epoch_s, val_acc) in enumerate(epochs, 1):
        wall += epoch_s
        out.append({"epoch": i, "epoch_s": epoch_s, "wall_s": wall, "val_acc": val_acc, "test_acc": val_acc})
    return out


# the first epoch's 12 s is start-up: it counts as a steady epoch, the median of the others (0.5 s)
RUN = rows((12.0, 0.30), (0.4, 0.50), (0.5, 0.70), (0.6, 0.72), (0.5, 0.71))


def test_target_reached_in_a_later_epoch_counts_from_the_first_epochs_start():
    assert bench_tta.time_to_target(RUN, 0.70) == approx(0.5 + 0.4 + 0.5)
    assert bench_tta.time_to_target(RUN, 0.72) == approx(0.5 + 0.4 + 0.5 + 0.6)


def test_target_reached_at_epoch_one_takes_one_steady_epoch():
    assert bench_tta.time_to_target(RUN, 0.30) == 0.5
    assert bench_tta.time_to_target(rows((3.0, 0.9)), 0.8) == 3.0  # a single epoch is its own steady epoch


def test_target_never_reached_is_none_and_the_slowest_in_a_median():
    assert bench_tta.time_to_target(RUN, 0.73) is None
    assert bench_tta.time_to_target([], 0.1) is None
    assert bench_tta.median_tta([1.0, None, None]) is None
    assert bench_tta.median_tta([1.0, 2.0, None]) == 2.0


def test_epochs_to_target_counts_from_one_and_is_none_when_never_reached():
    assert bench_tta.epochs_to_target(RUN, 0.30) == 1
    assert bench_tta.epochs_to_target(RUN, 0.71) == 4
    assert bench_tta.epochs_to_target(RUN, 0.73) is None


def test_table_carries_medians_and_async_ratios_to_sync():
    class Args:
        graphs, settings, modes = ["cora"], ["20ms"], ["sync", "async0"]

    def run(tta, ett, epoch_s, busy):
        return {"tta": tta, "ett": ett, "test_acc": 0.8, "epoch_s": epoch_s, "busy": busy}

    results = {("cora", "20ms", "sync"): [run(10.0, 20, 0.5, 0.9), run(12.0, 24, 0.5, None), run(11.0, 22, 0.5, 0.92)],
               ("cora", "20ms", "async0"): [run(8.8, 25, 0.4, 0.97), run(None, None, 0.4, 0.99), run(7.7, 21, 0.4, 0.98)]}
    header, _, sync, async0 = bench_tta.table(results, Args)
    assert "epochs to target" in header and "cores busy" in header
    assert sync.split(" | ")[3:6] == ["11.0 (3/3)", "22", "80.0 %"]
    # a seed that never reached the target is the slowest: the median is the slower reached one
    cells = async0.strip("| ").split(" | ")
    assert cells[3:] == ["8.8 (2/3)", "25", "80.0 %", "0.400", "98 %", "0.80x", "0.80x"]


def test_busy_share_of_the_machine():
    assert bench_tta.busy_share((100, 400), (250, 600)) == approx(0.75)
    assert bench_tta.busy_share(None, (250, 600)) is None and bench_tta.busy_share((1, 5), (1, 5)) is None
    assert bench_tta.percent([0.5, None, 0.7]) == "60 %" and bench_tta.percent([None]) == "-"
    now = bench_tta.cpu_ticks()
    assert now is None or 0 <= now[0] <= now[1]
