"""``--local-barrier``, ``--fresh-wait-ms`` and ``--stale-smoothing`` default to ``auto``: in async mode the
run plan turns the barrier on and the wait to 50 ms (issue 39: together they bring async S=1 to sync's
epochs on the benchmark graphs), and smoothing to PipeGCN's 0.95 only where the wait is 0; all off
elsewhere. Values a user gives stay, the bare ``--local-barrier`` is on, and mistakes are one line with
exit code 2."""

import pytest

from dorylus_py.cli import build_parser, main
from dorylus_py.config import SECTION_OF, TrainConfig
from dorylus_py.plan import plan
from dorylus_py.sections import ASYNC_FRESH_WAIT_MS, ASYNC_SMOOTHING
from dorylus_py.settings import AUTO


def planned(*argv) -> tuple:
    args = build_parser().parse_args(["train", "--backend", "local", *argv])
    cfg = TrainConfig(**{k: v for k, v in vars(args).items() if k in SECTION_OF})
    cfg.check()
    resolved = plan(cfg, 8, 2, 1000).config
    return resolved.local_barrier, resolved.fresh_wait_ms, resolved.stale_smoothing


def test_auto_is_the_default_and_the_plan_decides_in_async_mode_only():
    args = build_parser().parse_args(["train"])
    assert args.local_barrier is AUTO and args.stale_smoothing is AUTO and args.fresh_wait_ms is AUTO
    assert planned("--mode", "async") == (True, ASYNC_FRESH_WAIT_MS, 0.0) == (True, 50.0, 0.0)
    assert planned("--mode", "sync") == (False, 0.0, 0.0)
    assert planned("--backend", "cpu", "--mode", "async") == (True, 50.0, 0.0)
    # no wait: stale rows are smoothed (PipeGCN's 0.95), as the default was before the wait
    assert planned("--mode", "async", "--fresh-wait-ms", "0") == (True, 0.0, ASYNC_SMOOTHING) == (True, 0.0, 0.95)
    # after a switch back to sync, smoothed rows would lag the current ones: auto leaves smoothing off
    assert planned("--mode", "async", "--fresh-wait-ms", "0", "--target-acc", "0.8",
                   "--switch-threshold", "0.02") == (True, 0.0, 0.0)


@pytest.mark.parametrize("argv, expected", [
    (["--local-barrier"], (True, 50.0, 0.0)),  # the bare flag, as before it had a default
    (["--local-barrier", "off"], (False, 50.0, 0.0)),
    (["--fresh-wait-ms", "200"], (True, 200.0, 0.0)),
    (["--fresh-wait-ms", "auto", "--stale-smoothing", "0.95"], (True, 50.0, 0.95)),
    (["--local-barrier", "on", "--fresh-wait-ms", "0", "--stale-smoothing", "0"], (True, 0.0, 0.0)),
    (["--local-barrier", "auto", "--fresh-wait-ms", "0", "--stale-smoothing", "0.5"], (True, 0.0, 0.5)),
    # earlier releases' plain async
    (["--local-barrier", "off", "--fresh-wait-ms", "0", "--stale-smoothing", "0"], (False, 0.0, 0.0)),
])
def test_values_given_stay(argv, expected):
    assert planned("--mode", "async", *argv) == expected


def test_the_resolved_values_are_in_the_record(graph_npz, tmp_path):
    import json

    run = tmp_path / "run"
    assert main(["train", "--backend", "local", "--data", str(graph_npz), "-k", "2", "--epochs", "1",
                 "--mode", "async", "--out", str(run), "--quiet"]) == 0
    config = json.loads((run / "config.json").read_text())
    assert (config["local_barrier"], config["fresh_wait_ms"], config["stale_smoothing"]) == (True, 50.0, 0.0)


@pytest.mark.parametrize("argv, message", [
    (["--local-barrier", "maybe"], "argument --local-barrier: expected on, off or auto, got 'maybe'"),
    (["--stale-smoothing", "lots"], "argument --stale-smoothing: expected a number, got 'lots'"),
    (["--mode", "sync", "--local-barrier", "on"], "--local-barrier is for --mode async"),
    (["--mode", "sync", "--stale-smoothing", "0.9"], "--stale-smoothing is for --mode async"),
    (["--fresh-wait-ms", "soon"], "argument --fresh-wait-ms: expected a number, got 'soon'"),
    (["--mode", "sync", "--fresh-wait-ms", "20"], "--fresh-wait-ms is for --mode async"),
    (["--mode", "async", "--fresh-wait-ms", "-5"], "--fresh-wait-ms must be >= 0"),
])
def test_mistakes_are_one_line_exit_2(tmp_path, capsys, argv, message):
    code = main(["train", "--backend", "local", "--out", str(tmp_path / "run"), "--epochs", "1", *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and message in err and err.count("\n") == 1, err


def test_a_record_from_before_the_fresh_wait_resumes_without_it(tmp_path):
    import json

    from dorylus_py.cli_train import resume_args

    old = TrainConfig(mode="async", backend="local", stale_smoothing=0.95, local_barrier=True).to_dict()
    del old["fresh_wait_ms"]
    (tmp_path / "config.json").write_text(json.dumps(old))
    args = build_parser().parse_args(["train", "--resume", str(tmp_path)])
    resume_args(args, {"resume_dir"})
    assert (args.fresh_wait_ms, args.stale_smoothing, args.local_barrier) == (0.0, 0.95, True)
