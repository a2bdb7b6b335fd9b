"""The scheduler, event in, instructions out: no sockets, no processes, no clock but the events'."""

from dorylus_py.pipeline import events as ev
import pytest

from dorylus_py.pipeline.scheduler import DRIVER_LAG, Scheduler
from dorylus_py.pipeline.stages import vertex_stages
from dorylus_py.pipeline.tasks import RelaunchPolicy
from dorylus_py.weights.store import MAX_SNAPSHOTS


def kinds(out):
    return [type(i).__name__ for i in out]


def test_sync_one_server_walks_an_epoch_and_reports_it():
    s = Scheduler(rank=0, chunks=2, layers=1, epochs=1, mode="sync")
    out = s.handle(ev.Tick(0.0))
    assert out == [ev.Invoke(ev.TaskKey("fwd", True, 1, 0, c), 1, 0, None) for c in (0, 1)]  # trains on version 0
    assert s.handle(ev.TaskPulled(ev.TaskKey("fwd", True, 1, 0, 0), 1, 0.1)) == [ev.Serve(ev.TaskKey("fwd", True, 1, 0, 0))]
    out = s.handle(ev.TaskResult(ev.TaskKey("fwd", True, 1, 0, 0), 1, 0.2, version=0))
    assert kinds(out) == ["Accept", "SendRows"]  # chunk 1 still runs: no Gather yet
    out = s.handle(ev.TaskResult(ev.TaskKey("fwd", True, 1, 0, 1), 1, 0.3, version=0))
    assert kinds(out) == ["Accept", "SendRows", "RunGraph"] and out[-1] == ev.RunGraph("gather", 1, 0, None)
    out = s.handle(ev.GraphDone("gather", 1, 0, None, 0.4))
    assert kinds(out) == ["Invoke", "Invoke"] and out[0].key.kind == "loss" and out[0].version is None
    for c in (0, 1):
        out = s.handle(ev.TaskResult(ev.TaskKey("loss", True, 1, 0, c), 1, 0.5))
    assert out[-1] == ev.RunGraph("gather_bwd", 1, 0, None)
    s.handle(ev.GraphDone("gather_bwd", 1, 0, None, 0.6))
    out = s.handle(ev.TaskResult(ev.TaskKey("bwd", True, 1, 0, 0), 1, 0.7, version=0))
    assert kinds(out) == ["Accept", "ForwardGradient"]  # layer 0: no dG to send anywhere
    out = s.handle(ev.TaskResult(ev.TaskKey("bwd", True, 1, 0, 1), 1, 0.7, version=0))
    assert out[-2:] == [ev.Invoke(ev.TaskKey("fwd", False, 1, 0, 0), 1, 1, None),  # evaluates version 1
                        ev.Invoke(ev.TaskKey("fwd", False, 1, 0, 1), 1, 1, None)]
    for c in (0, 1):
        s.handle(ev.TaskResult(ev.TaskKey("fwd", False, 1, 0, c), 1, 0.8, version=1))
    s.handle(ev.GraphDone("egather", 1, 0, None, 0.9))
    s.handle(ev.TaskResult(ev.TaskKey("eval", False, 1, 0, 0), 1, 1.0))
    out = s.handle(ev.TaskResult(ev.TaskKey("eval", False, 1, 0, 1), 1, 1.0))
    assert kinds(out) == ["Accept", "ReportEpoch", "SendProgress", "Finished"]
    s.validate()


def test_sync_gather_waits_for_every_peer_chunk():
    s = Scheduler(rank=0, chunks=1, layers=1, epochs=2, mode="sync", peers=(1,), peer_chunks=3)
    s.handle(ev.Tick(0.0))
    out = s.handle(ev.TaskResult(ev.TaskKey("fwd", True, 1, 0, 0), 1, 0.1, version=0))
    assert kinds(out) == ["Accept", "SendRows"]
    for i in range(3):
        out = s.handle(ev.RowsArrived("fwd", 1, 0, src=1))
        assert kinds(out) == ([] if i < 2 else ["RunGraph"])


def test_a_late_copy_is_cancelled_and_a_duplicate_refused():
    s = Scheduler(rank=0, chunks=1, layers=1, epochs=3, mode="async", policy=RelaunchPolicy(min_s=1.0))
    key = ev.TaskKey("fwd", True, 1, 0, 0)
    assert s.handle(ev.Tick(0.0)) == [ev.Invoke(key, 1, None, (1, 0, 0))]  # async: newest weights, held
    out = s.handle(ev.Tick(1.5))
    assert out == [ev.Invoke(key, 2, None, (1, 0, 0))]  # overdue: a second copy, the same event
    assert s.handle(ev.Tick(100.0)) == []  # two copies out: no third
    assert kinds(s.handle(ev.TaskResult(key, 2, 100.1, version=0))) == ["Accept", "SendRows", "RunGraph"]
    assert s.handle(ev.TaskPulled(key, 1, 100.2)) == [ev.Cancel(key, "already done")]
    assert s.handle(ev.TaskResult(key, 1, 100.3, version=0)) == [ev.Cancel(key, "duplicate")]


def test_a_task_that_always_fails_stops_the_server_with_its_error():
    s = Scheduler(rank=0, chunks=1, layers=1, epochs=1, mode="sync", policy=RelaunchPolicy(max_attempts=3))
    key = ev.TaskKey("fwd", True, 1, 0, 0)
    out = s.handle(ev.Tick(0.0))
    for attempt in (1, 2, 3):
        out = s.handle(ev.TaskEnded(key, attempt, ok=False, now=float(attempt), error="ValueError: bad weights"))
    out = s.handle(ev.Tick(10.0))
    assert out == [ev.Stuck("task fwd epoch 1 layer 0 chunk 0 failed 3 times; last error: ValueError: bad weights")]


def test_no_progress_for_too_long_is_reported_with_where_it_stands():
    s = Scheduler(rank=0, chunks=1, layers=1, epochs=1, mode="sync", peers=(1,), peer_chunks=1, stall_s=30)
    s.handle(ev.Tick(0.0))
    s.handle(ev.TaskResult(ev.TaskKey("fwd", True, 1, 0, 0), 1, 1.0, version=0))
    assert s.handle(ev.Tick(30.5)) == []
    (stuck,) = s.handle(ev.Tick(31.5))
    assert "no progress for 30 s" in stuck.reason and "1:gather/0" in stuck.reason


def test_async_staleness_gate_holds_a_fast_server_for_a_slow_peer():
    s = Scheduler(rank=0, chunks=1, layers=1, epochs=5, mode="async", staleness=1, peers=(1,))
    s.handle(ev.Tick(0.0))
    for epoch in (1, 2):  # the peer stays in epoch 1
        finish_epoch_alone(s, epoch)
    assert s.pipe.epoch == [3] and not s.tracker.running  # epoch 3 - slowest 1 > 1: waits
    out = s.handle(ev.PeerProgress(1, 2))
    assert out == [ev.Invoke(ev.TaskKey("fwd", True, 3, 0, 0), 1, None, (3, 0, 0))]


def finish_epoch_alone(s, epoch):
    """Play one chunk of a one-layer, one-chunk server through an epoch."""
    for kind, train, graph in (("fwd", True, "gather"), ("loss", True, "gather_bwd"), ("bwd", True, None),
                               ("fwd", False, "egather"), ("eval", False, None)):
        s.handle(ev.TaskResult(ev.TaskKey(kind, train, epoch, 0, 0), 1, 0.0, version=epoch - 1))
        if graph:
            s.handle(ev.GraphDone(graph, epoch, 0, None if s.sync else 0, 0.0))


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_no_epoch_starts_more_than_driver_lag_past_the_drivers_record(mode):
    """The weight servers keep every epoch's snapshot until the driver has recorded it (at most 64 a layer):
    a driver that falls behind holds the graph servers back instead of finding its snapshot gone."""
    assert DRIVER_LAG + 2 + 4 < MAX_SNAPSHOTS  # ahead of the driver, plus staleness and the newest kept
    s = Scheduler(rank=0, chunks=1, layers=1, epochs=DRIVER_LAG + 5, mode=mode, staleness=2)
    s.handle(ev.Tick(0.0))
    for epoch in range(1, DRIVER_LAG + 1):  # the driver has recorded nothing yet
        finish_epoch_alone(s, epoch)
    assert s.pipe.epoch == [DRIVER_LAG + 1] and not s.tracker.running  # waits for the driver
    assert s.handle(ev.Tick(1.0)) == []
    out = s.handle(ev.DriverRecorded(1))
    assert [i.key for i in out if isinstance(i, ev.Invoke)] == [ev.TaskKey("fwd", True, DRIVER_LAG + 1, 0, 0)]


def test_freeze_then_switch_runs_later_epochs_synchronously():
    s = Scheduler(rank=0, chunks=1, layers=1, epochs=4, mode="async", staleness=1)
    s.handle(ev.Tick(0.0))
    assert s.handle(ev.Freeze()) == [ev.Frozen(2)]  # epoch 1 has started: it is the last asynchronous one
    s.handle(ev.SwitchAt(2))
    finish_epoch_alone(s, 1)
    assert s.sync
    (key,) = s.tracker.running
    assert key.epoch == 2 and s.invocations[key] == (1, None)  # sync's version rule, no hold


def test_fused_last_layer_graph_stages_send_their_rows_and_the_fused_task_trains_on_the_epochs_weights():
    """Sync: ``activate`` and ``activate_bwd`` run for all rows and then send every chunk's rows to the peers
    (the peers' Gather and Gather backward wait for them); the one fused task per chunk pulls version
    epoch - 1, carries the gradient and sends its contributions."""
    s = Scheduler(rank=0, chunks=2, layers=2, epochs=1, mode="sync", peers=(1,), peer_chunks=1,
                  stages=tuple(vertex_stages(2, fused=True)))
    s.handle(ev.Tick(0.0))
    s.handle(ev.RowsArrived("fwd", 1, 0, src=1))
    for c in (0, 1):
        out = s.handle(ev.TaskResult(ev.TaskKey("fwd", True, 1, 0, c), 1, 0.1, version=0))
    assert out[-1] == ev.RunGraph("gather", 1, 0, None)
    out = s.handle(ev.GraphDone("gather", 1, 0, None, 0.2))
    assert out == [ev.RunGraph("activate", 1, 1, None)]
    out = s.handle(ev.GraphDone("activate", 1, 1, None, 0.3))
    assert out == [ev.SendRows("fwd", 1, 1, 0), ev.SendRows("fwd", 1, 1, 1)]  # the Gather waits for the peer's
    out = s.handle(ev.RowsArrived("fwd", 1, 1, src=1))
    assert out == [ev.RunGraph("gather", 1, 1, None)]
    out = s.handle(ev.GraphDone("gather", 1, 1, None, 0.4))
    assert out == [ev.Invoke(ev.TaskKey("fused", True, 1, 1, c), 1, 0, None) for c in (0, 1)]  # version 0, no hold
    out = s.handle(ev.TaskResult(ev.TaskKey("fused", True, 1, 1, 0), 1, 0.5, version=0))
    assert out == [ev.Accept(ev.TaskKey("fused", True, 1, 1, 0)), ev.SendRows("bwd", 1, 1, 0),
                   ev.ForwardGradient(ev.TaskKey("fused", True, 1, 1, 0), 0)]
    s.handle(ev.TaskResult(ev.TaskKey("fused", True, 1, 1, 1), 1, 0.5, version=0))
    out = s.handle(ev.RowsArrived("bwd", 1, 1, src=1))
    assert out == [ev.RunGraph("gather_bwd", 1, 1, None)]
    assert s.handle(ev.GraphDone("gather_bwd", 1, 1, None, 0.6)) == [ev.RunGraph("activate_bwd", 1, 1, None)]
    out = s.handle(ev.GraphDone("activate_bwd", 1, 1, None, 0.7))
    assert out == [ev.SendRows("bwd", 1, 0, 0), ev.SendRows("bwd", 1, 0, 1)]
    s.validate()


def test_async_fused_task_pulls_the_newest_weights_and_graph_jobs_send_their_chunks_rows():
    s = Scheduler(rank=0, chunks=2, layers=2, epochs=2, mode="async", stages=tuple(vertex_stages(2, fused=True)))
    s.handle(ev.Tick(0.0))
    s.handle(ev.TaskResult(ev.TaskKey("fwd", True, 1, 0, 1), 1, 0.1, version=0))
    assert s.handle(ev.GraphDone("gather", 1, 0, 1, 0.2)) == [ev.RunGraph("activate", 1, 1, 1)]
    assert s.handle(ev.GraphDone("activate", 1, 1, 1, 0.3)) == [ev.SendRows("fwd", 1, 1, 1), ev.RunGraph("gather", 1, 1, 1)]
    assert s.handle(ev.GraphDone("gather", 1, 1, 1, 0.4)) == [ev.Invoke(ev.TaskKey("fused", True, 1, 1, 1), 1, None, None)]


def test_rows_read_ahead_only_until_a_chunk_here_starts_the_stage_that_reads_them():
    """``reads_ahead``: a peer's fwd rows of (epoch, layer) are in time while no chunk here has started
    that epoch's Gather of the layer; its bwd contributions, while none has started that Gather backward."""
    s = Scheduler(rank=0, chunks=2, layers=1, epochs=3, mode="async", staleness=1, peers=(1,))
    s.handle(ev.Tick(0.0))
    assert s.reads_ahead("fwd", 1, 0) and s.reads_ahead("bwd", 1, 0) and s.reads_ahead("fwd", 2, 0)
    s.handle(ev.TaskResult(ev.TaskKey("fwd", True, 1, 0, 0), 1, 0.1, version=0))  # chunk 0's Gather 0 starts
    assert not s.reads_ahead("fwd", 1, 0)  # read (stale) already: these rows are late
    assert s.reads_ahead("bwd", 1, 0) and s.reads_ahead("fwd", 2, 0)
    assert not s.reads_ahead("efwd", 1, 0)  # the evaluation pass's rows are not counted


def _gathers(out):
    return [i for i in out if isinstance(i, ev.RunGraph)]


@pytest.mark.parametrize("rows_come", [True, False])
def test_fresh_wait_holds_a_gather_for_the_peers_rows_of_its_epoch_until_they_come_or_the_wait_ends(rows_come):
    s = Scheduler(rank=0, chunks=1, layers=1, epochs=3, mode="async", staleness=1, peers=(1,), peer_chunks=2,
                  fresh_wait_s=0.05)
    s.handle(ev.Tick(0.0))
    assert _gathers(s.handle(ev.TaskResult(ev.TaskKey("fwd", True, 1, 0, 0), 1, 0.1, version=0))) == []
    assert _gathers(s.handle(ev.RowsArrived("fwd", 1, 0, 1, 1))) == []  # one of the peer's two chunks
    assert _gathers(s.handle(ev.Tick(0.14))) == []
    out = s.handle(ev.RowsArrived("fwd", 1, 0, 1, 1)) if rows_come else s.handle(ev.Tick(0.16))
    assert _gathers(out) == [ev.RunGraph("gather", 1, 0, 0)]
    assert s.held == {}


def test_without_fresh_wait_a_gather_reads_what_has_come():
    s = Scheduler(rank=0, chunks=1, layers=1, epochs=3, mode="async", staleness=1, peers=(1,), peer_chunks=2)
    s.handle(ev.Tick(0.0))
    assert _gathers(s.handle(ev.TaskResult(ev.TaskKey("fwd", True, 1, 0, 0), 1, 0.1, version=0))) == [
        ev.RunGraph("gather", 1, 0, 0)]
