"""Resizable pools (``--lambdas auto``): the local emulator grows, shrinks (parking warm workers, stopped
after a while) and reports its load; the AWS platform's concurrency limit changes while calls wait, on
its own and through aiobotocore against an endpoint that holds the calls."""

import asyncio
import threading
import time
from http.server import ThreadingHTTPServer

import psutil
import pytest

from dorylus_py.platforms import LocalLambdaPlatform
from dorylus_py.platforms.aws import Slots
from dorylus_py.platforms.base import PoolLoad
from tests.worker import event_for


def until(what, timeout_s=120.0):
    """Poll ``what()`` until it is true (generous for a loaded machine); the condition, not a sleep, syncs."""
    deadline = time.monotonic() + timeout_s
    while not what():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


def bad_event(i):
    """An event the handler refuses at once (after the emulated latency): enough to keep a worker busy."""
    return event_for("not an address", lease=f"l{i}")


@pytest.fixture(scope="module", autouse=True)
def no_helper_process_left():
    """Starting workers in the test process starts multiprocessing's resource tracker and the workers'
    fork server there; stop them afterwards (those this module started), so that later tests counting
    this process's children (tests/cluster's ``running_children``, in the same xdist worker) see nothing
    of ours. The workers themselves are checked gone by each test's close."""
    from multiprocessing import forkserver, resource_tracker

    tracker, server = resource_tracker._resource_tracker, forkserver._forkserver
    tracker_here, server_here = tracker._pid is None, server._forkserver_pid is None
    yield
    if server_here and server._forkserver_pid is not None:
        server._stop()
    if tracker_here and tracker._pid is not None:
        tracker._stop()


def gone(pids) -> bool:
    return not any(psutil.pid_exists(p) for p in pids)


@pytest.fixture()
def pool():
    p = LocalLambdaPlatform(1, latency_ms=400)
    yield p
    pids = set(p.worker_pids()) | {w.proc.pid for w in p._parked}
    p.close()
    assert gone(pids)  # parked workers too


def test_a_pool_grows_reports_its_load_and_shrinks_into_warm_parked_workers(pool):
    assert pool.load() == PoolLoad(ready=1, waiting=0, busy=0)
    pool.resize(2)
    until(lambda: pool.load().ready == 2)  # a new, cold worker started
    pids = set(pool.worker_pids())
    for i in range(3):
        pool.invoke(bad_event(i))
    until(lambda: pool.load().busy == 2)
    assert pool.load().waiting == 1  # two workers, three tasks
    pool.resize(1)
    done = []
    until(lambda: done.extend(pool.completions()) or len(done) == 3)  # the busy one finished its task first
    assert not any(c.ok for c in done)
    until(lambda: pool.load().ready == 1)  # one parked, not stopped
    assert all(psutil.pid_exists(p) for p in pids)
    pool.resize(2)
    until(lambda: pool.load().ready == 2)
    assert set(pool.worker_pids()) == pids  # taken back warm: no new process


def test_a_worker_parked_too_long_is_stopped_and_a_later_growth_starts_a_new_one():
    pool = LocalLambdaPlatform(2, park_s=0.0)
    try:
        first = set(pool.worker_pids())
        pool.resize(1)
        until(lambda: len(pool.worker_pids()) == 1)
        (stopped,) = first - set(pool.worker_pids())
        until(lambda: not psutil.pid_exists(stopped))  # stopped and reaped
        pool.resize(2)
        until(lambda: pool.load().ready == 2)
        assert stopped not in pool.worker_pids()
        pids = set(pool.worker_pids())
    finally:
        pool.close()
    assert gone(pids)


def test_the_aws_concurrency_limit_changes_while_calls_wait():
    async def scenario():
        slots, release, inside = Slots(1), asyncio.Event(), []

        async def call(i):
            async with slots:
                inside.append(i)
                await release.wait()

        async def settle(what):
            while not what():
                await asyncio.sleep(0)

        calls = [asyncio.create_task(call(i)) for i in range(3)]
        await settle(lambda: slots.busy + slots.waiting == 3)
        assert (slots.busy, slots.waiting, len(inside)) == (1, 2, 1)
        await slots.resize(2)
        await settle(lambda: slots.busy == 2)
        assert (slots.waiting, len(inside)) == (1, 2)
        await slots.resize(1)  # a smaller limit stops nothing that runs ...
        release.set()
        await asyncio.gather(*calls)
        assert (slots.busy, slots.waiting, sorted(inside)) == (0, 0, [0, 1, 2])  # ... and lets the rest through

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_the_aws_platform_reports_calls_in_flight_and_lets_more_through_when_resized(monkeypatch):
    pytest.importorskip("aiobotocore")
    from dorylus_py.platforms.aws import AwsLambdaPlatform
    from tests.aws.test_lambda_platform import FakeLambdaApi

    release = threading.Event()

    class HeldApi(FakeLambdaApi):
        def do_POST(self):  # noqa: N802
            release.wait(120)
            super().do_POST()

    for k, v in {"AWS_ACCESS_KEY_ID": "t", "AWS_SECRET_ACCESS_KEY": "t"}.items():
        monkeypatch.setenv(k, v)
    FakeLambdaApi.script, FakeLambdaApi.bodies = [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), HeldApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    platform = AwsLambdaPlatform("dorylus", 1, 3008, region="us-east-1",
                                 endpoint_url=f"http://127.0.0.1:{server.server_address[1]}")
    try:
        for i in range(3):
            platform.invoke(event_for(lease=f"l{i}"))
        until(lambda: platform.load() == PoolLoad(ready=1, waiting=2, busy=1))
        platform.resize(3)
        until(lambda: platform.load() == PoolLoad(ready=3, waiting=0, busy=3))  # all three calls in flight
        release.set()
        done = []
        until(lambda: done.extend(platform.completions()) or len(done) == 3)
        assert all(c.ok for c in done) and platform.load().busy == 0
    finally:
        release.set()
        platform.close()
        server.shutdown()
