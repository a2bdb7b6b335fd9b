"""benchmarks/lease_gaps.py: the share of a Lambda run's span with a task out, and the gaps between, from
task records written here (a real run's records are the benchmark's)."""

import importlib.util
import json
from pathlib import Path

from pytest import approx

spec = importlib.util.spec_from_file_location("lease_gaps", Path(__file__).resolve().parents[1] / "benchmarks" / "lease_gaps.py")
lease_gaps = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lease_gaps)


def test_overlapping_tasks_make_one_stretch_and_the_gaps_between_are_measured():
    out, gaps = lease_gaps.stretches([(5.0, 6.0), (0.0, 2.0), (1.0, 3.0), (3.5, 4.0)])
    assert out == approx(2.0 + 3.0 + 0.5 + 1.0 - 2.0)  # [0, 3], [3.5, 4], [5, 6]
    assert gaps == approx([0.5, 1.0])


def test_a_run_record_is_read_in_model_time_and_bad_records_exit_2(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"backend": "local", "mode": "sync", "dilation": 2.0}))
    (run / "metrics.jsonl").write_text(json.dumps({"epoch": 2, "loss": 1.0, "train_acc": 0.5, "val_acc": 0.5, "test_acc": 0.5, "epoch_s": 1.0, "wall_s": 2.0}) + "\n")
    bill = {"train": True, "billed_ms": 200, "memory_mb": 512}
    tasks = [{"kind": "fwd", "where": "local-lambda", "epoch": 2, "server": 0, "start": s, "end": e, **bill}
             for s, e in ((0.0, 0.2), (0.6, 0.8), (0.82, 1.0))]  # gaps of 0.4 and 0.02 raw s: 200 and 10 model ms
    tasks.append({"kind": "gather", "where": "graph-server", "epoch": 2, "server": 0, "start": 0.0, "end": 9.0})  # not on a Lambda
    (run / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    lease = {"kind": "lease", "where": "local-lambda", "epoch": 2, "server": 0, "start": 0.0, "end": 1.0, **bill}
    (run / "leases.jsonl").write_text(json.dumps(lease) + "\n")  # billing, not work: no gap
    assert lease_gaps.main([str(run)]) == 0
    line = capsys.readouterr().out
    assert "a task out 58 % of the span" in line and "2.0 gaps an epoch, median 200 model ms" in line
    assert "over 50 ms 40 %, over 100 ms 40 %" in line
    assert lease_gaps.main([str(run), "--from-epoch", "3"]) == 2
    assert "no Lambda task from epoch 3" in capsys.readouterr().err
    assert lease_gaps.main([str(tmp_path / "missing")]) == 2
    assert "is " in capsys.readouterr().err
    (run / "tasks.jsonl").write_text(json.dumps({k: v for k, v in tasks[0].items() if k != "server"}) + "\n")
    assert lease_gaps.main([str(run)]) == 2
    assert "no server (lease_gaps.py counts" in capsys.readouterr().err
    (run / "tasks.jsonl").write_text("[1, 2]\n")
    assert lease_gaps.main([str(run)]) == 2
    (run / "tasks.jsonl").write_bytes(b"\x99\x00garbage")
    assert lease_gaps.main([str(run)]) == 2
