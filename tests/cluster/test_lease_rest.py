"""``--lease-rest predict`` on a real job (graph servers, weight servers, emulated Lambdas): leases released
between stages and invoked again change nothing a sync run computes (the same losses, bit for bit), and
every lease invoked is billed (a row of leases.jsonl each). The decisions themselves:
tests/pipeline/test_rests.py."""

import json

from tests.cluster.test_fused import losses, run
from tests.cluster.test_messages_per_task import end_lines


def test_resting_leases_change_no_loss_and_every_invocation_is_billed(small_graph, tmp_path):
    stay = run(small_graph, tmp_path, "stay", backend="local", lambdas=4, epochs=6)
    rest = run(small_graph, tmp_path, "rest", backend="local", lambdas=4, epochs=6, lease_rest="predict")
    assert losses(rest) == losses(stay)
    ends = end_lines(tmp_path, "rest")
    assert sum(e["leases_rested"] for e in ends) > 0, ends  # here 32 of 36 leases, idle: gaps of ms, invocations of less
    assert all(e["leases_rested"] == 0 for e in end_lines(tmp_path, "stay"))
    billed = [json.loads(line) for line in (tmp_path / "rest" / "leases.jsonl").read_text().splitlines()]
    assert len(billed) == sum(e["leases"] for e in ends) and all(b["billed_ms"] > 0 for b in billed)
