"""Property test: graph servers' schedulers wired into a simulated cluster whose tensor workers fail,
vanish, answer twice and arrive late, in any order hypothesis picks. Whatever happens, every task's
result and gradient take effect exactly once, no chunk starts beyond the staleness bound, and every
epoch is reported once the lost tasks have been relaunched."""

import random
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dorylus_py.pipeline import events as ev
from dorylus_py.pipeline.scheduler import Scheduler
from dorylus_py.pipeline.stages import attention_stages, vertex_stages
from dorylus_py.pipeline.tasks import RelaunchPolicy


class Cluster:
    def __init__(self, rng, servers, chunks, stages, epochs, mode, staleness, p_fail, p_lost, p_dup, switch_at_step):
        self.rng, self.epochs, self.mode, self.staleness = rng, epochs, mode, staleness
        self.p = {"fail": p_fail, "lost": p_lost, "dup": p_dup}
        self.now = 0.0
        layers = max(s.layer for s in stages) + 1
        self.s = [Scheduler(rank=k, chunks=chunks[k], layers=layers, stages=tuple(stages), epochs=epochs, mode=mode, staleness=staleness,
                            peers=tuple(p for p in range(servers) if p != k), peer_chunks=sum(chunks) - chunks[k],
                            policy=RelaunchPolicy(min_s=1.0, factor=2.0, max_attempts=10**6), stall_s=1e9)
                  for k in range(servers)]
        self.pending: list[tuple[int, object]] = []  # (server, event) not yet delivered
        self.delivered: list[Counter] = [Counter() for _ in range(servers)]  # (phase, epoch, layer) -> peer messages
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
            self.check_inputs(k, self.s[k].by_task[(inst.key.kind, inst.key.train, inst.key.layer)], inst.key.epoch)
            self.check_weights(k, inst)
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
            if inst.chunk is None:
                stage = next(s for s in self.s[k].pipe.stages if (s.name, s.layer) == (inst.stage, inst.layer))
                self.check_inputs(k, stage, inst.epoch)
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

    def check_weights(self, k, inst):
        """Only a training forward holds a version (async), under its chunk's key; a task that pulls once
        (the fused last layer, the evaluation forward) takes the newest, and in sync mode every training
        task the epoch's (version epoch - 1)."""
        stage, key, sync = self.s[k].by_task[(inst.key.kind, inst.key.train, inst.key.layer)], inst.key, self.s[k].sync
        assert inst.hold == ((key.epoch, k, key.chunk) if stage.weights == "hold" and not sync else None)
        if stage.weights == "newest" and not sync:
            assert inst.version is None
        if sync and stage.weights is not None:
            assert inst.version == (key.epoch - 1 if key.train else key.epoch)

    def check_inputs(self, k, stage, epoch):
        """Sync: a stage that reads the peers' rows (a Gather, GAT's ApplyEdge) starts only once every peer
        chunk's message of each phase it needs has come."""
        if self.s[k].sync:
            for phase in stage.needs:
                assert self.delivered[k][(phase, epoch, stage.layer)] == self.s[k].peer_chunks, (stage, epoch)

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
        if isinstance(item, ev.RowsArrived):
            self.delivered[k][(item.phase, item.epoch, item.layer)] += 1
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


def fused_vertex_stages(layers):
    """GCN with the fused last layer (which needs two layers or more)."""
    return vertex_stages(max(layers, 2), fused=True)


def _at(event, now):
    return type(event)(**{**event.__dict__, "now": now}) if hasattr(event, "now") else event


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), servers=st.integers(1, 3), chunk_choice=st.lists(st.integers(1, 3), min_size=3, max_size=3),
       layers=st.integers(1, 3), model=st.sampled_from([vertex_stages, attention_stages, fused_vertex_stages]), epochs=st.integers(1, 4),
       mode=st.sampled_from(["sync", "async"]),
       staleness=st.integers(0, 2), p_fail=st.sampled_from([0.0, 0.2]), p_lost=st.sampled_from([0.0, 0.1]),
       p_dup=st.sampled_from([0.0, 0.3]), chaotic_steps=st.integers(0, 3000), switch_at_step=st.integers(0, 400))
def test_exactly_once_within_staleness_and_every_epoch_finishes(seed, servers, chunk_choice, layers, model, epochs, mode,
                                                                 staleness, p_fail, p_lost, p_dup, chaotic_steps,
                                                                 switch_at_step):
    """Over GCN's stage list (ApplyVertex only; with the fused last layer, whose graph stages send rows too)
    and GAT's (ApplyVertex and ApplyEdge tasks) alike."""
    chunks = chunk_choice[:servers]
    stages = model(layers)
    c = Cluster(random.Random(seed), servers, chunks, stages, epochs, mode, staleness, p_fail, p_lost, p_dup, switch_at_step)
    c.run(chaotic_steps)
    expected, with_gradient = set(), set()
    for k in range(servers):
        for epoch in range(1, epochs + 1):
            for stage in stages:
                if stage.task is not None:
                    keys = {(k, ev.TaskKey(stage.task, stage.train, epoch, stage.layer, ch)) for ch in range(chunks[k])}
                    expected |= keys
                    with_gradient |= keys if stage.gradient else set()
    assert set(c.effects) == expected and set(c.effects.values()) == {1}  # every result applied exactly once
    assert set(c.gradients) == with_gradient and set(c.gradients.values()) == {1}
    assert c.reports == [list(range(1, epochs + 1))] * servers
