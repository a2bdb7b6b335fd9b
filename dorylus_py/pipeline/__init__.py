"""The scheduler's state, free of sockets: tasks, chunks, epochs, staleness."""

from dorylus_py.pipeline.tasks import TaskTracker

__all__ = ["TaskTracker"]
