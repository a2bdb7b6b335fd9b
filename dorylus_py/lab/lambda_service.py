"""A Lambda service for a host of its own: the Lambda Invoke API in front of a pool of worker processes.

``python -m dorylus_py.lab.lambda_service --listen HOST:PORT --function NAME --concurrency N`` answers
the two calls ``--backend lambda`` makes (``platforms/aws.py``, through aiobotocore):

- ``POST /2015-03-31/functions/NAME/invocations`` (``RequestResponse``, optionally ``LogType: Tail``):
  the event goes to a worker of the local emulator's pool (``platforms/local.py``: the real handler on
  the real event JSON, warm containers, the same latency, cold-start and failure knobs) and the answer
  is Lambda's: 200 with the handler's return value and a ``REPORT`` log tail carrying the billed
  duration; 200 with ``X-Amz-Function-Error: Unhandled`` when the handler raised, its worker died, or
  it ran past ``--timeout-s`` (the worker is then killed, its slot freed and a fresh worker started);
  429 ``TooManyRequestsException`` when ``--concurrency`` invocations are running already (no queue:
  AWS throttles a function at its reserved concurrency, and the caller backs off and retries).
- ``GET /2015-03-31/functions/NAME/configuration``: the memory size and timeout (read at a run's start).

``--runtime awslambdaric`` runs each invocation as the image runs it instead: AWS's runtime client
(``python -m awslambdaric lambda_functions.handler.handler``) in a warm container per concurrent call,
against the Lambda Runtime API (``runtime_api.py``), so the event, the context object and the error
reports go through AWS's code; the emulator's latency, cold-start and failure knobs do not apply there.

Every request must carry a valid AWS Signature Version 4 made with the access key pair in this
service's environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``; ``sigv4.py``), else it is
refused with 403: on its headers, before its body is read (its signature too, when it declares the body's
hash), or else once the body is in, which must come within the request deadline; a connection's deadlines
and the caps per address are ``connections.py``'s. The workers get the job key from the service's
environment (``DORYLUS_KEY``, or the secret named by ``DORYLUS_KEY_SECRET``), as a function reads its
own; the events carry none. Plain HTTP: see docs/lab.md for what that exposes.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import math
import os
import signal
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from urllib.parse import unquote

from dorylus_py.errors import ConfigError
from dorylus_py.lab.connections import IDLE_S, GuardedServer
from dorylus_py.lab.runtime_api import Container, Pool, error_of
from dorylus_py.lab.sigv4 import Credentials, Pending, SignatureError, check_headers
from dorylus_py.platforms.base import Completion
from dorylus_py.platforms.local import KILL_GRACE_S, LocalLambdaPlatform
from dorylus_py.timescale import scaled
from dorylus_py.protocol import ProtocolError
from dorylus_py.worker.event import LeaseEvent

log = logging.getLogger(__name__)
API = "/2015-03-31/functions/"
MAX_PAYLOAD = 6 * 2**20  # Lambda's limit for a synchronous invocation's event
DRAIN_BYTES = 64 * 2**10  # of a refused request's body, read (and dropped) before the connection is closed


@dataclass(frozen=True)
class Function:
    """What the service runs, and how (the deployed function's settings, and the emulator's knobs)."""

    name: str = "dorylus"
    memory_mb: int = 3008
    timeout_s: float = 60.0
    concurrency: int = 4  # invocations at once; one more is throttled
    latency_ms: float = 0.0
    cold_start_ms: float = 0.0
    fail_rate: float = 0.0

    def configuration(self, region: str) -> dict:
        return {"FunctionName": self.name, "FunctionArn": f"arn:aws:lambda:{region}:000000000000:function:{self.name}",
                "Handler": "lambda_functions.handler.handler", "MemorySize": self.memory_mb,
                "Timeout": int(self.timeout_s), "State": "Active", "PackageType": "Image", "Version": "$LATEST"}


class _Call:
    def __init__(self):
        self.done = threading.Event()
        self.result: Completion | None = None


class LambdaService:
    """The pool, the calls waiting on it, and the HTTP server in front of them."""

    def __init__(self, function: Function, creds: Credentials, key: bytes, listen: tuple[str, int], seed: int = 0,
                 runtime: str = "emulator"):
        self.function, self.creds = function, creds
        self.stats = {"invocations": 0, "throttled": 0, "refused": 0, "function_errors": 0}
        self._lock = threading.Lock()
        self._calls: dict[str, tuple[dict, _Call]] = {}  # a task copy (its fields, as JSON) -> (its task, its call)
        self.pool, self.containers = None, None
        if runtime == "awslambdaric":  # the image's entry point, the job key in the function's environment
            env = {k: v for k, v in os.environ.items() if k != "DORYLUS_KEY_SECRET"} | {"DORYLUS_KEY": key.hex()}
            root = tempfile.mkdtemp(prefix="lambda-task-root-")  # the installed package is the code
            self.containers = Pool(lambda: Container(env, root, function.configuration(creds.region)))
        else:
            self.pool = LocalLambdaPlatform(function.concurrency, function.latency_ms, function.fail_rate,
                                            function.memory_mb, function.timeout_s, seed=seed,
                                            cold_start_ms=function.cold_start_ms, key=key)
        self._closed = threading.Event()
        self._collector = threading.Thread(target=self._collect, name="completions", daemon=True)
        self._collector.start()
        try:
            self.httpd = GuardedServer(listen, _Handler)
        except OSError as e:
            (self.pool or self.containers).close()
            raise ConfigError(f"cannot listen on {listen[0]}:{listen[1]} ({e.strerror})") from None
        self.httpd.service = self

    @property
    def address(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def invoke(self, event: dict) -> Completion | None:
        """Run ``event`` on a free worker and wait for it; None when every worker is busy (throttled)."""
        try:
            typed = LeaseEvent.from_dict(event)
        except ProtocolError as e:  # what the handler would raise at once, as a function error
            now = time.time()
            return Completion({}, "lambda-service", now, now, 1, self.function.memory_mb, False, f"ProtocolError: {e}")
        task = {"lease": typed.lease}
        call = _Call()
        with self._lock:
            if len(self._calls) >= self.function.concurrency:
                self.stats["throttled"] += 1
                return None
            self.stats["invocations"] += 1
            self._calls[_copy_of(task)] = (task, call)
        if self.containers is not None:
            return self._in_container(event, task)
        self.pool.invoke(typed)
        f = self.function
        if not call.done.wait(f.timeout_s + (f.latency_ms + f.cold_start_ms) / 1000 + scaled(KILL_GRACE_S + 10)):
            # the pool kills a worker at the timeout and answers for it; this is a guard, which frees the slot too
            with self._lock:
                self._calls.pop(_copy_of(task), None)
            now = time.time()
            return Completion(task, "lambda-service", now, now, int(f.timeout_s * 1000), f.memory_mb, False,
                              f"Sandbox.Timedout: Task timed out after {f.timeout_s:.2f} seconds")
        return call.result

    def _in_container(self, event: dict, task: dict) -> Completion:
        """``event`` run by AWS's runtime client in a warm container; the slot is free when it answers."""
        start = time.time()
        try:
            outcome = self.containers.invoke(json.dumps(event).encode(), self.function.timeout_s)
        finally:
            with self._lock:
                self._calls.pop(_copy_of(task), None)
        ok, output, error = outcome.ok, None, ""
        if ok:
            try:
                output = json.loads(outcome.body)
            except ValueError:
                ok, error = False, "Runtime.InvalidResponse: the result is not JSON"
        else:
            error = ": ".join(error_of(outcome))
        with self._lock:
            self.stats["function_errors"] += not ok
        return Completion(task, "lambda-service", start, time.time(), max(1, math.ceil(outcome.ms)),
                          self.function.memory_mb, ok, error, output)

    def _collect(self) -> None:
        """Hand each completion to the request waiting on it; a slot is free once its worker is."""
        if self.pool is None:
            return
        while not self._closed.is_set():
            for c in self.pool.wait_completions(0.5):
                with self._lock:
                    _, call = self._calls.pop(_copy_of(c.task), (None, None))
                    if not c.ok:
                        self.stats["function_errors"] += 1
                if call is not None:
                    call.result = c
                    call.done.set()

    def refused(self, why: SignatureError, client: str) -> None:
        with self._lock:
            self.stats["refused"] += 1
            n = self.stats["refused"]
        if n <= 5 or n % 1000 == 0:
            log.warning("refused a request from %s: %s (%d refused so far)", client, why, n)

    def serve_forever(self) -> None:
        self._serving = True
        self.httpd.serve_forever(poll_interval=0.2)

    def close(self) -> None:
        if getattr(self, "_serving", False):  # (shutdown waits for a loop that must have started)
            self.httpd.shutdown()
        self.httpd.server_close()
        self._closed.set()
        self._collector.join(timeout=2)
        (self.pool or self.containers).close()


class _Handler(BaseHTTPRequestHandler):
    """One connection's thread: its requests, each checked for its signature before its body is read (when
    the request declares the body's hash; else before anything but the body), under the deadlines and caps
    of ``connections.py``."""

    protocol_version = "HTTP/1.1"  # keep-alive: aiobotocore reuses its connections
    server_version = "dorylus-lambda-service"

    @property
    def service(self) -> LambdaService:
        return self.server.service

    def setup(self) -> None:
        self.timeout = scaled(IDLE_S)  # per read: what bounds a caller's wait between requests (the server bounds a request)
        super().setup()

    def log_message(self, *args) -> None:  # one line per refusal is logged elsewhere; not every request
        pass

    def handle_one_request(self) -> None:
        """Wait for the next request's first byte, then start its clock: the whole request must be in within
        the deadline, or the server cuts the connection."""
        try:
            started = self.rfile.peek(1)
        except TimeoutError:
            started = b""
        if not started:
            self.close_connection = True
            return
        self.server.held.clock(self.request, time.monotonic())
        super().handle_one_request()
        self.server.held.pause(self.request)

    def do_GET(self) -> None:  # noqa: N802
        pending = self._signed_headers()
        if pending is None or not self._signed_body(pending, b""):
            return
        if self._route("configuration"):
            self._json(200, self.service.function.configuration(self.service.creds.region))

    def do_POST(self) -> None:  # noqa: N802
        length = self.headers.get("Content-Length", "")
        if not length.isdigit():
            self.close_connection = True  # (where its body ends is unknown)
            return self._error(411, "InvalidRequestContentException", "Content-Length required")
        if int(length) > MAX_PAYLOAD:
            self.close_connection = True
            return self._error(413, "RequestTooLargeException", f"Request must be smaller than {MAX_PAYLOAD} bytes")
        pending = self._signed_headers(int(length))
        if pending is None:
            return
        body = self.rfile.read(int(length))
        if len(body) < int(length):  # cut at the deadline, or the peer gave up
            self.close_connection = True
            return
        if not self._signed_body(pending, body) or not self._route("invocations"):
            return
        if self.headers.get("X-Amz-Invocation-Type", "RequestResponse") != "RequestResponse":
            return self._error(400, "InvalidParameterValueException", "only RequestResponse invocations are served")
        try:
            event = json.loads(body)
        except ValueError:
            return self._error(400, "InvalidRequestContentException", "Could not parse request body into json")
        self.server.held.pause(self.request)  # the function's run is not the caller's to hurry
        done = self.service.invoke(event)
        self.server.held.clock(self.request, time.monotonic())  # its answer goes out within the deadline
        if done is None:
            return self._error(429, "TooManyRequestsException", "Rate Exceeded.",
                               {"Reason": "ReservedFunctionConcurrentInvocationLimitExceeded"})
        self._answer(done)

    def _signed_headers(self, length: int = 0) -> Pending | None:
        """The headers' part of the signature check (all of it, when the request declares its body's hash);
        None if it failed: then answered with 403 and the connection closed, its body never parsed."""
        path, _, query = self.path.partition("?")
        headers: dict[str, list[str]] = {}
        for name, value in self.headers.items():
            headers.setdefault(name.lower(), []).append(value)
        try:
            return check_headers(self.service.creds, self.command, path, query, headers)
        except SignatureError as e:
            self._refuse(e, length)
            return None

    def _signed_body(self, pending: Pending, body: bytes) -> bool:
        """Whether ``body`` completes a valid signature (the connection is then a caller's); else answered with 403."""
        try:
            pending.check_body(body)
        except SignatureError as e:
            self._refuse(e, 0)
            return False
        self.server.held.signed(self.request)
        return True

    def _refuse(self, why: SignatureError, unread: int) -> None:
        """403, and the connection closed. Up to ``DRAIN_BYTES`` of an unread body are read and dropped first
        (unparsed): closing on unread bytes resets the connection, which can lose the answer on its way."""
        self.service.refused(why, self.client_address[0])
        self.close_connection = True
        if unread <= DRAIN_BYTES:
            self.rfile.read(unread)
        self._error(403, why.code, str(why))

    def _route(self, call: str) -> bool:
        """Whether the path is ``call`` on this service's function; else answered with 404."""
        path = self.path.partition("?")[0]
        name, _, tail = path[len(API):].partition("/") if path.startswith(API) else ("", "", "")
        name = unquote(name).split(":function:")[-1].split(":")[0]
        if tail == call and name == self.service.function.name:
            return True
        self._error(404, "ResourceNotFoundException", f"Function not found: {unquote(path)[:200]}")
        return False

    def _answer(self, c: Completion) -> None:
        request_id = str(uuid.uuid4())
        run_ms = max(0.0, (c.end - c.start) * 1000)
        headers = {"X-Amz-Executed-Version": "$LATEST", "x-amzn-RequestId": request_id}
        if self.headers.get("X-Amz-Log-Type") == "Tail":
            tail = (f"START RequestId: {request_id} Version: $LATEST\nEND RequestId: {request_id}\n"
                    f"REPORT RequestId: {request_id}\tDuration: {run_ms:.2f} ms\tBilled Duration: {c.billed_ms} ms\t"
                    f"Memory Size: {c.memory_mb} MB\t\n")
            headers["X-Amz-Log-Result"] = base64.b64encode(tail.encode()).decode()
        if c.ok:
            return self._json(200, c.output, headers)
        kind = c.error.split(":", 1)[0] if ":" in c.error else "Runtime.ExitError"
        self._json(200, {"errorMessage": c.error[:1000], "errorType": kind, "stackTrace": []},
                   headers | {"X-Amz-Function-Error": "Unhandled"})

    def _error(self, status: int, code: str, message: str, extra: dict | None = None) -> None:
        self._json(status, {"Type": "User", "message": message} | (extra or {}),
                   {"x-amzn-ErrorType": code, "x-amzn-RequestId": str(uuid.uuid4())})

    def _json(self, status: int, obj, headers: dict | None = None) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        if self.close_connection:
            self.send_header("Connection", "close")
        for name, value in ({"Content-Type": "application/json"} | (headers or {})).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _copy_of(task: dict) -> str:
    """One copy of a task (its key and attempt number), whichever dict carries it."""
    return json.dumps(task, sort_keys=True)


def main(argv=None) -> int:
    from dorylus_py.serving.process import run_main

    ap = argparse.ArgumentParser(prog="python -m dorylus_py.lab.lambda_service", description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", required=True, metavar="HOST:PORT", help="address to serve the Lambda API on")
    ap.add_argument("--function", default=Function.name, help="the function's name (callers name it in the path)")
    ap.add_argument("--region", default=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
                    help="the region callers sign for (default: AWS_DEFAULT_REGION, else us-east-1)")
    ap.add_argument("--concurrency", type=int, default=Function.concurrency, help="workers; one more call is throttled")
    ap.add_argument("--memory-mb", type=int, default=Function.memory_mb, help="the memory size callers are told (billing)")
    ap.add_argument("--timeout-s", type=float, default=Function.timeout_s, help="each invocation's time limit")
    ap.add_argument("--latency-ms", type=float, default=0.0, help="added before each invocation starts")
    ap.add_argument("--cold-start-ms", type=float, default=0.0, help="added to each worker's first invocation")
    ap.add_argument("--fail-rate", type=float, default=0.0, help="chance that an invocation fails (before or part-way)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the injected failures")
    ap.add_argument("--runtime", choices=("emulator", "awslambdaric"), default="emulator",
                    help="what runs an invocation: the local emulator's worker pool (default), or AWS's runtime client "
                    "(python -m awslambdaric lambda_functions.handler.handler, as the image runs it) against the Lambda "
                    "Runtime API, one warm container per concurrent call (pip install awslambdaric)")
    args = ap.parse_args(argv)
    return run_main(lambda: _serve(args))


def _serve(args) -> None:
    from dorylus_py.jobkey import load_job_key

    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--listen {args.listen!r}: expected HOST:PORT")
    if args.concurrency < 1 or args.memory_mb < 128 or args.timeout_s <= 0 or not 0 <= args.fail_rate < 1:
        raise ConfigError("--concurrency >= 1, --memory-mb >= 128, --timeout-s > 0 and --fail-rate in [0, 1) please")
    if args.runtime == "awslambdaric":
        if args.latency_ms or args.cold_start_ms or args.fail_rate:
            raise ConfigError("--latency-ms, --cold-start-ms and --fail-rate are the emulator's: not with --runtime awslambdaric")
        import importlib.util

        if importlib.util.find_spec("awslambdaric") is None:
            raise ConfigError("--runtime awslambdaric needs AWS's runtime client: pip install awslambdaric")
    key_id, secret = os.environ.get("AWS_ACCESS_KEY_ID", ""), os.environ.get("AWS_SECRET_ACCESS_KEY", "")
    if not key_id or not secret:
        raise ConfigError("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY: the credentials callers must sign with")
    function = Function(args.function, args.memory_mb, args.timeout_s, args.concurrency, args.latency_ms,
                        args.cold_start_ms, args.fail_rate)
    service = LambdaService(function, Credentials(key_id, secret, args.region), load_job_key(), (host, int(port)),
                            args.seed, args.runtime)
    print(f"lambda service: function {function.name} at {service.address}, {function.concurrency} workers",
          file=sys.stderr, flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threading.Thread(target=service.serve_forever, name="http", daemon=True).start()
    try:
        while not stop.wait(1.0):
            pass
    finally:
        service.close()
        ended = service.httpd.ended.counts
        print(f"lambda service: {', '.join(f'{v} {k}' for k, v in service.stats.items())}"
              + (f"; connections ended early: {', '.join(f'{v} {k}' for k, v in ended.items())}" if ended else ""),
              file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
