"""Transfer priced (dorylus_py/cost/transfer.py): the bytes a run's graph servers recorded, or the model's,
across zones when the Lambdas run in two; nothing when they run in the servers' zone (infra's default)."""

import json

import pytest

from dorylus_py.cli import main
from dorylus_py.cost import Prices
from dorylus_py.cost.estimate import Calibration, Setup, Workload
from dorylus_py.cost.report import report_rows
from dorylus_py.cost.transfer import crossing_share, predicted_lambda_bytes, recorded_lambda_bytes, transfer_usd


def record(d, backend="lambda", gb_per_server_epoch=5.0):
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"backend": backend, "mode": "sync", "graph_servers": 2, "weight_servers": 1}))
    rows = [{"epoch": e, "loss": 1.0, "train_acc": 0.5, "val_acc": 0.5, "test_acc": 0.5, "epoch_s": 1.0, "wall_s": 1800.0 * e,
             "servers": [{"bytes": gb_per_server_epoch * 1e9}, {"bytes": gb_per_server_epoch * 1e9}]} for e in (1, 2)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "summary.json").write_text(json.dumps({"best_val_acc": 0.5, "test_acc_at_best_val": 0.5}))
    return d


def test_hand_computed_transfer_of_a_recorded_run(tmp_path, capsys):
    """2 epochs x 2 graph servers x 5 GB = 20 GB with the Lambdas; with two zones half of it crosses, billed
    0.01 USD a GB out of one zone and 0.01 into the other: 0.20 USD; in the servers' zone alone, nothing."""
    run = record(tmp_path / "r")
    prices = Prices.load()
    assert recorded_lambda_bytes(json.loads((run / "config.json").read_text()), [
        json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]) == pytest.approx(20e9)
    one, two = (report_rows([str(run)], prices, "c5.2xlarge", None, lambda_zones=z)[0] for z in (1, 2))
    assert one["transfer $"] == 0.0 and two["transfer $"] == pytest.approx(0.20)
    assert two["total $"] == pytest.approx(one["total $"] + 0.20) and two["value"] < one["value"]
    assert main(["report", str(run), "--lambda-zones", "2"]) == 0
    out = capsys.readouterr().out
    assert "transfer $" in out and "0.2000" in out
    cpu = report_rows([str(record(tmp_path / "c", backend="cpu"))], prices, "c5.2xlarge", None, lambda_zones=2)[0]
    assert cpu["transfer $"] == 0.0  # no Lambdas: the servers' traffic stays in their zone
    assert main(["report", str(run), "--lambda-zones", "3"]) == 2
    assert "invalid choice" in capsys.readouterr().err
    with pytest.raises(ValueError, match="1 or 2"):
        crossing_share(0)


def test_estimates_price_the_models_lambda_bytes_across_zones():
    work = Workload(200_000, 2_000_000, [128, 16, 16])
    setup = Setup("lambda", 2, 1, "c5.2xlarge", 8, 3008, 8, 200)
    cal, prices = Calibration.default(), Prices.load()
    one, two = cal.estimate(work, setup, prices), cal.estimate(work, Setup(**{**setup.__dict__, "lambda_zones": 2}), prices)
    lambda_bytes = predicted_lambda_bytes(work, setup)
    assert one["transfer $"] == 0.0 and two["transfer $"] == pytest.approx(transfer_usd(lambda_bytes, 2))
    assert two["total $"] == pytest.approx(one["total $"] + two["transfer $"])
    # the tasks' rows only: what a graph server moves less what it moves with its tensor work in-process
    server_only = work.bytes_per_server(2, 8, in_process=True)
    assert 0 < lambda_bytes == pytest.approx((setup.bytes_per_server(work) - server_only) * 2 * 200)
    assert predicted_lambda_bytes(work, Setup("cpu", 2, 1, "c5.2xlarge", 0, 3008, 8, 200)) == 0.0
