"""Time is one setting: no duration of a job's processes is left out of the dilation (``timescale.py``).

The scan (``durations.py``) lists every literal a process waits on, every duration default, and every
``*_S``/``*_MS`` constant used outside ``scaled()``; each one left must be in ``REVIEWED`` with why it
need not scale. A new timeout that skips the scale fails here, naming its file and function."""

from __future__ import annotations

import dataclasses
import re

from tests.scale_model.durations import unscaled

TICK = "how often a loop looks (its granularity), not how long anything may take"
REAP = "waits for a process or thread already told to stop, or killed (shutdown, not the job)"
SET = "a default every job overrides with its dilated setting (timescale.dilate)"
TOOL = "a lab tool outside the modelled cluster (packet capture, the hostile host, ip/tc commands)"
CLOCK = "a window between two clocks; the box has one clock, which dilation does not stretch"
LINGER = "ZeroMQ's linger of a closing socket (shutdown)"

REVIEWED = {
    ("dorylus_py/protocol/replay.py", "ReplayGuard._count", "LOG_EVERY_S unscaled"): "how often a log line may be written",
    ("dorylus_py/decentral/store.py", "StoreClient.__init__", "sleep(0.1)"): TICK,
    ("dorylus_py/decentral/store.py", "StoreClient.wait", "POLL_S unscaled"): TICK,
    ("dorylus_py/serving/node.py", "exit_with_parent.watch", "sleep(1.0)"): TICK,
    ("dorylus_py/serving/node.py", "ServerNode.__init__", "default hang_timeout_s=60.0"): SET,
    ("dorylus_py/serving/node.py", "ServerNode.new_job", "dealer(linger_ms=1000)"): LINGER,
    ("dorylus_py/serving/node.py", "ServerNode.handshake", "poll(200)"): TICK,
    ("dorylus_py/serving/node.py", "ServerNode.serve_once", "default timeout_ms=100"): TICK,
    ("dorylus_py/cluster/driver_link.py", "DriverLink.__init__", "default hang_timeout_s=60.0"): SET,
    ("dorylus_py/cluster/driver_link.py", "DriverLink.kill_servers", "wait(timeout=30)"): REAP,
    ("dorylus_py/cluster/driver_link.py", "DriverLink.stop", "monotonic() + 10"): REAP,
    ("dorylus_py/cluster/driver_link.py", "DriverLink.stop", "wait(timeout=10)"): REAP,
    ("dorylus_py/cluster/driver_link.py", "DriverLink.stop", "join(timeout=5)"): REAP,
    ("dorylus_py/cluster/driver_link.py", "DriverLink.recv", "poll(200)"): TICK,
    ("dorylus_py/cluster/driver_link.py", "DriverLink.ask", "poll(100)"): TICK,
    ("dorylus_py/pipeline/autotune.py", "TunerPolicy", "field wait_threshold=0.1"): "a fraction of time, not a duration",
    ("dorylus_py/pipeline/scheduler.py", "Scheduler", "field stall_s=300.0"): SET,
    ("dorylus_py/pipeline/tasks.py", "RelaunchPolicy", "field min_s=5.0"): SET,
    ("dorylus_py/weights/server.py", "WeightServer.run", "serve_once(timeout_ms=200)"): TICK,
    ("dorylus_py/protocol/replay.py", "ReplayGuard.__init__", "default max_age_s=300.0"): CLOCK,
    ("dorylus_py/training/record_schema.py", "<module>", "MAX_SECONDS unscaled"): "a bound on the times a record holds, "
                                                                               "not a wait",
    ("dorylus_py/protocol/replay.py", "ReplayGuard.__init__", "default max_skew_s=120.0"): CLOCK,
    ("dorylus_py/lab/capture.py", "record", "settimeout(0.2)"): TOOL,
    ("dorylus_py/lab/capture.py", "capture_on", "wait(timeout=30)"): TOOL,
    ("dorylus_py/lab/capture.py", "capture_on", "wait(timeout=10)"): TOOL,
    ("dorylus_py/cgroups.py", "_remove_tree", "sleep(0.02)"): REAP,
    ("dorylus_py/lab/cluster.py", "LabCluster", "field restart_s=1.0"): "scaled where the supervisor is started",
    ("dorylus_py/lab/cluster.py", "LabCluster.kill_host", "wait(timeout=10)"): REAP,
    ("dorylus_py/lab/cluster.py", "LabCluster.stop_services", "default timeout_s=20.0"): REAP,
    ("dorylus_py/lab/cluster.py", "LabCluster.stop_services", "wait(timeout=10)"): REAP,
    ("dorylus_py/lab/cluster.py", "LabCluster.wait_listening", "sleep(0.1)"): TICK,
    ("dorylus_py/lab/cluster.py", "LabCluster.peak_usage", "default every_s=0.25"): TICK,
    ("dorylus_py/lab/cluster.py", "LabCluster.peak_usage", "join(timeout=5)"): REAP,
    ("dorylus_py/lab/cluster.py", "LabCluster.train", "wait(timeout=10)"): REAP,
    ("dorylus_py/lab/hostile.py", "scan", "default timeout_s=0.5"): TOOL,
    ("dorylus_py/lab/hostile.py", "Attack.send", "create_connection(timeout=2)"): TOOL,
    ("dorylus_py/lab/hostile.py", "Attack.hold_idle", "recv(1)"): "a byte count, not a duration",
    ("dorylus_py/lab/hostile.py", "Attack.hold_idle", "monotonic() + 10"): TOOL,
    ("dorylus_py/lab/hostile.py", "Attack.hold_idle", "settimeout(2)"): TOOL,
    ("dorylus_py/lab/hostile.py", "main", "sleep(0.05)"): TOOL,
    ("dorylus_py/lab/lambda_service.py", "Function", "field timeout_s=60.0"): "scaled where the service is started",
    ("dorylus_py/lab/lambda_service.py", "LambdaService.serve_forever", "serve_forever(poll_interval=0.2)"): TICK,
    ("dorylus_py/lab/lambda_service.py", "LambdaService.close", "join(timeout=2)"): REAP,
    ("dorylus_py/lab/lambda_service.py", "_serve", "wait(1.0)"): TICK,
    ("dorylus_py/lab/network.py", "_run", "default timeout=30"): TOOL,
    ("dorylus_py/lab/network.py", "kill_namespace", "default timeout_s=10.0"): REAP,
    ("dorylus_py/lab/network.py", "kill_namespace", "sleep(0.05)"): REAP,
    ("dorylus_py/lab/network.py", "Network.down", "wait(timeout=10)"): REAP,
    ("dorylus_py/lab/sigv4.py", "check_headers", "MAX_SKEW_S unscaled"): CLOCK,
    ("dorylus_py/lab/runtime_api.py", "Container.invoke", "wait(0.1)"): TICK,
    ("dorylus_py/lab/runtime_api.py", "Container.next_invocation", "wait(1.0)"): TICK,
    ("dorylus_py/lab/runtime_api.py", "Container.kill", "wait(10)"): REAP,
    ("dorylus_py/lab/runtime_api.py", "Container.close", "wait(5)"): REAP,
    ("dorylus_py/lab/connections.py", "Tally.add", "LOG_EVERY_S unscaled"): "how often a log line may be written",
    ("dorylus_py/decentral/launcher.py", "_watch", "sleep(0.1)"): TICK,
    ("dorylus_py/decentral/launcher.py", "_wait_or_kill", "wait(timeout=10)"): REAP,
    ("dorylus_py/decentral/node.py", "Node.await_steal", "poll(0.05)"): TICK,
    ("dorylus_py/decentral/peers.py", "Inbox.close", "join(timeout=10)"): REAP,
    ("dorylus_py/decentral/peers.py", "Inbox._run", "poll(100)"): TICK,
    ("dorylus_py/decentral/peers.py", "Links._sock", "dealer(linger_ms=1000)"): LINGER,
    ("dorylus_py/decentral/peers.py", "Links.ask", "default timeout_s=5.0"): SET,
    ("dorylus_py/decentral/peers.py", "Links.ask_all", "default timeout_s=5.0"): SET,
    ("dorylus_py/decentral/recorder.py", "RecorderDuty.close", "join(timeout=60)"): REAP,
    ("dorylus_py/decentral/rendezvous.py", "rendezvous", "sleep(0.05)"): TICK,
    ("dorylus_py/decentral/worker.py", "Trainer._gossip", "wait(0.5)"): TICK,
    ("dorylus_py/decentral/worker.py", "Trainer._allreduce", "wait(0.5)"): TICK,
    ("dorylus_py/platforms/local.py", "LocalLambdaPlatform.__init__", "default timeout_s=60.0"): SET,
    ("dorylus_py/platforms/local.py", "LocalLambdaPlatform.__init__", "default park_s=60.0"): "scaled where read (_reap)",
    ("dorylus_py/platforms/local.py", "LocalLambdaPlatform._stop", "join(timeout=5)"): REAP,
    ("dorylus_py/platforms/local.py", "LocalLambdaPlatform.close", "join(timeout=5)"): REAP,
}


def test_every_duration_goes_through_the_scale():
    left = [f for f in unscaled() if f not in REVIEWED]
    assert not left, "durations that skip timescale.scaled (scale them, or review them into REVIEWED):\n" + "\n".join(
        f"  {path}: {where}: {what}" for path, where, what in left)


def test_the_review_list_has_no_stale_entries():
    found = set(unscaled())
    assert not [k for k in REVIEWED if k not in found]


def test_every_duration_setting_is_dilated():
    """Each setting named as a duration (``*_s``, ``*_ms``) or a rate (``*_mbps``) goes through dilate()."""
    from dorylus_py.sections import SECTIONS
    from dorylus_py.timescale import DURATION_SETTINGS, RATE_SETTINGS

    names = {f.name for cls in SECTIONS.values() for f in dataclasses.fields(cls)}
    assert {n for n in names if re.search(r"_(s|ms)$", n)} == set(DURATION_SETTINGS)
    assert {n for n in names if n.endswith("_mbps")} == set(RATE_SETTINGS)


def test_an_unscaled_timeout_is_named(tmp_path, monkeypatch):
    """The capability off: the heartbeat's silence deadline read without the scale is found."""
    from tests.scale_model import durations

    src = (durations.ROOT / "dorylus_py/cluster/driver_link.py").read_text()
    assert "now - when > scaled(SILENCE_S)" in src
    mutated = tmp_path / "dorylus_py" / "cluster" / "driver_link.py"
    mutated.parent.mkdir(parents=True)
    mutated.write_text(src.replace("now - when > scaled(SILENCE_S)", "now - when > SILENCE_S"))
    (tmp_path / "dorylus_py" / "serving").mkdir()
    (tmp_path / "dorylus_py" / "serving" / "heartbeat.py").write_text("SILENCE_S = 6.0\n")
    monkeypatch.setattr(durations, "ROOT", tmp_path)
    monkeypatch.setattr(durations, "SCANNED", ["dorylus_py/cluster", "dorylus_py/serving"])
    assert ("dorylus_py/cluster/driver_link.py", "DriverLink.check_heartbeats", "SILENCE_S unscaled") in durations.unscaled()
