"""The pool autotuner: its rules one by one, and closed loops against a simulated graph server."""

from dataclasses import dataclass

import pytest

from dorylus_py.pipeline.autotune import PoolTuner, Resize, TunerPolicy


def window(t: PoolTuner, start: float, *, ready=None, waiting=0, busy=0, graph=False, runs=(("fwd", 0.1),) * 8,
           span=1.0, epoch=None):
    """Feed one window, epoch ``int(start)`` unless given: a sample at ``start`` and one at ``start + span``
    in the next epoch, tasks finished between."""
    ready = t.size if ready is None else ready
    epoch = int(start) if epoch is None else epoch
    assert t.sample(start, ready, waiting, busy, graph, epoch) is None or start == 0
    for kind, s in runs:
        t.finished(kind, s)
    return t.sample(start + span, ready, waiting, busy, graph, epoch + 1)


def test_the_warm_up_windows_decide_nothing_and_a_growth_needs_one_window_of_waiting_tasks():
    t = PoolTuner(2, TunerPolicy(low=1, high=8))
    assert t.policy.warmup == 2
    assert window(t, 0.0, waiting=3, busy=2) is None  # the job's first epochs: warm-up
    assert window(t, 1.0, waiting=3, busy=2) is None
    assert t.recent == []  # not set against a growth either
    d = window(t, 2.0, waiting=3, busy=2)
    assert d == Resize(4, d.reason) and "3.0 tasks waited" in d.reason and "at most 5 wanted" in d.reason
    t = PoolTuner(2, TunerPolicy(warmup=1, low=1, high=8))
    assert window(t, 0.0, waiting=3, busy=2) is None
    d = window(t, 1.0, waiting=3, busy=2)
    assert d == Resize(4, d.reason) and "3.0 tasks waited" in d.reason and "at most 5 wanted" in d.reason
    assert t.size == 4


def test_grows_to_twice_its_size_but_never_past_the_tasks_wanted_at_once():
    for size, waiting, grown in ((4, 4, 8), (2, 14, 4), (3, 9, 6), (4, 1, 5), (1, 3, 2)):
        t = PoolTuner(size, TunerPolicy(warmup=1, low=1, high=16))
        window(t, 0.0, waiting=waiting, busy=size)
        assert window(t, 1.0, waiting=waiting, busy=size).size == grown, (size, waiting)
    t = PoolTuner(7, TunerPolicy(warmup=1, low=1, high=8))
    window(t, 0.0, waiting=9, busy=7)
    assert window(t, 1.0, waiting=9, busy=7).size == 8  # never past high


def test_does_not_grow_while_the_graph_stages_are_the_bottleneck_nor_when_no_size_saves_a_round():
    t = PoolTuner(2, TunerPolicy(warmup=1, low=1, high=8))
    for i in range(5):
        assert window(t, float(i), waiting=3, busy=2, graph=True) is None
    assert t.size == 2
    t = PoolTuner(7, TunerPolicy(warmup=1, low=1, high=8))  # tasks waited (workers were slow to take them), but at
    for i in range(2):  # most 5 were wanted at once: 7 workers take them all already
        assert window(t, float(i), waiting=1, busy=4) is None
    assert t.size == 7


def test_a_growth_that_only_slowed_tasks_is_undone_and_not_retried_for_a_while():
    t = PoolTuner(2, TunerPolicy(warmup=1, low=1, high=8, hold=3))
    window(t, 0.0, waiting=2, busy=2)
    assert window(t, 1.0, waiting=2, busy=2).size == 4
    # twice the workers, twice the run time: as many tasks a second, for twice the billed seconds (the
    # first window after a growth is left out: new workers' first tasks fill their caches)
    assert window(t, 2.0, waiting=0, busy=4, runs=(("fwd", 0.4),) * 8) is None
    d = window(t, 3.0, waiting=0, busy=4, runs=(("fwd", 0.2),) * 8)
    assert d.size == 2 and "raised throughput only 1.00x" in d.reason
    for i in range(4, 7):  # held: tasks wait, but 4 is not tried again yet
        assert window(t, float(i), waiting=2, busy=2) is None
    assert window(t, 7.0, waiting=2, busy=2).size == 4  # the hold is over


def test_a_growth_that_paid_only_after_its_first_window_is_kept():
    t = PoolTuner(2, TunerPolicy(warmup=1, low=1, high=8))
    window(t, 0.0, waiting=2, busy=2)
    assert window(t, 1.0, waiting=2, busy=2).size == 4
    assert window(t, 2.0, waiting=0, busy=4, runs=(("fwd", 0.3),) * 8) is None  # new workers warming: slow
    assert window(t, 3.0, waiting=0, busy=4, span=0.8) is None and t.size == 4


def test_a_growth_that_paid_is_kept():
    t = PoolTuner(2, TunerPolicy(warmup=1, low=1, high=8))
    window(t, 0.0, waiting=2, busy=2)
    assert window(t, 1.0, waiting=2, busy=2).size == 4
    # the epoch took half as long (though each task ran a little slower), and another kind ran too
    window(t, 2.0, waiting=0, busy=4)
    assert window(t, 3.0, waiting=0, busy=4, runs=(("fwd", 0.12),) * 8 + (("bwd", 0.3),) * 1, span=0.5) is None
    assert t.size == 4


def test_a_growth_is_kept_only_on_two_windows_but_undone_on_one_clearly_short():
    t = PoolTuner(2, TunerPolicy(warmup=1, low=1, high=8, min_gain=0.1, margin=0.04, judge_windows=2))
    window(t, 0.0, waiting=2, busy=2)
    assert window(t, 1.0, waiting=2, busy=2).size == 4
    window(t, 2.0, waiting=0, busy=4)  # settling
    assert window(t, 3.0, waiting=0, busy=4, span=1 / 1.12) is None and t.size == 4  # 1.12x: one window is not enough
    d = window(t, 3.0 + 1 / 1.12, waiting=0, busy=4, epoch=4)  # 1.00x: over both windows 1.06x
    assert d.size == 2 and "raised throughput only 1.06x (over 2 windows)" in d.reason
    t = PoolTuner(2, TunerPolicy(warmup=1, low=1, high=8, min_gain=0.1, margin=0.04, judge_windows=2))
    window(t, 0.0, waiting=2, busy=2)
    assert window(t, 1.0, waiting=2, busy=2).size == 4
    window(t, 2.0, waiting=0, busy=4)
    assert window(t, 3.0, waiting=0, busy=4, span=1 / 1.05).size == 2  # 1.05x: clearly short, undone at once
    t = PoolTuner(2, TunerPolicy(warmup=1, low=1, high=8, min_gain=0.1, margin=0.04, judge_windows=2))
    window(t, 0.0, waiting=2, busy=2)
    assert window(t, 1.0, waiting=2, busy=2).size == 4
    window(t, 2.0, waiting=0, busy=4)
    assert window(t, 3.0, waiting=0, busy=4, span=1 / 1.12) is None
    assert window(t, 3.0 + 1 / 1.12, waiting=0, busy=4, span=1 / 1.2, epoch=4) is None  # 1.16x over both: kept
    assert t.trial is None and t.size == 4


def test_a_growth_is_set_against_the_windows_before_it_pooled_not_one_slow_window():
    t = PoolTuner(2, TunerPolicy(warmup=1, low=1, high=8, before_windows=3))
    window(t, 0.0, busy=2)  # warm-up
    window(t, 1.0, busy=2)
    window(t, 2.0, busy=2)
    assert window(t, 3.0, waiting=2, busy=2, span=1.6).size == 4  # a slow window, in which tasks waited
    window(t, 4.6, waiting=0, busy=4, epoch=4)  # settling
    # 1.3 s: faster than the slow window alone (1.23x), slower than the three before it (0.92x)
    d = window(t, 5.6, waiting=0, busy=4, span=1.3, epoch=5)
    assert d.size == 2 and "only 0.92x" in d.reason


def test_shrinks_to_what_was_wanted_after_two_windows_of_idle_workers():
    t = PoolTuner(8, TunerPolicy(warmup=1, low=2, high=8))
    window(t, 0.0, busy=3)
    assert window(t, 1.0, busy=3) is None
    d = window(t, 2.0, busy=3)
    assert d.size == 3 and "idle" in d.reason
    t = PoolTuner(8, TunerPolicy(warmup=1, low=2, high=8))
    for i in range(2):
        window(t, float(i), busy=0)
    assert window(t, 2.0, busy=0).size == 2  # never below low


def test_nothing_is_decided_while_workers_start_nor_before_a_window_is_full():
    t = PoolTuner(2, TunerPolicy(warmup=1, low=1, high=8, min_tasks=8))
    window(t, 0.0, waiting=5, busy=1)
    for i in range(1, 4):
        assert window(t, float(i), ready=1, waiting=5, busy=1) is None  # one of two workers still starting
    t = PoolTuner(2, TunerPolicy(warmup=1, low=1, high=8, min_tasks=8))
    window(t, 0.0, waiting=5, busy=2)
    # an epoch ended, but with 3 tasks the window goes on into the next one
    assert window(t, 1.0, waiting=5, busy=2, runs=(("fwd", 0.1),) * 3) is None
    assert t.size == 2 and t.windows == 1


def test_sizes_stay_within_bounds():
    assert PoolTuner(50, TunerPolicy(low=1, high=8)).size == 8
    assert PoolTuner(0, TunerPolicy(low=2, high=8)).size == 2


# --- closed loop ---------------------------------------------------------------------------------


@dataclass
class Sim:
    """A graph server alternating tensor stages (``chunks`` tasks at once) and graph stages (``graph_s``);
    each task holds a worker ``latency_s`` before it starts, then needs ``work_s`` of one core, and the
    running tasks share ``cores`` (processor sharing)."""

    chunks: int
    work_s: float
    graph_s: float
    cores: float
    latency_s: float = 0.0

    def run(self, size: int, seconds: float, tuner: PoolTuner | None = None, dt: float = 0.002):
        now, stages, billed, sizes = 0.0, 0, 0.0, []
        pending = []  # tasks without a worker
        running = []  # [latency left, work left, run time]
        graph_left = 0.0
        ready, start_left = size, 0.0
        while now < seconds:
            if graph_left <= 0 and not pending and not running:
                if graph_left == 0 and now > 0:
                    graph_left = self.graph_s
                else:
                    pending = [None] * self.chunks
                    graph_left = 0.0
            if graph_left > 0:
                graph_left -= dt
                if graph_left <= 0:
                    graph_left, stages = -1.0, stages + 1
            while pending and len(running) < ready:
                pending.pop()
                running.append([self.latency_s, self.work_s, 0.0])
            computing = [r for r in running if r[0] <= 0]
            share = min(1.0, self.cores / len(computing)) if computing else 0.0
            for r in running:
                if r[0] > 0:
                    r[0] -= dt
                else:
                    r[1] -= share * dt
                    r[2] += dt
            for r in [r for r in running if r[1] <= 0]:
                running.remove(r)
                billed += r[2]
                if tuner is not None:
                    tuner.finished("task", r[2])
            if tuner is not None:
                if start_left > 0:
                    start_left -= dt
                    if start_left <= 0:
                        ready = tuner.size
                d = tuner.sample(now, ready, len(pending), len(running), graph_left > 0, stages)
                if d is not None:
                    if d.size > ready:
                        start_left = 0.05  # new workers start
                    else:
                        ready = d.size
                sizes.append(tuner.size)
            now += dt
        return stages / seconds, billed / seconds, sizes


def tuned(sim: Sim, seconds: float = 30.0):
    tuner = PoolTuner(1, TunerPolicy(low=1, high=16))
    rate, billed, sizes = sim.run(1, seconds, tuner)
    return rate, billed, tuner


@pytest.mark.parametrize("sim", [
    Sim(chunks=8, work_s=0.02, graph_s=0.02, cores=2.0),  # a loaded 2-core machine: more workers only share the cores
    Sim(chunks=8, work_s=0.02, graph_s=0.02, cores=64.0, latency_s=0.02),  # Lambdas: latency to hide, no contention
    Sim(chunks=4, work_s=0.03, graph_s=0.05, cores=3.0, latency_s=0.01),
])
def test_auto_is_near_the_best_fixed_pool_at_near_its_cost(sim):
    fixed = {n: sim.run(n, 10.0)[:2] for n in (1, 2, 4, 8, 16)}
    best = max(rate for rate, _ in fixed.values())
    rate, billed, tuner = tuned(sim)
    assert rate >= 0.9 * best, (rate, fixed, tuner.decisions)
    cheapest = min(b for r, b in fixed.values() if r >= rate * 0.97)  # fixed pools about as fast as auto
    assert billed <= 1.1 * cheapest, (billed, fixed, tuner.decisions)
