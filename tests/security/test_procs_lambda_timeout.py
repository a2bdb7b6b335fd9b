"""A frozen emulated Lambda (SIGSTOP) is killed at ``--lambda-timeout-s`` plus a grace, as AWS kills a function
at its timeout: its invocation fails as timed out, a fresh worker takes its slot, and the task's relaunch runs
there, even with one worker per graph server; the job ends with the losses of an undisturbed run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from dorylus_py.platforms import LocalLambdaPlatform
from dorylus_py.platforms.local import KILL_GRACE_S
from tests.platforms.test_resizable_pools import no_helper_process_left, until  # noqa: F401  (a fixture)
from tests.worker import event_for

TIMEOUT_S = 2.0


def test_a_stopped_worker_is_killed_at_its_timeout_and_replaced():
    pool = LocalLambdaPlatform(1, timeout_s=TIMEOUT_S)
    try:
        frozen = pool.worker_pids()[0]
        os.kill(frozen, signal.SIGSTOP)
        pool.invoke(event_for("not an address", lease="l0"))
        done = []
        until(lambda: done.extend(pool.completions()) or done, timeout_s=TIMEOUT_S + KILL_GRACE_S + 60)
        assert [(c.ok, c.task["lease"]) for c in done] == [(False, "l0")]
        assert done[0].error == f"Sandbox.Timedout: Task timed out after {TIMEOUT_S:.2f} seconds"
        assert done[0].billed_ms == TIMEOUT_S * 1000 and pool.timed_out == 1
        until(lambda: not psutil.pid_exists(frozen))  # killed, stopped as it was
        assert pool.worker_pids() != [frozen]
        pool.invoke(event_for("not an address", lease="l1"))  # the relaunch finds a fresh worker in a pool of one
        until(lambda: done.extend(pool.completions()) or len(done) == 2)
        assert done[1].task["lease"] == "l1" and "Timedout" not in done[1].error  # it ran (and refused the address)
    finally:
        pool.close()


def _lambda_workers(root: psutil.Process) -> list[psutil.Process]:
    """The emulated Lambdas under ``root``: the children of the graph servers' fork servers."""
    out = []
    for p in root.children(recursive=True):
        try:
            if "forkserver" in " ".join(p.parent().cmdline()):
                out.append(p)
        except (psutil.NoSuchProcess, AttributeError):
            pass
    return out


def _train(tmp_path, name: str, freeze: bool) -> tuple[list[float], list[dict], float | None]:
    """A sync job (dropout 0: deterministic) with one Lambda per graph server; with ``freeze``, one emulated
    Lambda is SIGSTOPped once an epoch is recorded. The per-epoch losses, the task records, and how long the
    job ran after the freeze."""
    out = tmp_path / name
    job = subprocess.Popen([sys.executable, "-m", "dorylus_py", "train", "--data", str(tmp_path / "g.npz"), "--out",
                            str(out), "--backend", "local", "--graph-servers", "2", "--lambdas", "2", "--epochs", "25",
                            "--dropout", "0", "--mode", "sync", "--lambda-timeout-s", str(TIMEOUT_S), "--quiet"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    frozen_at = None
    try:
        if freeze:
            metrics = out / "metrics.jsonl"
            until(lambda: job.poll() is not None or (metrics.exists() and metrics.read_text().count("\n") >= 2), 300)
            assert job.poll() is None, "the job ended before a Lambda could be frozen"
            victim = _lambda_workers(psutil.Process(job.pid))[0]
            victim.suspend()
            frozen_at = time.monotonic()
        assert job.wait(timeout=400) == 0, job.stderr.read()
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    after = time.monotonic() - frozen_at if frozen_at else None
    losses = [json.loads(x)["loss"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    tasks = [json.loads(x) for x in (out / "tasks.jsonl").read_text().splitlines()]
    return losses, tasks, after


@pytest.mark.timeout(900)
@pytest.mark.long
def test_a_job_with_a_frozen_lambda_ends_with_the_undisturbed_losses(tmp_path):
    assert subprocess.run([sys.executable, "-m", "dorylus_py", "synth", "--out", str(tmp_path / "g.npz"), "--nodes",
                           "400", "--edges", "3000", "--features", "8", "--classes", "3"], capture_output=True).returncode == 0
    calm, _, _ = _train(tmp_path, "calm", freeze=False)
    frozen, tasks, after = _train(tmp_path, "frozen", freeze=True)
    assert frozen == calm and len(calm) == 25
    timed_out = [t for t in tasks if "Task timed out" in t["error"]]
    assert len(timed_out) == 1 and not timed_out[0]["ok"]
    # the stall lasted the timeout and its grace, not the 300 s after which a stuck job fails
    assert after < 150, after


def test_the_lab_lambda_service_kills_a_stopped_worker_frees_its_slot_and_runs_the_next_call():
    from dorylus_py.lab.lambda_service import Function, LambdaService
    from dorylus_py.lab.sigv4 import Credentials

    service = LambdaService(Function(timeout_s=TIMEOUT_S, concurrency=1), Credentials("AKID", "secret", "us-east-1"),
                            b"k" * 32, ("127.0.0.1", 0))
    try:
        frozen = service.pool.worker_pids()[0]
        os.kill(frozen, signal.SIGSTOP)
        first = service.invoke(event_for("not an address", lease="l0").to_dict())
        assert not first.ok and "Task timed out" in first.error and first.where == "local-lambda"  # the pool's, not the guard's
        until(lambda: not psutil.pid_exists(frozen))
        second = service.invoke(event_for("not an address", lease="l1").to_dict())  # not throttled: the slot is free
        assert second is not None and second.task["lease"] == "l1" and "Timedout" not in second.error
        assert service.stats["throttled"] == 0 and service.stats["function_errors"] == 2
    finally:
        service.close()
