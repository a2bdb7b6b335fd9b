"""Property test: graph servers' schedulers wired into a simulated cluster whose tensor workers fail,
lose their results, vanish without a word, answer twice and arrive late, in any order hypothesis picks.
Whatever happens, every task's result and gradient take effect exactly once, no chunk starts beyond the
staleness bound, and every epoch is reported: a copy that vanished is found only by the overdue
relaunch (``pipeline/tasks.py``), nothing else ever tells the scheduler about it.

What is expected is worked out here from the stage list and the model's rules, never read back from
the scheduler: the tasks are the list's tensor stages, the gradients the training backward tasks (``bwd``,
and the ``fused`` last layer, which contains one) of every layer, and how far each chunk has got is counted
from the results of its epoch's last stage (``eval``) as they are accepted."""

import random
from collections import Counter

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dorylus_py.pipeline import events as ev
from dorylus_py.pipeline.scheduler import Scheduler
from dorylus_py.pipeline.stages import attention_stages, vertex_stages
from dorylus_py.pipeline.tasks import RelaunchPolicy

GRADIENT_TASKS = ("bwd", "fused")  # the tasks that compute dW: ApplyVertex's backward, the fused last layer
STALL_S = 2_000.0  # simulated seconds with no accepted result: a copy was lost and never relaunched
# (the longest wait for an overdue copy is max(min_s, factor x usual) x max_backoff = 8 x a few simulated
# seconds, plus the queue: far below)
# SILENT: a key has at most one vanished copy. The scheduler runs at most two copies of a key at once
# (RelaunchPolicy.max_copies), so two silent ones would hold it until the platform itself ends them (a
# Lambda's own timeout, minutes later), which this simulation does not model.


class Cluster:
    def __init__(self, rng, servers, chunks, stages, epochs, mode, staleness, p_fail, p_lost, p_vanish, p_dup,
                 switch_at_step):
        self.barrier = mode == "async-barrier"  # async with --local-barrier
        self.sync_epochs = 1 if mode == "async-sync1" else 0  # async with --sync-epochs 1
        mode = "async" if mode.startswith("async") else mode
        self.rng, self.epochs, self.mode, self.staleness = rng, epochs, mode, staleness
        self.p = {"fail": p_fail, "lost": p_lost, "vanish": p_vanish, "dup": p_dup}
        self.stages = stages
        self.tasks = {(s.task, s.train, s.layer): s for s in stages if s.task is not None}
        self.last = stages[-1]
        assert (self.last.task, self.last.train) == ("eval", False)  # every list ends an epoch with eval
        self.peer_chunks = [sum(chunks) - chunks[k] for k in range(servers)]
        self.now = 0.0
        layers = max(s.layer for s in stages) + 1
        self.s = [Scheduler(rank=k, chunks=chunks[k], layers=layers, stages=tuple(stages), epochs=epochs, mode=mode, staleness=staleness,
                            peers=tuple(p for p in range(servers) if p != k), peer_chunks=self.peer_chunks[k],
                            policy=RelaunchPolicy(min_s=1.0, factor=2.0, max_attempts=10**6), stall_s=1e9,
                            local_barrier=self.barrier, sync_epochs=self.sync_epochs)
                  for k in range(servers)]
        self.pending: list[tuple[int, object]] = []  # (server, event) not yet delivered
        self.delivered: list[Counter] = [Counter() for _ in range(servers)]  # (phase, epoch, layer) -> peer messages
        self.epochs_done = {(k, c): 0 for k in range(servers) for c in range(chunks[k])}  # eval results accepted
        self.effects: Counter = Counter()
        self.gradients: Counter = Counter()
        self.reports: list[list[int]] = [[] for _ in range(servers)]
        self.finished = [False] * servers
        self.switch_at_step = switch_at_step
        self.frozen: dict[int, int] = {}
        self.switch_epoch: int | None = None  # the epoch from which every server runs synchronously
        self.vanished = 0  # copies that were never heard of again
        self.silent: set = set()  # (server, key) with a vanished copy: one per key (see SILENT)
        self.last_effect = 0.0
        self.steps = 0

    def sync(self, epoch: int) -> bool:
        """Whether ``epoch`` runs with barriers: sync mode, async's first ``sync_epochs``, or at and after the
        switch back to sync."""
        return (self.mode == "sync" or epoch <= self.sync_epochs
                or (self.switch_epoch is not None and epoch >= self.switch_epoch))

    def slowest(self) -> int:
        """The lowest epoch any chunk of any server is still in, from the eval results accepted so far."""
        return 1 + min(self.epochs_done.values())

    def feed(self, k, event):
        for inst in self.s[k].handle(event):
            self.execute(k, inst)
        self.s[k].validate()

    def execute(self, k, inst):
        t = type(inst)
        if t is ev.Invoke:
            stage = self.tasks[(inst.key.kind, inst.key.train, inst.key.layer)]
            self.check_staleness(inst.key.epoch)
            self.check_inputs(k, stage, inst.key.epoch)
            self.check_weights(k, stage, inst)
            fate = self.rng.random()
            p = self.p
            if fate < p["fail"]:  # the platform says it failed
                self.pending.append((k, ev.TaskEnded(inst.key, inst.attempt, False, 0.0, "injected")))
            elif fate < p["fail"] + p["vanish"] and (k, inst.key) not in self.silent:  # never heard of again:
                self.silent.add((k, inst.key))  # no pull, or a pull and then silence
                self.vanished += 1
                if self.rng.random() < 0.5:
                    self.pending.append((k, ("pull", inst.key, inst.attempt, "vanish")))
            else:
                lost = fate < p["fail"] + p["vanish"] + p["lost"]
                self.pending.append((k, ("pull", inst.key, inst.attempt, "lost" if lost else "ok")))
        elif t is ev.Serve:
            raise AssertionError("rows are served only in answer to a pull")
        elif t is ev.Cancel:
            assert inst.reason == "duplicate"  # a second result of a task: refused
        elif t is ev.Accept:
            self.effects[(k, inst.key)] += 1
            self.last_effect = self.now
            if (inst.key.kind, inst.key.train, inst.key.layer) == (self.last.task, self.last.train, self.last.layer):
                self.epochs_done[(k, inst.key.chunk)] += 1
                assert self.epochs_done[(k, inst.key.chunk)] == inst.key.epoch  # epochs in order, each once
        elif t is ev.ForwardGradient:
            self.gradients[(k, inst.key)] += 1
        elif t is ev.SendRows:
            for p in self.s[k].peers:
                self.pending.append((p, ev.RowsArrived(inst.phase, inst.epoch, inst.layer, k)))
        elif t is ev.SendProgress:
            for p in self.s[k].peers:
                self.pending.append((p, ev.PeerProgress(k, inst.min_epoch)))
        elif t is ev.RunGraph:
            self.check_staleness(inst.epoch)
            if inst.chunk is None:
                stage = next(s for s in self.stages if (s.name, s.layer) == (inst.stage, inst.layer))
                self.check_inputs(k, stage, inst.epoch)
            elif self.barrier and not self.sync(inst.epoch):  # every chunk of the server has reached the stage
                assert self.s[k].pipe.behind() == self.s[k].pipe.position(inst.chunk)
            self.pending.append((k, ev.GraphDone(inst.stage, inst.epoch, inst.layer, inst.chunk, 0.0)))
        elif t is ev.ReportEpoch:
            self.reports[k].append(inst.epoch)
        elif t is ev.Frozen:
            self.frozen[k] = inst.at_epoch
            if len(self.frozen) == len(self.s):
                self.switch_epoch = max(self.frozen.values())
                for p in range(len(self.s)):
                    self.pending.append((p, ev.SwitchAt(self.switch_epoch)))
        elif t is ev.Finished:
            self.finished[k] = True
        elif t is ev.Stuck:
            raise AssertionError(inst.reason)

    def check_staleness(self, epoch):
        """Async: at most S epochs ahead of the slowest chunk anywhere; sync: barriers keep every server
        within one epoch of the others (one may start an epoch while a peer finishes the last)."""
        bound = 1 if self.sync(epoch) else self.staleness
        assert epoch - self.slowest() <= bound, (epoch, self.slowest())

    def check_weights(self, k, stage, inst):
        """Only a training forward holds a version (async), under its chunk's key; a task that pulls once
        (the fused last layer, the evaluation forward) takes the newest, and in sync mode every training
        task the epoch's (version epoch - 1), every evaluation task the epoch's own."""
        key, sync = inst.key, self.sync(inst.key.epoch)
        assert inst.hold == ((key.epoch, k, key.chunk) if stage.weights == "hold" and not sync else None)
        if stage.weights == "newest" and not sync:
            assert inst.version is None
        if sync and stage.weights is not None:
            assert inst.version == (key.epoch - 1 if key.train else key.epoch)

    def check_inputs(self, k, stage, epoch):
        """Sync: a stage that reads the peers' rows (a Gather, GAT's ApplyEdge) starts only once every peer
        chunk's message of each phase it needs has come."""
        if self.sync(epoch):
            for phase in stage.needs:
                assert self.delivered[k][(phase, epoch, stage.layer)] == self.peer_chunks[k], (stage, epoch)

    def deliver(self, i):
        k, item = self.pending.pop(i)
        if isinstance(item, tuple):  # a worker copy asks for its rows, then (maybe) answers
            _, key, attempt, fate = item
            answer = self.s[k].handle(ev.TaskPulled(key, attempt, self.now))
            self.s[k].validate()
            if answer and type(answer[0]) is ev.Serve:
                if fate == "ok":
                    result = ev.TaskResult(key, attempt, self.now, version=max(key.epoch - 1, 0))
                    self.pending.append((k, result))
                    if self.rng.random() < self.p["dup"]:
                        self.pending.append((k, result))
                if fate != "vanish":  # lost: it ran, its result went missing, the platform saw it end
                    self.pending.append((k, ev.TaskEnded(key, attempt, True, self.now)))
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
            assert self.now - self.last_effect < STALL_S, f"no result accepted for {STALL_S:g} s: a lost copy stays lost"
            if self.steps == self.switch_at_step and self.mode == "async":
                for k in range(len(self.s)):
                    self.pending.append((k, ev.Freeze()))
            chaotic = self.steps < chaotic_steps
            if self.pending and (not chaotic or self.rng.random() < 0.9):
                self.deliver(self.rng.randrange(len(self.pending)) if chaotic else 0)
            else:  # time passes: overdue copies get company
                if not chaotic:
                    self.p = dict.fromkeys(self.p, 0.0)  # calm: no new faults; what vanished stays vanished
                self.now += self.rng.choice([0.1, 0.5, 3.0])
                for k in range(len(self.s)):
                    self.feed(k, ev.Tick(self.now))


def fused_vertex_stages(layers):
    """GCN with the fused last layer (which needs two layers or more)."""
    return vertex_stages(max(layers, 2), fused=True)


def _at(event, now):
    return type(event)(**{**event.__dict__, "now": now}) if hasattr(event, "now") else event


def expected_effects(stages, chunks, epochs):
    """(every task of the stage list for every chunk and epoch, the training backward tasks among them)."""
    tasks, gradients = set(), set()
    for k, n in enumerate(chunks):
        for epoch in range(1, epochs + 1):
            for s in stages:
                if s.task is not None:
                    keys = {(k, ev.TaskKey(s.task, s.train, epoch, s.layer, c)) for c in range(n)}
                    tasks |= keys
                    gradients |= keys if s.task in GRADIENT_TASKS and s.train else set()
    layers = max(s.layer for s in stages) + 1
    per_layer = {(k, key.epoch, key.layer, key.chunk) for k, key in gradients}
    assert len(per_layer) == len(gradients) == sum(chunks) * epochs * layers  # one per layer, chunk and epoch
    return tasks, gradients


def check_run(c, stages, chunks, epochs):
    tasks, gradients = expected_effects(stages, chunks, epochs)
    assert set(c.effects) == tasks and set(c.effects.values()) == {1}  # every result applied exactly once
    assert set(c.gradients) == gradients and set(c.gradients.values()) == {1}
    assert c.reports == [list(range(1, epochs + 1))] * len(chunks)
    assert set(c.epochs_done.values()) == {epochs}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), servers=st.integers(1, 3), chunk_choice=st.lists(st.integers(1, 3), min_size=3, max_size=3),
       layers=st.integers(1, 3), model=st.sampled_from([vertex_stages, attention_stages, fused_vertex_stages]), epochs=st.integers(1, 4),
       mode=st.sampled_from(["sync", "async", "async-barrier", "async-sync1"]),
       staleness=st.integers(0, 2), p_fail=st.sampled_from([0.0, 0.2]), p_lost=st.sampled_from([0.0, 0.1]),
       p_vanish=st.sampled_from([0.0, 0.1]), p_dup=st.sampled_from([0.0, 0.3]), chaotic_steps=st.integers(0, 3000),
       switch_at_step=st.integers(0, 400))
@example(seed=1, servers=2, chunk_choice=[2, 3, 1], layers=2, model=vertex_stages, epochs=3, mode="async", staleness=1,
         p_fail=0.0, p_lost=0.0, p_vanish=0.1, p_dup=0.0, chaotic_steps=3000, switch_at_step=0)
def test_exactly_once_within_staleness_and_every_epoch_finishes(seed, servers, chunk_choice, layers, model, epochs, mode,
                                                                 staleness, p_fail, p_lost, p_vanish, p_dup, chaotic_steps,
                                                                 switch_at_step):
    """Over GCN's stage list (ApplyVertex only; with the fused last layer, whose graph stages send rows too)
    and GAT's (ApplyVertex and ApplyEdge tasks) alike."""
    chunks = chunk_choice[:servers]
    stages = model(layers)
    c = Cluster(random.Random(seed), servers, chunks, stages, epochs, mode, staleness, p_fail, p_lost, p_vanish, p_dup,
                switch_at_step)
    c.run(chaotic_steps)
    check_run(c, stages, chunks, epochs)


def test_copies_that_vanish_without_a_word_are_relaunched_when_overdue():
    """Only silence: no copy fails or reports anything; a tenth are never heard of again. Every run needs
    the overdue relaunch to end (without it, the first vanished copy holds its chunk forever)."""
    for seed in range(6):
        chunks, stages = [2, 3], attention_stages(2) if seed % 2 else vertex_stages(2)
        c = Cluster(random.Random(seed), 2, chunks, stages, 3, ("sync", "async")[seed % 3 == 0], 1, 0.0, 0.0, 0.1, 0.0, 0)
        c.run(chaotic_steps=2000)
        assert c.vanished > 0
        check_run(c, stages, chunks, 3)
