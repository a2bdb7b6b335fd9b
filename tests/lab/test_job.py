"""A 4-host job: host a runs the driver and the weight server, b and c a graph server each, d the
Lambda service; `--backend lambda` invokes it through aiobotocore; CurveZMQ and ZAP on every
connection; links shaped (Lambda <-> server 200 Mbit/s, 1 ms; server <-> server 10 Gbit/s, 0.1 ms).
Its per-epoch losses equal the same job on one machine, and a capture on the bridge holds none of
the job's plaintext, which the same capture of a job without CurveZMQ shows."""

from __future__ import annotations

import numpy as np
import pytest

from dorylus_py.data import load_graph
from dorylus_py.lab.capture import capture_on, found, tcp_streams
from dorylus_py.lab.cluster import LabCluster, Placement
from dorylus_py.lab.lambda_service import Function
from dorylus_py.lab.network import BRIDGE
from dorylus_py.lab.shaping import Link
from dorylus_py.protocol.header import header_prefix
from tests.lab.conftest import JOB, MAX_FDS, MAX_MB, losses

pytestmark = pytest.mark.lab

SHAPED = [Link("d", h, rate_mbit=200, delay_ms=1) for h in "abc"] + [
    Link(x, y, rate_mbit=10_000, delay_ms=0.1) for x, y in ("ab", "ac", "bc")]
OPS = ("lease", "task", "result", "pull_weights", "push_grad", "epoch_stats", "heartbeat", "hello", "ghosts")


def plaintext(lab_data) -> dict[str, bytes]:
    """What the job's traffic holds in the clear without encryption: the headers' first bytes (their op), and
    input-feature rows (pulled by every Lambda of layer 0; `--feature-norm none` sends them as stored)."""
    graph = load_graph(lab_data.parent / "g.npz")
    rows = {f"feature row {v}": np.ascontiguousarray(graph.features[v], np.float32).tobytes() for v in range(0, 600, 150)}
    return {op: header_prefix(op) for op in OPS} | rows  # as a header begins


def run(lab: LabCluster, lab_data, tmp_path, flags: list[str]) -> tuple[int, dict, dict]:
    """Train with a capture on the bridge; (exit code, the capture's TCP streams, peak usage by role)."""
    with capture_on(lambda argv: lab.net.argv(BRIDGE, argv), BRIDGE, tmp_path / "bridge.pcap", tmp_path / "capture.log"):
        with lab.peak_usage() as peaks:
            code = lab.train(lab_data, tmp_path / "run", lab.lambda_flags() + flags, timeout_s=400)
    lab.stop_services()  # the Lambda service writes its counts as it stops
    return code, tcp_streams(tmp_path / "bridge.pcap"), peaks


def test_four_hosts_with_curve_and_shaped_links_train_as_one_machine(lab_data, one_machine, tmp_path):
    with LabCluster(tmp_path, Placement.standard(2), SHAPED, curve=True, function=Function(concurrency=4)) as lab:
        ips = lab.net.ips
        code, streams, peaks = run(lab, lab_data, tmp_path, JOB)
        assert code == 0, lab.log("driver")[-2000:]
    assert np.allclose(losses(tmp_path / "run"), one_machine, rtol=0, atol=1e-6), (losses(tmp_path / "run"), one_machine)
    service = lab.log("lambda-service")
    assert " 0 refused, 0 function_errors" in service and " 0 invocations" not in service, service
    # the capture saw the job: every Lambda <-> server and server <-> server path carried bytes ...
    carried = {(src, dst) for (src, _, dst, _), data in streams.items() if len(data) > 1000}
    for x, y in [("d", "a"), ("d", "b"), ("d", "c"), ("b", "c"), ("b", "a"), ("c", "a")]:
        assert (ips[x], ips[y]) in carried and (ips[y], ips[x]) in carried, (x, y, sorted(carried))
    # ... and none of its plaintext
    assert found(streams, plaintext(lab_data)) == set()
    assert len(peaks) == 4 and all(mb < MAX_MB and fds < MAX_FDS for mb, fds in peaks.values()), peaks


@pytest.mark.long
def test_without_curve_the_same_capture_shows_the_traffic(lab_data, tmp_path):
    """The control that makes the test above able to fail: with the cluster file's curve_* entries
    left out, the capture finds every op name, the header JSON and the feature rows."""
    with LabCluster(tmp_path, Placement.standard(2), curve=False) as lab:
        code, streams, _ = run(lab, lab_data, tmp_path, [*JOB[:1], "1", *JOB[2:]])
        assert code == 0, lab.log("driver")[-2000:]
    needles = plaintext(lab_data)
    assert found(streams, needles) == set(needles)
