"""``cpu`` and ``gpu`` backends: tensor tasks run in the graph server's own threads, on its device.

Nothing is invoked: the threads are one lease that never ends (``graph_servers/direct.py``), which the
graph server hands its tasks to directly; this platform only says how many run at once and closes them.
"""

from __future__ import annotations

from dorylus_py.platforms.base import Platform


class InprocPlatform(Platform):
    def __init__(self, direct, device: str = "cpu"):
        """``direct``: the server's threads (:class:`graph_servers.direct.DirectWorkers`), on ``device``."""
        super().__init__()
        self.direct = direct
        self.name = f"inproc-{device.split(':')[0]}"

    @property
    def concurrency(self) -> int:
        return self.direct.threads

    def close(self) -> None:
        """Drop the tasks not started; running ones are abandoned (the threads end with the process)."""
        self.direct.close()
