"""Asynchronous mode, checked from the task record itself: in `tasks.jsonl`, chunks of different epochs
really ran at the same time, no chunk ever ran more than --staleness epochs ahead of the slowest, and a
run that switched back to sync mode ran its later epochs with a barrier after every stage.

Each check is also run where it must come out the other way (sync mode, staleness 0, the epochs before
the switch), so that it cannot pass for a run that did not do what is claimed. Only the tasks' start
times are compared: a tensor task pushes its result before its worker takes its end time, so a server
may act on a result before that result's task "ended"; a start, though, is always before its result.
All times are `time.time()` on this one machine. The scheduling checks turn off the local barrier and
the fresh wait (async's defaults), which hold graph stages back on purpose.
"""

import json
import time

import pytest

from dorylus_py.cluster.launcher import train_distributed
from dorylus_py.config import TrainConfig
from dorylus_py.partition import prepare
from dorylus_py.training import RunRecord
from dorylus_py.training.record import read_lines


@pytest.fixture(scope="module")
def parts(small_graph, tmp_path_factory):
    path = tmp_path_factory.mktemp("async") / "parts"
    prepare(small_graph, path, 2)
    return path


def run(parts, tmp_path, name, **kw) -> tuple[dict, list[dict]]:
    """A `local` job with 3 chunks and 3 emulated Lambdas per graph server; no relaunch (so no
    duplicate task rows) however loaded the machine. Returns the summary and the tasks that counted."""
    cfg = TrainConfig(**{"backend": "local", "graph_servers": 2, "chunks": 3, "lambdas": 6, "dropout": 0.0,
                         "feature_norm": "none", "relaunch_min_s": 120.0} | kw)
    record = RunRecord(tmp_path / name, cfg.to_dict())
    summary = train_distributed(cfg, parts, record, "none", show_progress=False).summary
    rows = [json.loads(line) for line in (tmp_path / name / "tasks.jsonl").read_text().splitlines()]
    first: dict[tuple, dict] = {}  # the first result of a task is the one its server accepted
    for r in sorted((r for r in rows if r["ok"]), key=lambda r: r["end"]):
        first.setdefault((r["server"], r["chunk"], r["epoch"], r["layer"], r["kind"], r["train"]), r)
    return summary, list(first.values())


def starts(tasks: list[dict], key) -> dict:
    """key(task) -> (first start, last start) of the tasks with that key."""
    out: dict = {}
    for t in tasks:
        k = key(t)
        first, last = out.get(k, (t["start"], t["start"]))
        out[k] = (min(first, t["start"]), max(last, t["start"]))
    return out


def epoch_leads(tasks: list[dict]) -> list[float]:
    """Per server and epoch e: seconds by which its epoch e+1 began before the last task of its epoch e
    began (> 0: the epochs overlapped)."""
    span = starts(tasks, lambda t: (t["server"], t["epoch"]))
    return [span[(k, e)][1] - span[(k, e + 1)][0] for k, e in span if (k, e + 1) in span]


def max_lead(tasks: list[dict]) -> int:
    """The most epochs by which a chunk, when it began an epoch, was ahead of the slowest chunk of the job:
    the lowest epoch whose last task some chunk had not begun yet."""
    span = starts(tasks, lambda t: (t["server"], t["chunk"], t["epoch"]))
    chunks = {(k, c) for k, c, _ in span}
    lead = 0
    for (k, c, e), (began, _) in span.items():
        slowest = min(min((e2 for (k2, c2, e2), (_, last) in span.items() if (k2, c2) == other and last > began),
                          default=e) for other in chunks)
        lead = max(lead, e - slowest)
    return lead


def barrier_breaks(tasks: list[dict], server: int, epoch: int) -> int:
    """In one server's epoch, how many tensor stages (training forward per layer, loss, backward per layer,
    evaluation forward per layer, eval) began before the previous stage's last task began. With a barrier
    after each stage (sync mode) none can: a stage is launched once every result of the one before is in."""
    layers = 1 + max(t["layer"] for t in tasks)
    order = {("fwd", True, l): l for l in range(layers)} | {("loss", True, layers - 1): layers} | {
        ("bwd", True, l): 2 * layers - l for l in range(layers)} | {
        ("fwd", False, l): 2 * layers + 1 + l for l in range(layers)} | {("eval", False, layers - 1): 3 * layers + 1}
    span = starts([t for t in tasks if t["server"] == server and t["epoch"] == epoch
                   and (t["kind"], t["train"], t["layer"]) in order],
                  lambda t: order[(t["kind"], t["train"], t["layer"])])
    stages = [span[i] for i in sorted(span)]
    return sum(b[0] < a[1] for a, b in zip(stages, stages[1:]))


def test_chunks_of_different_epochs_overlap_within_the_staleness_bound(parts, tmp_path):
    _, tasks = run(parts, tmp_path, "s1", epochs=4, mode="async", staleness=1, local_barrier=False,
                   fresh_wait_ms=0.0)
    leads = epoch_leads(tasks)
    assert max(leads) > 0, f"no epoch began before the previous one's last task: {leads}"
    assert max_lead(tasks) == 1  # ran ahead, and never more than --staleness 1
    assert any(barrier_breaks(tasks, k, e) for k in (0, 1) for e in range(1, 5))


@pytest.mark.long
def test_staleness_zero_and_sync_mode_never_overlap_epochs(parts, tmp_path):
    _, s0 = run(parts, tmp_path, "s0", epochs=4, mode="async", staleness=0, local_barrier=False,
                fresh_wait_ms=0.0)
    _, sync = run(parts, tmp_path, "sync", epochs=4, mode="sync")
    for name, tasks in (("s0", s0), ("sync", sync)):
        assert max(epoch_leads(tasks)) < 0, (name, epoch_leads(tasks))
    assert max_lead(s0) == 0  # no chunk starts an epoch before every chunk of the job finished the last
    assert any(barrier_breaks(s0, k, e) for k in (0, 1) for e in range(1, 5))  # within an epoch: no barriers
    assert not any(barrier_breaks(sync, k, e) for k in (0, 1) for e in range(1, 5))


def early_gathers(tasks: list[dict]) -> int:
    """Training Gathers that began before some chunk of their own server had begun the forward task whose
    rows they read (that chunk's rows were then still of an earlier epoch)."""
    fwd = starts([t for t in tasks if t["kind"] == "fwd" and t["train"]], lambda t: (t["server"], t["epoch"], t["layer"]))
    return sum(t["start"] < fwd[(t["server"], t["epoch"], t["layer"])][1]
               for t in tasks if t["kind"] == "gather" and t["train"])


@pytest.mark.long
def test_local_barrier_makes_gathers_wait_for_the_servers_own_chunks(parts, tmp_path):
    """One emulated Lambda per server and 3 chunks: a chunk's forward comes back long before the server's
    last chunk's forward begins. Without the barrier its Gather runs at once, on that chunk's old rows;
    with it, only once every chunk of the server has its rows of the epoch."""
    free, barrier = ({"epochs": 3, "mode": "async", "staleness": 0, "lambdas": 2, "local_barrier": b,
                      "fresh_wait_ms": 0.0} for b in (False, True))
    _, without = run(parts, tmp_path, "free", **free)
    summary, with_barrier = run(parts, tmp_path, "barrier", **barrier)
    assert early_gathers(without) > 0
    assert early_gathers(with_barrier) == 0 and sum(t["kind"] == "gather" for t in with_barrier) > 0
    assert summary["epochs"] == 3
    assert max_lead(with_barrier) == 0


SWITCH_EPOCHS = 12


@pytest.mark.long
def test_switch_to_sync_runs_later_epochs_with_barriers(parts, tmp_path, monkeypatch):
    """The switch level (--target-acc minus --switch-threshold) is 0.01, so the first epoch's report
    triggers it: the driver asks every server to freeze, and sync mode begins at the first epoch none of
    them had begun. The servers run ahead of the driver by however long it takes to record an epoch (one
    epoch idle, five on a loaded machine), so which epoch that is depends on the load; what does not is
    checked here: every task of the sync epochs began after the driver asked (the moment it sent the
    freeze, taken by wrapping its send), none before; and with 12 epochs the servers would have to be
    11 ahead of the driver's first record for no sync epoch to be left to check."""
    from dorylus_py.cluster.driver_link import DriverLink

    asked: list[float] = []
    send = DriverLink.send

    def send_and_note(link, name, msg):
        if msg.op == "switch" and msg.get("at_epoch") is None:
            asked.append(time.time())
        send(link, name, msg)

    monkeypatch.setattr(DriverLink, "send", send_and_note)
    summary, tasks = run(parts, tmp_path, "switch", epochs=SWITCH_EPOCHS, mode="async", staleness=1, target_acc=0.99,
                         switch_threshold=0.98, local_barrier=False, fresh_wait_ms=0.0)
    at = summary["switched_to_sync_at"]
    assert at is not None and 2 <= at < SWITCH_EPOCHS, at  # epoch 1 began before any report
    assert len(asked) == 2  # one freeze to each server
    assert min(t["start"] for t in tasks if t["epoch"] >= at) > min(asked)  # frozen at a boundary after the ask
    assert summary["weight_updates"] == SWITCH_EPOCHS * 2  # one per layer and epoch, before the switch and after
    after = [t for t in tasks if t["epoch"] >= at]
    assert after and not any(barrier_breaks(tasks, k, e) for k in (0, 1) for e in range(at, SWITCH_EPOCHS + 1))
    assert all(t["chunk"] is None for t in after if t["kind"] in ("gather", "gather_bwd"))  # whole-server Gathers
    assert max(epoch_leads([t for t in tasks if t["epoch"] >= at - 1])) < 0
    before = [t for t in tasks if t["epoch"] < at]
    assert any(barrier_breaks(before, k, e) for k in (0, 1) for e in range(1, at))  # asynchronous until then


def test_sync_epochs_run_with_barriers_and_compute_what_sync_mode_does(parts, tmp_path):
    """--sync-epochs 1 (Dorylus's first epoch): epoch 1 of an async job has a barrier after every stage and
    the loss and accuracies of sync mode's epoch 1; the epochs after it run without barriers."""
    summary, tasks = run(parts, tmp_path, "sync1", epochs=4, mode="async", staleness=1, sync_epochs=1,
                         local_barrier=False, fresh_wait_ms=0.0)
    assert summary["epochs"] == 4
    assert not any(barrier_breaks(tasks, k, 1) for k in (0, 1))
    assert any(barrier_breaks(tasks, k, e) for k in (0, 1) for e in range(2, 5))
    run(parts, tmp_path, "sync", epochs=1, mode="sync")
    ours, sync = (read_lines(tmp_path / name / "metrics.jsonl") for name in ("sync1", "sync"))
    for key in ("loss", "train_acc", "val_acc"):
        assert ours[0][key] == pytest.approx(sync[0][key], rel=1e-4), key


@pytest.mark.long
def test_a_driver_slower_than_its_servers_holds_them_within_driver_lag(parts, tmp_path, monkeypatch):
    """A driver that takes 0.4 s to record an epoch: the weight servers keep each epoch's snapshot until the
    driver has recorded it (64 a layer at most), so without a bound the driver of a long job on a loaded
    machine asks for one that is gone. The job of 2 x DRIVER_LAG + 10 epochs ends, and no task starts
    more than DRIVER_LAG epochs past the last the driver had recorded (how far the servers get ahead
    depends on the machine; the bound itself is checked in tests/pipeline/test_scheduler.py)."""
    from dorylus_py.cluster import launcher
    from dorylus_py.pipeline.scheduler import DRIVER_LAG

    recorded: list[tuple[float, int]] = []  # (when, epoch): noted before the servers hear of it
    done = launcher._Run.epoch_done

    def slow(run_, link, epoch, parts_):
        time.sleep(0.4)
        stop = done(run_, link, epoch, parts_)
        recorded.append((time.time(), epoch))
        return stop

    monkeypatch.setattr(launcher._Run, "epoch_done", slow)
    epochs = 2 * DRIVER_LAG + 10
    summary, tasks = run(parts, tmp_path, "slow", epochs=epochs, mode="async", staleness=1, lambdas=2)
    assert summary["epochs"] == epochs
    lead = max(t["epoch"] - max((e for at, e in recorded if at <= t["start"]), default=0) for t in tasks)
    assert 1 < lead <= DRIVER_LAG


def peer_rows(run_dir) -> list[tuple[int, int]]:
    """Per graph server: (peer messages in time for their epoch's read, late ones), from its end log line."""
    out = []
    for log in sorted((run_dir / "logs").glob("graph-server-*.log")):
        end = next(line for line in log.read_text().splitlines() if " end {" in line)
        fields = json.loads(end.split(" end ", 1)[1])
        out.append((fields["peer_rows_fresh"], fields["peer_rows_late"]))
    return out


def test_fresh_wait_makes_every_read_of_the_peers_rows_of_its_own_epoch(parts, tmp_path):
    """With a wait longer than any lag here, no graph stage reads a peer's rows before that peer's rows of
    its epoch came: every message is in time (late is 0), and no Gather started before the peer's forward
    of the same epoch and layer had even begun. Without it the same job counts the same messages."""
    common = {"epochs": 4, "mode": "async", "staleness": 1, "lambdas": 4, "local_barrier": True, "stale_smoothing": 0.0}
    summary, tasks = run(parts, tmp_path, "wait", fresh_wait_ms=5000.0, **common)
    assert summary["epochs"] == 4
    counts = peer_rows(tmp_path / "wait")
    assert len(counts) == 2 and all(fresh > 0 and late == 0 for fresh, late in counts), counts
    fwd = starts([t for t in tasks if t["kind"] == "fwd" and t["train"]], lambda t: (t["server"], t["epoch"], t["layer"]))
    gathers = [t for t in tasks if t["kind"] == "gather" and t["train"]]
    assert gathers and all(g["start"] >= fwd[(1 - g["server"], g["epoch"], g["layer"])][1] for g in gathers)
    run(parts, tmp_path, "nowait", fresh_wait_ms=0.0, **common)
    assert [sum(c) for c in peer_rows(tmp_path / "nowait")] == [sum(c) for c in counts]
