"""Property test: graph servers' schedulers wired into a simulated cluster whose tensor workers fail,
vanish, answer twice and arrive late, in any order hypothesis picks. Whatever happens, every task's
result and gradient take effect exactly once, no chunk starts beyond the staleness bound, and every
epoch is reported once the lost tasks have been relaunched."""

import random
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dorylus_py.pipeline import events as ev
from dorylus_py.pipeline.chunks import TENSOR_STAGES, stage_list
from dorylus_py.pipeline.scheduler import Scheduler
from dorylus_py.pipeline.tasks import RelaunchPolicy


class Cluster:
    def __init__(self, rng, servers, chunks, layers, epochs, mode, staleness, p_fail, p_lost, p_dup, switch_at_step):
        self.rng, self.epochs, self.mode, self.staleness = rng, epochs, mode, staleness
        self.p = {"fail": p_fail, "lost": p_lost, "dup": p_dup}
        self.now = 0.0
        self.s = [Scheduler(rank=k, chunks=chunks[k], layers=layers, epochs=epochs, mode=mode, staleness=staleness,
                            peers=tuple(p for p in range(servers) if p != k), peer_chunks=sum(chunks) - chunks[k],
                            policy=RelaunchPolicy(min_s=1.0, factor=2.0, max_attempts=10**6), stall_s=1e9)
                  for k in range(servers)]
        self.pending: list[tuple[int, object]] = []  # (server, event) not yet delivered
        self.effects: Counter = Counter()
        self.gradients: Counter = Counter()
        self.reports: list[list[int]] = [[] for _ in range(servers)]
        self.finished = [False] * servers
        self.switch_at_step = switch_at_step
        self.frozen: dict[int, int] = {}
        self.steps = 0

    def feed(self, k, event):
        for inst in self.s[k].handle(event):
            self.execute(k, inst)
        self.s[k].validate()

    def execute(self, k, inst):
        t = type(inst)
        if t is ev.Invoke:
            self.check_staleness(k, inst.key.epoch)
            fate = self.rng.random()
            if fate < self.p["fail"]:
                self.pending.append((k, ev.TaskEnded(inst.key, inst.attempt, False, 0.0, "injected")))
            else:
                self.pending.append((k, ("pull", inst.key, inst.attempt, fate < self.p["fail"] + self.p["lost"])))
        elif t is ev.Serve:
            raise AssertionError("rows are served only in answer to a pull")
        elif t is ev.Cancel:
            assert inst.reason == "duplicate"  # a second result of a task: refused
        elif t is ev.Accept:
            self.effects[(k, inst.key)] += 1
        elif t is ev.ForwardGradient:
            self.gradients[(k, inst.key)] += 1
        elif t is ev.SendRows:
            for p in self.s[k].peers:
                self.pending.append((p, ev.RowsArrived(inst.phase, inst.epoch, inst.layer, k)))
        elif t is ev.SendProgress:
            for p in self.s[k].peers:
                self.pending.append((p, ev.PeerProgress(k, inst.min_epoch)))
        elif t is ev.RunGraph:
            self.check_staleness(k, inst.epoch)
            self.pending.append((k, ev.GraphDone(inst.stage, inst.epoch, inst.layer, inst.chunk, 0.0)))
        elif t is ev.ReportEpoch:
            self.reports[k].append(inst.epoch)
        elif t is ev.Frozen:
            self.frozen[k] = inst.at_epoch
            if len(self.frozen) == len(self.s):
                for p in range(len(self.s)):
                    self.pending.append((p, ev.SwitchAt(max(self.frozen.values()))))
        elif t is ev.Finished:
            self.finished[k] = True
        elif t is ev.Stuck:
            raise AssertionError(inst.reason)

    def check_staleness(self, k, epoch):
        """Async: at most S epochs ahead of the slowest chunk anywhere; sync: barriers keep every server
        within one epoch of the others (one may start an epoch while a peer finishes the last)."""
        slowest = min(s.pipe.min_epoch() for s in self.s)
        bound = 1 if self.s[k].sync else self.staleness
        assert epoch - slowest <= bound, (epoch, slowest)

    def deliver(self, i):
        k, item = self.pending.pop(i)
        if isinstance(item, tuple):  # a worker copy asks for its rows, then (maybe) answers
            _, key, attempt, lost = item
            answer = self.s[k].handle(ev.TaskPulled(key, attempt, self.now))
            self.s[k].validate()
            if answer and type(answer[0]) is ev.Serve:
                if not lost:
                    result = ev.TaskResult(key, attempt, self.now, version=max(key.epoch - 1, 0))
                    self.pending.append((k, result))
                    if self.rng.random() < self.p["dup"]:
                        self.pending.append((k, result))
                self.pending.append((k, ev.TaskEnded(key, attempt, not lost, self.now)))
            else:
                self.pending.append((k, ev.TaskEnded(key, attempt, True, self.now)))
            for inst in answer[1:]:
                self.execute(k, inst)
            return
        self.feed(k, _at(item, self.now))

    def run(self, chaotic_steps):
        for k in range(len(self.s)):
            self.feed(k, ev.Tick(self.now))
        while not all(self.finished):
            self.steps += 1
            assert self.steps < 200_000, "no end in sight"
            if self.steps == self.switch_at_step and self.mode == "async":
                for k in range(len(self.s)):
                    self.pending.append((k, ev.Freeze()))
            chaotic = self.steps < chaotic_steps
            if self.pending and (not chaotic or self.rng.random() < 0.9):
                self.deliver(self.rng.randrange(len(self.pending)) if chaotic else 0)
            else:  # time passes: overdue copies get company
                if not chaotic:
                    self.p = dict.fromkeys(self.p, 0.0)  # calm: lost tasks get relaunched and finish
                self.now += self.rng.choice([0.1, 0.5, 3.0])
                for k in range(len(self.s)):
                    self.feed(k, ev.Tick(self.now))


def _at(event, now):
    return type(event)(**{**event.__dict__, "now": now}) if hasattr(event, "now") else event


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), servers=st.integers(1, 3), chunk_choice=st.lists(st.integers(1, 3), min_size=3, max_size=3),
       layers=st.integers(1, 3), epochs=st.integers(1, 4), mode=st.sampled_from(["sync", "async"]),
       staleness=st.integers(0, 2), p_fail=st.sampled_from([0.0, 0.2]), p_lost=st.sampled_from([0.0, 0.1]),
       p_dup=st.sampled_from([0.0, 0.3]), chaotic_steps=st.integers(0, 3000), switch_at_step=st.integers(0, 400))
def test_exactly_once_within_staleness_and_every_epoch_finishes(seed, servers, chunk_choice, layers, epochs, mode, staleness,
                                                                 p_fail, p_lost, p_dup, chaotic_steps, switch_at_step):
    chunks = chunk_choice[:servers]
    c = Cluster(random.Random(seed), servers, chunks, layers, epochs, mode, staleness, p_fail, p_lost, p_dup, switch_at_step)
    c.run(chaotic_steps)
    expected = set()
    for k in range(servers):
        for epoch in range(1, epochs + 1):
            for stage, layer in stage_list(layers):
                if stage in TENSOR_STAGES:
                    kind, train = ("fwd", False) if stage == "efwd" else (stage, stage != "eval")
                    expected |= {(k, ev.TaskKey(kind, train, epoch, layer, ch)) for ch in range(chunks[k])}
    assert set(c.effects) == expected and set(c.effects.values()) == {1}  # every result applied exactly once
    assert set(c.gradients) == {x for x in expected if x[1].kind == "bwd"} and set(c.gradients.values()) == {1}
    assert c.reports == [list(range(1, epochs + 1))] * servers
