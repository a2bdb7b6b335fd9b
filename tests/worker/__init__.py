from dorylus_py.pipeline.events import TaskKey
from dorylus_py.worker.event import TaskEvent, TaskRef


def event_for(graph_server: str = "tcp://gs", row_cache_mb: int = 0, **task) -> TaskEvent:
    """A worker's event for a task of ``graph_server`` (``task``: the fields of its TaskRef that matter to
    the test; the others are epoch 1's first forward task)."""
    ref = {"kind": "fwd", "train": True, "epoch": 1, "layer": 0, "chunk": 0, "server": 0, "version": None, "hold": None,
           "attempt": 1} | task
    key = TaskKey(*(ref.pop(name) for name in TaskKey._fields))
    return TaskEvent("00", None, graph_server, (), "gcn", 0.0, 0.0, 0.2, 0, 1, row_cache_mb, None, TaskRef(key, **ref))
