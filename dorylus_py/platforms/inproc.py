"""``cpu`` and ``gpu`` backends: the handler runs in the graph server's own threads, on its device."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from dorylus_py.platforms.base import Completion, Platform


class InprocPlatform(Platform):
    def __init__(self, threads: int, device: str = "cpu", session=None):
        super().__init__()
        self.device, self.session = device, session  # the handler signs with this (not from the event)
        self.name = f"inproc-{device.split(':')[0]}"
        self.pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="tensor")

    def invoke(self, event: dict) -> None:
        self.pool.submit(self._run, dict(event, device=self.device))

    def _run(self, event: dict) -> None:
        from lambda_functions.handler import handler

        start = time.time()
        try:
            handler(event, None, session=self.session)
            ok, err = True, ""
        except Exception as e:  # noqa: BLE001  (reported; the task is relaunched)
            ok, err = False, f"{type(e).__name__}: {e}"
        self._done.put(Completion(event["task"], self.name, start, time.time(), 0, 0, ok, err))

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
