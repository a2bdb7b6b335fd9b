"""``--stale-smoothing``: an async graph server keeps the peers' training ghost rows and gradient
contributions as moving averages ``gamma m + (1 - gamma) received``; its own chunks' rows, the evaluation
pass's ghosts and sync mode are never smoothed."""

import numpy as np
import pytest

from dorylus_py.models.spec import model_spec
from dorylus_py.partition import PartitionStore, prepare
from dorylus_py.pipeline.events import TaskKey
from graph_servers.graph_state import GraphState
from graph_servers.task_io import apply_result

GCN = model_spec("gcn", [16, 8, 4])
GAMMA = 0.75


def _twice(state: GraphState, phase: str, first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Peer 0's chunk 1 sends ``first`` then ``second`` (every position); what is kept."""
    positions = np.arange(len(first), dtype=np.int64)
    for rows in (first, second):
        state.store_peer_rows(phase, 0, 0, 1, {"positions": positions, "rows": rows})
    if phase == "bwd":
        total = np.zeros((state.n, first.shape[1]), np.float32)
        state.received[("bwd", 0)].add_to(0, state.n, total)
        return total
    sl = state.part.ghosts_from(0)
    return state.ZG[phase == "fwd"][0][state.n + sl.start: state.n + sl.stop].copy()


@pytest.mark.parametrize("gamma", [0.0, GAMMA])
def test_peer_rows_are_averaged_and_own_rows_are_not(small_graph, tmp_path, gamma):
    """A two-chunk server (of two): with gamma the peer's training ghost rows and contributions are the
    average (the first as it came); off, the newest. Own chunk rows and evaluation ghosts: the newest."""
    prepare(small_graph, tmp_path / "p", 2, "hash")
    state = GraphState(PartitionStore.open(tmp_path / "p").load(1), GCN, [2, 2], "none", smoothing=gamma)
    rng = np.random.default_rng(0)
    g = len(range(*state.part.ghosts_from(0).indices(state.g)))
    w = state.widths(True, 0)[0]  # Z_0's width: its ghosts' and its contributions'
    a, b = (rng.standard_normal((g, w)).astype(np.float32) for _ in range(2))
    smoothed = np.float32(gamma) * a + np.float32(1 - gamma) * b
    np.testing.assert_array_equal(_twice(state, "fwd", a, b), smoothed if gamma else b)
    np.testing.assert_array_equal(_twice(state, "efwd", a, b), b)  # evaluation: the newest rows
    s = len(state.send_ids[0])
    ca, cb = (rng.standard_normal((s, w)).astype(np.float32) for _ in range(2))
    got = _twice(state, "bwd", ca, cb)
    at = state.send_ids[0].numpy()
    np.testing.assert_allclose(got[at], np.float32(gamma) * ca + np.float32(1 - gamma) * cb if gamma else cb, rtol=1e-6)
    lo, hi = state.chunk(0)
    for rows in (a[: hi - lo], b[: hi - lo]):  # our own chunk's Z rows, as a task's result writes them
        apply_result(state, TaskKey("fwd", True, 0, 0, 0), {"Z": rows})
    np.testing.assert_array_equal(state.ZG[True][0][lo:hi], b[: hi - lo])


def test_sync_mode_refuses_smoothing(small_graph, tmp_path):
    prepare(small_graph, tmp_path / "p", 2, "hash")
    with pytest.raises(ValueError, match="async"):
        GraphState(PartitionStore.open(tmp_path / "p").load(1), GCN, [2, 2], "none", sync=True, smoothing=0.9)
