import pytest

from dorylus_py.pipeline.chunks import ChunkPipeline
from dorylus_py.pipeline.stages import attention_stages, task_stages, vertex_stages


def test_stage_list_two_layers():
    assert [(s.name, s.layer) for s in vertex_stages(2)] == [
        ("fwd", 0), ("gather", 0), ("fwd", 1), ("gather", 1), ("loss", 1),
        ("gather_bwd", 1), ("bwd", 1), ("gather_bwd", 0), ("bwd", 0),
        ("efwd", 0), ("egather", 0), ("efwd", 1), ("egather", 1), ("eval", 1),
    ]  # fmt: skip


def test_fused_stage_list_replaces_the_last_layers_forward_loss_and_backward_tasks_by_one():
    fused, plain = vertex_stages(3, fused=True), vertex_stages(3)
    assert [(s.name, s.layer) for s in fused if s.train] == [
        ("fwd", 0), ("gather", 0), ("fwd", 1), ("gather", 1), ("activate", 2), ("gather", 2), ("fused", 2),
        ("gather_bwd", 2), ("activate_bwd", 2), ("gather_bwd", 1), ("bwd", 1), ("gather_bwd", 0), ("bwd", 0),
    ]  # fmt: skip
    assert [s for s in fused if not s.train] == [s for s in plain if not s.train]  # the evaluation forward as before
    tasks = lambda stages: [(s.task, s.layer) for s in stages if s.task and s.train]  # noqa: E731
    assert set(tasks(plain)) - set(tasks(fused)) == {("fwd", 2), ("loss", 2), ("bwd", 2)}
    assert set(tasks(fused)) - set(tasks(plain)) == {("fused", 2)}
    by_task = task_stages(fused)
    last = by_task[("fused", True, 2)]
    assert last.gradient and last.weights == "newest" and last.sends == (("bwd", 2),)  # pulls once: nothing held
    graph = {s.name: s for s in fused if s.layer == 2 and s.task is None and s.train}
    assert graph["activate"].sends == (("fwd", 2),) and graph["gather"].needs == ("fwd",)
    assert graph["activate_bwd"].sends == (("bwd", 1),)  # the next layer's Gather backward waits for them
    with pytest.raises(ValueError, match="2 layers"):
        vertex_stages(1, fused=True)


def test_every_held_weights_version_is_released_by_a_gradient_of_its_layer():
    """Async stashing: a training forward that holds a version needs a stashed backward of its layer (whose
    gradient push releases the hold); a gradient stage that stashes needs a holding forward."""
    for stages in (vertex_stages(1), vertex_stages(3), vertex_stages(2, fused=True), vertex_stages(3, fused=True),
                   attention_stages(2)):
        holds = {s.layer for s in stages if s.weights == "hold"}
        stashed = {s.layer for s in stages if s.weights == "stashed"}
        assert holds == stashed and all(s.gradient for s in stages if s.weights == "stashed")
        assert all(s.weights in ("stashed", "newest") for s in stages if s.gradient)


def test_attention_stage_list_has_apply_edge_tasks_and_unique_task_keys():
    stages = attention_stages(2)
    assert [(s.name, s.layer) for s in stages if s.layer == 0] == [
        ("fwd", 0), ("edge_fwd", 0), ("gather", 0), ("attn_grad", 0), ("edge_bwd", 0), ("gather_bwd", 0),
        ("bwd", 0), ("efwd", 0), ("eedge_fwd", 0), ("egather", 0),
    ]  # fmt: skip
    by_task = task_stages(stages)
    assert by_task[("edge_fwd", False, 1)].name == "eedge_fwd" and by_task[("edge_fwd", True, 1)].needs == ("fwd",)
    assert by_task[("edge_bwd", True, 0)].sends == (("ebwd", 0),)
    assert [s.name for s in stages if s.gradient] == ["bwd", "bwd"]


def finish_epoch(pipe, chunk):
    while True:
        if pipe.current(chunk).task is not None:
            pipe.started(chunk)
        if pipe.done(chunk):
            return


def test_staleness_gate_and_the_slowest_always_moves():
    pipe = ChunkPipeline(chunks=2, layers=2, epochs=5, staleness=1)
    finish_epoch(pipe, 0)
    assert pipe.epoch == [2, 1]
    assert {c for c, *_ in pipe.ready(slowest=pipe.min_epoch())} == {0, 1}  # 2 - 1 <= 1
    finish_epoch(pipe, 0)
    assert pipe.epoch == [3, 1]
    assert [c for c, *_ in pipe.ready(slowest=pipe.min_epoch())] == [1]  # chunk 0 is 2 ahead: waits
    pipe.validate()
    assert not pipe.epoch_complete(1)
    finish_epoch(pipe, 1)
    assert pipe.epoch_complete(1) and not pipe.epoch_complete(2)
    assert {c for c, *_ in pipe.ready(slowest=pipe.min_epoch())} == {0, 1}
    # a slower peer server holds everyone back, but never its own slowest chunk
    assert [c for c, *_ in pipe.ready(slowest=1)] == [1]


def test_busy_chunk_is_not_ready_and_run_to_the_end():
    pipe = ChunkPipeline(chunks=3, layers=1, epochs=2, staleness=0)
    pipe.started(0)
    assert [c for c, *_ in pipe.ready(1)] == [1, 2]
    pipe.done(0)
    steps = 0
    while not pipe.finished():
        ready = pipe.ready(pipe.min_epoch())
        assert ready, "stuck"
        for c, *_ in ready:
            if pipe.current(c).task is not None and not pipe.busy[c]:
                pipe.started(c)
            pipe.done(c)
            pipe.validate()
            steps += 1
        assert steps < 1000
    assert pipe.epoch == [3, 3, 3]


def test_local_barrier_holds_a_graph_stage_until_every_chunk_of_the_server_reaches_it():
    free, barrier = (ChunkPipeline(chunks=2, layers=2, epochs=3, staleness=1, local_barrier=b) for b in (False, True))
    for pipe in (free, barrier):
        pipe.started(0)
        pipe.done(0)  # chunk 0's first task came back: its next stage is a graph stage (gather 0)
        assert pipe.current(0).task is None and pipe.current(1).task is not None
    assert [c for c, *_ in free.ready(1)] == [0, 1]  # without the barrier chunk 0 gathers on chunk 1's old rows
    assert [c for c, *_ in barrier.ready(1)] == [1]  # with it, it waits for chunk 1's rows of this epoch
    barrier.started(1)
    barrier.done(1)
    assert [c for c, *_ in barrier.ready(1)] == [0, 1]
    # the chunk furthest behind is never held, and tensor stages never wait: the run finishes
    steps = 0
    while not barrier.finished():
        ready = barrier.ready(barrier.min_epoch())
        assert ready, "stuck"
        c = ready[-1][0]
        barrier.started(c)
        barrier.done(c)
        barrier.validate()
        steps += 1
    assert barrier.epoch == [4, 4] and steps == 2 * 3 * len(barrier.stages) - 2  # two stages done above
