"""What workers and peers send a graph server: unauthenticated frames (truncated, unsigned, wrong key,
replayed) are dropped unanswered; authentic ones with wrong shapes, unknown ops, bad tasks, or from a
worker that is not the task's lease get an error reply, and the server then takes the next good one. A
lease is sent its tasks with their rows, two at most at a time; a result takes effect once. Streamed
results (``--stream-rows``) come in parts, staged and committed only whole, with the task's last part.
A lease that leaves hands its tasks back as they were; one whose invocation fails, as failed copies."""

import json
import threading
import time

import numpy as np
import pytest

from dorylus_py.protocol import Message, Session
from dorylus_py.worker.handler import Lease
from tests.clients import KEY, Client, authentic_but_bad, driver, unauthenticated  # noqa: F401  (a fixture)
from tests.graph_servers import TASK, hello, leave, pump, result, served  # noqa: F401  (a fixture)


def test_graph_server_rejects_bad_messages_and_keeps_serving(served):
    gs, client = served()
    rows = int(gs.state.bounds[1])
    events = gs.platform.events
    assert len(events) == 2 and len({e.lease for e in events}) == 2  # a lease for each of epoch 1's two tasks
    assert all(KEY.hex() not in json.dumps(e.to_dict()) for e in events)
    dropped, replayed = unauthenticated(client, TASK)
    assert client.ask(gs.handle, replayed).op == "error"  # once: an answer (no such lease)
    for name, frames in dropped.items():
        client.unanswered(gs.handle, frames)
    for name, frames in authentic_but_bad(client).items():
        assert client.ask(gs.handle, frames).op == "error", name
    assert hello(gs, client, "not ours")[0].op == "release"  # a lease no one invoked is told to stop

    tasks = hello(gs, client, events[0].lease, want=2)  # epoch 1's two forwards, both on this lease
    assert [(t.op, json.loads(json.dumps(t["task"]))["chunk"]) for t in tasks] == [("task", 0), ("task", 1)]
    first = tasks[0]
    assert first.tensors["P"].shape == (rows, 16) and first["lease"] == events[0].lease
    np.testing.assert_array_equal(first.tensors["P"], gs.state.input_rows(0, rows))
    z = np.ones((rows, 8), np.float32)
    other = Client(gs.node)  # a key holder, but not the lease the task was sent to
    assert "not lease" in result(gs, other, first, {"Z": z}, want=1)[0]["reason"]
    other.close()
    assert "expected" in result(gs, client, first, {"Z": np.zeros((rows, 5), np.float32)}, want=1)[0]["reason"]
    for bad in ["x", {"kind": "fwd"}, dict(TASK, chunk=99), dict(TASK, kind="rm"), dict(TASK, attempt=2)]:
        got = result(gs, client, first, {"Z": z}, want=1, task=bad)
        assert got and got[0].op == "error", bad
    assert result(gs, client, first, {"Z": z}) == []  # taken, unanswered
    np.testing.assert_array_equal(gs.state.ZG[True][0][:rows], z)
    assert result(gs, client, first, {"Z": z}, want=1)[0].op == "error"  # once only: not out on the lease now
    assert gs.node.rejections.counts["bugs"] == 0 and gs.node.rejections.counts["unauthenticated"] == 7


def test_a_lease_that_leaves_hands_its_tasks_back_and_a_failed_one_fails_them(served):
    gs, client = served()
    first, second = gs.platform.events
    tasks = hello(gs, client, first.lease, want=2)
    assert len(tasks) == 2
    assert leave(gs, client, first.lease)[0].op == "release"
    assert set(gs.dispatcher.queue) == {(k, 1) for k in gs.scheduler.tracker.running}  # back, as attempt 1
    assert gs.scheduler.tracker.relaunches == 0
    worker2 = Client(gs.node)
    again = hello(gs, worker2, second.lease, want=2)  # the other lease gets them
    assert [json.loads(json.dumps(t["task"]))["attempt"] for t in again] == [1, 1]
    gs.platform.end(second)  # its invocation fails: the copies it held failed, and are launched again
    pump(gs, client, want=0, turns=5)
    assert gs.scheduler.tracker.relaunches == 2 and {a for _, a in gs.dispatcher.queue} == {2}
    late = Client(gs.node)  # not the lease's worker: refused, counted
    before = dict(gs.node.rejections.counts)
    assert result(gs, late, again[0], {"Z": np.zeros((1, 8), np.float32)}, want=1)[0].op == "error"
    assert gs.node.rejections.counts["invalid"] == before["invalid"] + 1
    before = dict(gs.node.rejections.counts)  # its own late result and leave (sent before it knew): dropped, uncounted
    assert result(gs, worker2, again[0], {"Z": np.zeros((1, 8), np.float32)}) == []
    assert leave(gs, worker2, second.lease)[0].op == "release" and gs.node.rejections.counts == before
    assert len(gs.platform.events) == 4  # two new leases for them
    assert [r["error"] for r in gs.task_rows if r["kind"] == "lease"] == ["died"]


def test_the_server_sends_parts_and_commits_a_streamed_result_only_whole(served):
    gs, client = served(stream_rows=40)
    rows = int(gs.state.bounds[1])  # chunk 0 of the one server
    parts = [t for t in hello(gs, client, gs.platform.events[0].lease, want=10) if t["task"]["chunk"] == 0]
    spans = [t["part"] for t in parts]
    assert spans == [[lo, min(lo + 40, rows)] for lo in range(0, rows, 40)] and all(t["rows"] == rows for t in parts)
    whole = gs.state.input_rows(0, rows)
    np.testing.assert_array_equal(parts[1].tensors["P"], whole[40:80])
    assert parts[1]["start"] == 0 and parts[1]["stop"] == rows  # the chunk's bounds: the worker offsets its ids
    z = np.ones((rows, gs.state.shapes[0].z_width), np.float32)

    def push(part, z_rows, want=0, **fields):
        return result(gs, client, parts[0], {"Z": z_rows}, want=want, part=part, **fields)

    for bad, why in [([0, rows + 1], "part end"), ([5, 5], "part end"), ([-1, 3], "part start"), ("0-3", "part")]:
        got = push(bad, z[:3], want=1)
        assert got[0].op == "error" and why in got[0]["reason"]
    assert "shape" in push([0, 3], z[:4], want=1)[0]["reason"]
    assert push([0, 40], z[:40]) == [] and len(gs.staging) == 1  # staged, unanswered
    assert "came before" in push([30, 50], z[30:50], want=1)[0]["reason"]
    assert "misses" in push([rows - 1, rows], z[-1:], want=1, last=True)[0]["reason"]  # rows 40.. never came
    assert not gs.state.ZG[True][0][:rows].any() and len(gs.staging) == 0  # nothing written, the parts gone
    for t in parts[:-1]:
        assert push(t["part"], z[slice(*t["part"])]) == []
    assert push(parts[-1]["part"], z[slice(*parts[-1]["part"])], last=True) == []
    np.testing.assert_array_equal(gs.state.ZG[True][0][:rows], z)
    assert len(gs.staging) == 0 and gs.stats["blocks"] == len(parts) + 2


@pytest.mark.parametrize("backend, offload, own", [("cpu", "all", 1), ("local", "all", 0), ("local", "auto", 1)])
def test_the_scheduler_counts_every_thread_and_lease_a_task_can_run_on(served, backend, offload, own):
    """The relaunch allowance spreads a queued copy's wait over the workers: the pool's leases and the
    server's own threads (the cpu backend's, or --offload auto's one beside the Lambdas)."""
    gs, _ = served(backend, offload=offload)
    pool = 0 if backend == "cpu" else gs.platform.concurrency
    assert gs.scheduler.tracker.workers == pool + own and own == (gs.direct.threads if gs.direct else 0)


def test_a_lease_with_no_task_for_its_idle_time_leaves_and_its_billing_ends(served):
    """``--lease-idle-ms`` reaches the worker in its lease event; a real worker's lease that gets no task for
    that long says so, is released, and its invocation returns (AWS stops billing it)."""
    gs, client = served(lease_idle_ms=150)
    first, second = gs.platform.events
    assert first.idle_ms == second.idle_ms == 150
    assert len(hello(gs, client, first.lease, want=2)) == 2  # epoch 1's two tasks go to the first lease
    out = {}
    worker = Lease(second, Session(KEY).for_job(bytes.fromhex(second.job)))
    thread = threading.Thread(target=lambda: out.update(worker.run()), daemon=True)
    began = time.monotonic()
    thread.start()
    while thread.is_alive() and time.monotonic() - began < 20:
        pump(gs, client, want=0, turns=1)
    took = time.monotonic() - began
    assert out.get("status") == "idle" and out.get("tasks") == 0 and 0.15 <= took < 10
    assert second.lease not in gs.dispatcher.leases and first.lease in gs.dispatcher.leases
