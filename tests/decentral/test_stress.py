"""Fifty randomised gossip jobs through the protocol's simulation (``simulation.py``): 2-8 workers,
random speeds and delays, most with a worker killed at a random moment, some with answers late enough
to be taken for a death, some stopped early by the target accuracy. None may hang; every recorded epoch
has all its batches trained; without deaths each exactly once. Real processes: ``test_faults.py``."""

from __future__ import annotations

import random

import pytest

from tests.decentral.simulation import Job


def _job(seed: int) -> Job:
    rng = random.Random(seed)
    world, epochs = rng.randint(2, 8), rng.randint(2, 6)
    per_epoch = rng.randint(1, 3 * world)
    kill_at = (rng.uniform(0, 2.0 * epochs * per_epoch / world),) if rng.random() < 0.7 else ()
    return Job(world, epochs, per_epoch, seed, kill_at=kill_at, late_rate=rng.choice([0.0, 0.0, 0.02]),
               target_epoch=rng.choice([0, 0, rng.randint(1, epochs)]))


@pytest.mark.parametrize("seed", range(50))
def test_random_job_ends_with_every_batch_trained(seed):
    job = _job(seed)
    workers = job.run()
    finals = [w for w in workers if w.wrote_final]
    if not finals:  # only acceptable when every worker died (the real job then stops with one line)
        assert all(w.pool.rank in w.pool.dead or not w.alive for w in workers) and not any(
            w.pool.stopped and w.pool.rank not in w.pool.dead for w in workers), f"seed {seed}: no record"
        return
    rows = finals[-1].ledger.rows
    last = rows[-1]["epoch"]
    assert [r["epoch"] for r in rows] == list(range(1, last + 1))
    assert last == job.epochs or last == job.target_epoch
    for e in range(1, last + 1):
        assert all(job.trained[e, b] >= 1 for b in range(job.per_epoch)), f"seed {seed}: epoch {e} lost a batch"
    if not job.killed and not any(w.pool.dead for w in workers):
        assert all(n == 1 for n in job.trained.values()), f"seed {seed}: a batch trained twice without deaths"
        assert all(w.pool.stopped for w in workers)


def test_the_simulation_does_kill_and_recover():
    """The fifty jobs above exercise what they claim: deaths, false alarms, early stops, repairs."""
    jobs = [_job(seed) for seed in range(50)]
    for job in jobs:
        job.run()
    died = sum(bool(job.killed) for job in jobs)
    retrained = sum(any(n > 1 for n in job.trained.values()) for job in jobs)
    early = sum(0 < job.target_epoch < job.epochs for job in jobs)
    assert died >= 20 and retrained >= 5 and early >= 5, (died, retrained, early)
