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
