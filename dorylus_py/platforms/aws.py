"""AWS Lambda: leases of tensor workers invoked through aiobotocore on one asyncio loop (no thread per call).

Each ``invoke`` (a lease: the function serves its graph server's tasks until released, idle or out of
time, ``worker/handler.py``) schedules a ``RequestResponse`` call (with the log tail, which carries the billed
duration) on a loop running in one background thread; at most ``concurrency`` are in flight. Throttling
(``TooManyRequestsException``, HTTP 429: the function is at its concurrency limit) is retried with
exponential back-off and full jitter until the function's timeout has passed, since a throttled call
never started (counting it as a failure made a job whose ``--lambdas`` exceeded the function's
concurrency give up on its tasks: measured on the lab's Lambda service); Lambda's own 5xx errors and
connection failures are retried so up to ``max_attempts``; anything else, or a function error,
is a failed :class:`Completion`, and the graph server relaunches the tasks the lease held through the
same tracker as for the local emulator (so do tasks that simply take too long). Credentials, region and profile come
from the standard AWS chain; ``endpoint_url`` (or ``AWS_ENDPOINT_URL``) points at moto or LocalStack.

``run_here``: also run the handler on this machine for every accepted invocation (in a pool of
processes, like the local emulator). Only for endpoints that accept invocations but do not execute
code, such as moto; it lets a whole job go through this code path without an AWS account.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import re
import threading
import time

from dorylus_py.errors import ConfigError
from dorylus_py.platforms.base import Completion, Platform, PoolLoad, billed_ms
from dorylus_py.worker.event import LeaseEvent

THROTTLE_CODES = {"TooManyRequestsException", "ThrottlingException"}
RETRYABLE_CODES = THROTTLE_CODES | {"ServiceException", "EC2ThrottledException", "ResourceNotReadyException"}
_BILLED = re.compile(r"Billed Duration:\s*(\d+)\s*ms")


def backoff_s(attempt: int, base_s: float, cap_s: float, rng: random.Random) -> float:
    """Full jitter: uniform in [0, min(cap, base x 2^attempt)] (AWS Architecture Blog, 2015)."""
    return rng.uniform(0.0, min(cap_s, base_s * 2 ** attempt))


def billed_from_log(log_result: str | None) -> int | None:
    """The ``Billed Duration`` of the REPORT line in the base64 log tail, if there."""
    if not log_result:
        return None
    found = _BILLED.search(base64.b64decode(log_result).decode(errors="replace"))
    return int(found.group(1)) if found else None


CONFIG_DEADLINE_S = 60.0  # a start waits this long for the Lambda API to be reachable (a link that is down)


def deployed_memory_mb(function: str, region: str = "", profile: str = "", endpoint_url: str = "") -> int:
    """The memory size ``function`` is deployed with, from the Lambda API: what AWS bills a run for,
    whatever a flag says. A run reads it once, at its start, and records it."""
    try:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            ConnectTimeoutError,
            EndpointConnectionError,
        )
    except ImportError:
        raise ConfigError("the lambda backend needs boto3: pip install 'dorylus-py[aws]'") from None
    deadline = time.monotonic() + CONFIG_DEADLINE_S
    while True:
        try:
            client = boto3.Session(profile_name=profile or None, region_name=region or None).client(
                "lambda", endpoint_url=endpoint_url or None,
                config=Config(connect_timeout=10, read_timeout=30, retries={"total_max_attempts": 3}))
            return int(client.get_function_configuration(FunctionName=function)["MemorySize"])
        except (EndpointConnectionError, ConnectTimeoutError) as e:  # no route for now (a link down): wait
            if time.monotonic() >= deadline:
                raise ConfigError(f"cannot read the configuration of Lambda function {function} "
                                  f"({e}; retried for {CONFIG_DEADLINE_S:.0f} s)") from None
            time.sleep(2.0)
        except (BotoCoreError, ClientError) as e:
            raise ConfigError(f"cannot read the configuration of Lambda function {function} ({e})") from None


class Slots:
    """At most ``limit`` invocations in flight, a limit that may change while they run (``--lambdas
    auto``). Used on the platform's one asyncio loop only."""

    def __init__(self, limit: int):
        self.limit, self.busy, self.waiting = limit, 0, 0
        self._changed = asyncio.Condition()

    async def __aenter__(self) -> None:
        async with self._changed:
            self.waiting += 1
            try:
                await self._changed.wait_for(lambda: self.busy < self.limit)
            finally:
                self.waiting -= 1
            self.busy += 1

    async def __aexit__(self, *exc) -> None:
        async with self._changed:
            self.busy -= 1
            self._changed.notify_all()

    async def resize(self, limit: int) -> None:
        async with self._changed:
            self.limit = limit
            self._changed.notify_all()


class AwsLambdaPlatform(Platform):
    name = "aws-lambda"
    resizable = True  # the concurrency limit: invocations in flight at once
    startup_hint_s = 1.0  # a warm invocation starts in tens of ms; a cold one is hedged after a few seconds

    def __init__(self, function: str, concurrency: int, memory_mb: int, region: str | None = None,
                 profile: str | None = None, endpoint_url: str | None = None, timeout_s: float = 60.0,
                 max_attempts: int = 8, base_delay_s: float = 0.05, max_delay_s: float = 5.0, run_here: bool = False,
                 seed: int = 0, key: bytes = b""):
        super().__init__()
        try:
            from aiobotocore.session import AioSession
        except ImportError:
            raise ConfigError("the lambda backend needs aiobotocore: pip install 'dorylus-py[aws]'") from None
        self.function, self.memory_mb, self.timeout_s = function, memory_mb, timeout_s
        self.max_attempts, self.base_delay_s, self.max_delay_s = max_attempts, base_delay_s, max_delay_s
        self.rng = random.Random(seed)
        self.stats = {"invocations": 0, "throttled": 0, "retries": 0}
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="aws-lambda", daemon=True)
        self._thread.start()
        self.runner = None
        if run_here:
            from dorylus_py.platforms.local import LocalLambdaPlatform

            self.runner = LocalLambdaPlatform(concurrency, memory_mb=memory_mb, timeout_s=timeout_s, seed=seed, key=key)
        session = AioSession(profile=profile)
        from botocore.config import Config

        config = Config(retries={"total_max_attempts": 1},  # the back-off here is ours, with jitter
                        read_timeout=timeout_s + 30, connect_timeout=10, max_pool_connections=max(10, concurrency))
        self._client_cm = session.create_client("lambda", region_name=region, endpoint_url=endpoint_url, config=config)
        self.client = self._run(self._client_cm.__aenter__())
        self.slots = self._run(self._slots(concurrency))

    def _run(self, coro, timeout: float = 60.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    @staticmethod
    async def _slots(n: int) -> Slots:
        return Slots(n)

    def resize(self, size: int) -> None:
        asyncio.run_coroutine_threadsafe(self.slots.resize(max(1, size)), self.loop)
        if self.runner is not None:
            self.runner.resize(size)

    def load(self) -> PoolLoad:
        if self.runner is not None:  # the endpoint only records calls: the work waits and runs here
            here = self.runner.load()
            return PoolLoad(min(self.slots.limit, here.ready), here.waiting + self.slots.waiting, here.busy)
        return PoolLoad(self.slots.limit, self.slots.waiting, self.slots.busy)

    @property
    def concurrency(self) -> int:
        return self.slots.limit

    def invoke(self, event: LeaseEvent) -> None:
        asyncio.run_coroutine_threadsafe(self._invoke(event), self.loop)

    async def _invoke(self, event: LeaseEvent) -> None:
        async with self.slots:
            start = time.time()
            resp, body, error = await self._call(json.dumps(event.to_dict()).encode())
            if resp is None:
                self._finish(event, start, None, False, error)
            elif resp.get("FunctionError"):
                self._finish(event, start, billed_from_log(resp.get("LogResult")), False,
                             f"{resp['FunctionError']}: {body[:300].decode(errors='replace')}")
            elif self.runner is not None:  # the endpoint only recorded the call: run the handler here
                self.runner.invoke(event)
            else:
                self._finish(event, start, billed_from_log(resp.get("LogResult")), True, "")

    async def _call(self, payload: bytes) -> tuple[dict | None, bytes, str]:
        """``(response, body, "")``, or ``(None, b"", why)`` once retrying is pointless or used up. A
        throttled call has not started: it is retried until the function's own timeout has passed,
        however often; other failures count towards ``max_attempts``."""
        from botocore.exceptions import BotoCoreError, ClientError

        error, tries, failures = "", 0, 0
        patience = time.monotonic() + self.timeout_s
        while True:
            if tries:
                self.stats["retries"] += 1
                await asyncio.sleep(backoff_s(min(tries - 1, 30), self.base_delay_s, self.max_delay_s, self.rng))
            tries += 1
            self.stats["invocations"] += 1
            try:
                resp = await self.client.invoke(FunctionName=self.function, InvocationType="RequestResponse",
                                                LogType="Tail", Payload=payload)
                return resp, await resp["Payload"].read(), ""
            except ClientError as e:
                code = e.response.get("Error", {}).get("Code", "")
                status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
                error = f"{code or status}: {e.response.get('Error', {}).get('Message', '')}"
                if code in THROTTLE_CODES or status == 429:
                    self.stats["throttled"] += 1
                    if time.monotonic() < patience:
                        continue
                    return None, b"", f"throttled for {self.timeout_s:.0f} s (the function's timeout): {error}"
                if code not in RETRYABLE_CODES and status < 500:
                    return None, b"", error  # a wrong name, no permission, a bad payload: final
            except (BotoCoreError, OSError, asyncio.TimeoutError) as e:  # connection trouble
                error = f"{type(e).__name__}: {e}"
            failures += 1
            if failures >= self.max_attempts:
                return None, b"", f"gave up after {self.max_attempts} attempts: {error}"

    def _finish(self, event: LeaseEvent, start: float, billed: int | None, ok: bool, error: str) -> None:
        end = time.time()
        self._done.put(Completion({"lease": event.lease}, self.name, start, end, billed if billed is not None else billed_ms(end - start),
                                  self.memory_mb, ok, error))

    def completions(self) -> list[Completion]:
        done = super().completions()
        if self.runner is not None:
            for c in self.runner.completions():
                c.where = self.name
                done.append(c)
        return done

    @staticmethod
    async def _cancel_calls() -> None:
        """End the calls still in flight (a closing graph server wants none of them) before the loop stops,
        rather than leave asyncio to complain about each in the log."""
        calls = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in calls:
            t.cancel()
        await asyncio.gather(*calls, return_exceptions=True)

    def close(self) -> None:
        try:
            self._run(self._cancel_calls(), timeout=10)
            self._run(self._client_cm.__aexit__(None, None, None), timeout=10)
        except Exception:  # noqa: BLE001  (closing a client whose loop is going away)
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if self.runner is not None:
            self.runner.close()
