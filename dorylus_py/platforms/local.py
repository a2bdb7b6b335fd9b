"""The local Lambda emulator: worker processes that run the real handler on the real event JSON.

``concurrency`` processes stay warm (like Lambda containers, they keep their sockets between
invocations). Each invocation can be delayed by ``latency_ms`` (invoke and start-up latency) and, with
probability ``fail_rate``, made to fail: either before it starts, or part-way through by running its
clock out, which exercises the relaunch path with partial effects (a gradient pushed, the result not).
Billed duration is the handler's run time rounded up to 1 ms, at ``memory_mb``.
"""

from __future__ import annotations

import json
import multiprocessing
import random
import time
from concurrent.futures import ProcessPoolExecutor

from dorylus_py.platforms.base import Completion, LambdaContext, Platform, billed_ms


def _invoke(payload: str, latency_ms: float, fail_rate: float, timeout_ms: int, seed: int) -> tuple:
    """Runs in a worker process; returns (start, end, run_seconds, ok, error)."""
    rng = random.Random(seed)
    if latency_ms:
        time.sleep(latency_ms / 1000)
    start = time.time()
    event = json.loads(payload)  # exactly what AWS would hand the function
    expire = None
    if rng.random() < fail_rate:
        expire = rng.randrange(0, 4)  # 0: dies at once; 1-3: part-way through
    t0 = time.perf_counter()
    try:
        from lambda_functions.handler import handler

        handler(event, LambdaContext(timeout_ms, expire))
        ok, err = True, ""
    except Exception as e:  # noqa: BLE001  (a failed Lambda; the graph server relaunches)
        ok, err = False, f"{type(e).__name__}: {e}"
    return start, time.time(), time.perf_counter() - t0, ok, err


def _warm() -> None:
    import lambda_functions.handler  # noqa: F401  (import torch once per worker, as a warm container)


class LocalLambdaPlatform(Platform):
    name = "local-lambda"

    def __init__(self, concurrency: int, latency_ms: float = 0.0, fail_rate: float = 0.0, memory_mb: int = 3008,
                 timeout_s: float = 60.0, seed: int = 0):
        super().__init__()
        self.latency_ms, self.fail_rate, self.memory_mb = latency_ms, fail_rate, memory_mb
        self.timeout_ms = int(timeout_s * 1000)
        self.rng = random.Random(seed)
        ctx = multiprocessing.get_context("spawn")  # no forked zmq contexts or torch thread pools
        self.pool = ProcessPoolExecutor(max_workers=max(1, concurrency), mp_context=ctx, initializer=_worker_init)
        for f in [self.pool.submit(_warm) for _ in range(max(1, concurrency))]:
            f.result(timeout=120)

    def invoke(self, event: dict) -> None:
        fut = self.pool.submit(_invoke, json.dumps(event), self.latency_ms, self.fail_rate, self.timeout_ms,
                               self.rng.getrandbits(32))
        fut.add_done_callback(lambda f, task=event["task"]: self._finished(task, f))

    def _finished(self, task: dict, fut) -> None:
        try:
            start, end, run_s, ok, err = fut.result()
        except Exception as e:  # noqa: BLE001  (the worker process itself died)
            now = time.time()
            start, end, run_s, ok, err = now, now, 0.0, False, f"worker died: {e}"
        self._done.put(Completion(task, self.name, start, end, billed_ms(run_s), self.memory_mb, ok, err))

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def _worker_init() -> None:
    import torch

    from dorylus_py.cluster.node import exit_with_parent

    torch.set_num_threads(1)  # one vCPU-ish per emulated Lambda; many run at once
    exit_with_parent(0)
