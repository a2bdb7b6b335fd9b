"""``--local-barrier`` and ``--stale-smoothing`` default to ``auto``, which the run plan turns on (and to
PipeGCN's 0.95) in async mode and off elsewhere (issue 39: the pair that kept async S=1 from diverging
on the benchmark graphs); values a user gives stay, the bare ``--local-barrier`` is on, and mistakes are
one line with exit code 2."""

import pytest

from dorylus_py.cli import build_parser, main
from dorylus_py.config import SECTION_OF, TrainConfig
from dorylus_py.plan import plan
from dorylus_py.sections import ASYNC_SMOOTHING
from dorylus_py.settings import AUTO


def planned(*argv) -> tuple:
    args = build_parser().parse_args(["train", "--backend", "local", *argv])
    cfg = TrainConfig(**{k: v for k, v in vars(args).items() if k in SECTION_OF})
    cfg.check()
    resolved = plan(cfg, 8, 2, 1000).config
    return resolved.local_barrier, resolved.stale_smoothing


def test_auto_is_the_default_and_the_plan_turns_both_on_in_async_mode_only():
    args = build_parser().parse_args(["train"])
    assert args.local_barrier is AUTO and args.stale_smoothing is AUTO
    assert planned("--mode", "async") == (True, ASYNC_SMOOTHING) == (True, 0.95)
    assert planned("--mode", "sync") == (False, 0.0)
    assert planned("--backend", "cpu", "--mode", "async") == (True, 0.95)
    # after a switch back to sync, smoothed rows would lag the current ones: auto leaves smoothing off
    assert planned("--mode", "async", "--target-acc", "0.8", "--switch-threshold", "0.02") == (True, 0.0)


@pytest.mark.parametrize("argv, expected", [
    (["--local-barrier"], (True, 0.95)),  # the bare flag, as before it had a default
    (["--local-barrier", "off"], (False, 0.95)),
    (["--local-barrier", "on", "--stale-smoothing", "0"], (True, 0.0)),
    (["--local-barrier", "auto", "--stale-smoothing", "0.5"], (True, 0.5)),
    (["--local-barrier", "off", "--stale-smoothing", "0"], (False, 0.0)),  # earlier releases' plain async
])
def test_values_given_stay(argv, expected):
    assert planned("--mode", "async", *argv) == expected


def test_the_resolved_values_are_in_the_record(graph_npz, tmp_path):
    import json

    run = tmp_path / "run"
    assert main(["train", "--backend", "local", "--data", str(graph_npz), "-k", "2", "--epochs", "1",
                 "--mode", "async", "--out", str(run), "--quiet"]) == 0
    config = json.loads((run / "config.json").read_text())
    assert (config["local_barrier"], config["stale_smoothing"]) == (True, 0.95)


@pytest.mark.parametrize("argv, message", [
    (["--local-barrier", "maybe"], "argument --local-barrier: expected on, off or auto, got 'maybe'"),
    (["--stale-smoothing", "lots"], "argument --stale-smoothing: expected a number, got 'lots'"),
    (["--mode", "sync", "--local-barrier", "on"], "--local-barrier is for --mode async"),
    (["--mode", "sync", "--stale-smoothing", "0.9"], "--stale-smoothing is for --mode async"),
])
def test_mistakes_are_one_line_exit_2(tmp_path, capsys, argv, message):
    code = main(["train", "--backend", "local", "--out", str(tmp_path / "run"), "--epochs", "1", *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and message in err and err.count("\n") == 1, err
