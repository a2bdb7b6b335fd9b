"""A Lambda container as the image runs it: AWS's runtime interface client (``python -m awslambdaric
HANDLER``, the image's ENTRYPOINT and CMD) against this module's Lambda Runtime API, so the event's
decoding, the context object (its deadline, request id, function ARN), the result's encoding and error
reports all go through AWS's own client, not a stand-in of this project.

The Runtime API (version 2018-06-01), one server per container, as Lambda gives each execution
environment its own (``AWS_LAMBDA_RUNTIME_API``):

- ``GET /2018-06-01/runtime/invocation/next``: the next event, once there is one, with the headers
  ``Lambda-Runtime-Aws-Request-Id``, ``Lambda-Runtime-Deadline-Ms`` (Unix ms), ``Lambda-Runtime-Invoked-
  Function-Arn`` and ``Lambda-Runtime-Trace-Id``;
- ``POST .../invocation/REQUEST_ID/response`` (202; a result over 6 MB is the invocation's error, as on
  Lambda) and ``.../invocation/REQUEST_ID/error`` (202: ``errorType``, ``errorMessage``, the
  ``Lambda-Runtime-Function-Error-Type`` header); an unknown request id is answered 400;
- ``POST /2018-06-01/runtime/init/error`` (202): the handler could not be loaded; the client exits and
  every invocation gets that error.

An invocation still running at its deadline kills the container (``Sandbox.Timedout``); one whose
container died is ``Runtime.ExitError``; the next invocation starts a fresh container (a cold start).

The client's Python starts as every Python of the project does (``children.py``: ``-P``,
``PYTHONSAFEPATH=1``): the image's ``python -m`` would put its working folder, the task root, first on
``sys.path``; here the task root comes from ``PYTHONPATH`` alone, as the image's ``ENV PYTHONPATH`` has it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from dorylus_py import children
from dorylus_py.timescale import scaled

API = "/2018-06-01/runtime"
MAX_RESPONSE = 6 * 2**20  # a synchronous invocation's response payload, as Lambda limits it
MAX_ERROR = 2**20
ENTRYPOINT = ["-m", "awslambdaric"]  # the image's: ENTRYPOINT ["/usr/bin/python3.11", "-m", "awslambdaric"]
HANDLER = "lambda_functions.handler.handler"  # the image's CMD
COLD_START_S = 60  # a container's start, before its deadline runs: the client's import of the handler


@dataclass(frozen=True)
class Outcome:
    """One invocation's end: the result's bytes (``ok``), or Lambda's error type and message."""

    ok: bool
    body: bytes
    error_type: str = ""
    ms: float = 0.0  # from the event's hand-over to the answer: what Lambda bills
    request_id: str = ""

    @property
    def error(self) -> str:
        return f"{self.error_type}: {self.body.decode(errors='replace')[:500]}" if not self.ok else ""


class _Invocation:
    def __init__(self, payload: bytes, timeout_s: float):
        self.id, self.payload, self.timeout_s = str(uuid.uuid4()), payload, timeout_s
        self.taken = 0.0  # monotonic, when /next handed it out
        self.deadline_ms = 0  # Unix ms: when /next handed it out, plus the function's timeout
        self.done = threading.Event()
        self.outcome: Outcome | None = None


class Container:
    """One execution environment: its Runtime API on 127.0.0.1 and the runtime client process. Runs one
    invocation at a time (``invoke``); ``loaded`` and ``alive`` tell what became of its start."""

    def __init__(self, env: dict[str, str], cwd: str | Path, function: dict, log: Path | None = None,
                 python_flags: tuple[str, ...] = (), handler: str = HANDLER):
        self.function, self.cwd = function, str(cwd)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._pending: _Invocation | None = None  # handed in, not yet taken by /next
        self._current: _Invocation | None = None  # taken, not yet answered
        self.init_error: Outcome | None = None
        self._closed = False
        self.server = _Server(("127.0.0.1", 0), _Handler)
        self.server.container = self
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True,
                         name="runtime-api").start()
        host, port = self.server.server_address[:2]
        name, memory = function["FunctionName"], str(function.get("MemorySize", 128))
        self.env = children.env(env | {  # the working folder kept off the client's path (children.py)
            "AWS_LAMBDA_RUNTIME_API": f"{host}:{port}", "_HANDLER": handler, "AWS_LAMBDA_FUNCTION_NAME": name,
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": memory, "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
            "LAMBDA_TASK_ROOT": self.cwd, "AWS_LAMBDA_LOG_GROUP_NAME": f"/aws/lambda/{name}",
            "AWS_LAMBDA_LOG_STREAM_NAME": f"{time.strftime('%Y/%m/%d')}/[$LATEST]{uuid.uuid4().hex}"})
        self.command = children.python(*python_flags, *ENTRYPOINT, handler)
        out = open(log, "ab") if log else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(self.command, cwd=self.cwd, env=self.env, stdout=out, stderr=out)
        finally:
            if log:
                out.close()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None and self.init_error is None

    def invoke(self, payload: bytes, timeout_s: float) -> Outcome:
        """Hand ``payload`` (the event's JSON) to the runtime and wait for its answer, at most
        ``timeout_s`` (the function's timeout) from when the runtime took it."""
        call = _Invocation(payload, timeout_s)
        with self._cond:
            if self.init_error is not None:
                return self.init_error
            self._pending = call
            self._cond.notify_all()
        start = time.monotonic()
        while not call.done.wait(0.1):
            if self.init_error is not None:
                return self.init_error
            if self.proc.poll() is not None:
                return self._end(call, Outcome(False, f"exit status {self.proc.returncode}".encode(),
                                               "Runtime.ExitError", request_id=call.id))
            began = call.taken or start  # the deadline runs from the hand-over; before it, the cold start
            if time.monotonic() - began > timeout_s + (0 if call.taken else scaled(COLD_START_S)):
                self.kill()
                return self._end(call, Outcome(False, f"Task timed out after {timeout_s:.2f} seconds".encode(),
                                               "Sandbox.Timedout", (time.monotonic() - began) * 1000, call.id))
        return call.outcome

    def _end(self, call: _Invocation, outcome: Outcome) -> Outcome:
        with self._cond:
            if self._pending is call:
                self._pending = None
            if self._current is call:
                self._current = None
        return outcome

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()
        self.server.shutdown()
        self.server.server_close()

    # --- the API's side (request threads) ------------------------------------------------------------

    def next_invocation(self) -> _Invocation | None:
        """The next event, once handed in (None when the container is closing)."""
        with self._cond:
            while self._pending is None and not self._closed:
                self._cond.wait(1.0)
            if self._closed:
                return None
            call, self._pending = self._pending, None
            call.taken = time.monotonic()
            call.deadline_ms = int((time.time() + call.timeout_s) * 1000)
            self._current = call
            return call

    def answer(self, request_id: str, outcome: Outcome) -> bool:
        with self._cond:
            call = self._current
            if call is None or call.id != request_id:
                return False
            self._current = None
        call.outcome = Outcome(outcome.ok, outcome.body, outcome.error_type, (time.monotonic() - call.taken) * 1000,
                               request_id)
        call.done.set()
        return True

    def failed_init(self, outcome: Outcome) -> None:
        with self._cond:
            self.init_error = outcome


class QuietServer(ThreadingHTTPServer):
    """A threaded HTTP server whose peers may go mid-connection (a container killed, a client done with its
    keep-alive connection) without a traceback on stderr."""

    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Server(QuietServer):
    container: Container


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        if self.path != f"{API}/invocation/next":
            return self._reply(404, {"errorType": "InvalidRequest", "errorMessage": f"no such endpoint {self.path[:80]}"})
        call = self.server.container.next_invocation()
        if call is None:
            return self._reply(500, {"errorType": "Runtime.Closing", "errorMessage": "the container is shutting down"})
        fn = self.server.container.function
        self._reply(200, call.payload, {
            "Lambda-Runtime-Aws-Request-Id": call.id, "Lambda-Runtime-Deadline-Ms": str(call.deadline_ms),
            "Lambda-Runtime-Invoked-Function-Arn": fn.get("FunctionArn", fn["FunctionName"]),
            "Lambda-Runtime-Trace-Id": f"Root=1-{int(time.time()):08x}-{uuid.uuid4().hex[:24]};Sampled=0"})

    def do_POST(self) -> None:  # noqa: N802
        length = self.headers.get("Content-Length", "")
        if not length.isdigit():
            return self._reply(411, {"errorType": "InvalidRequest", "errorMessage": "Content-Length required"})
        container, size = self.server.container, int(length)
        parts = self.path[len(API) + 1:].split("/") if self.path.startswith(API + "/") else []
        if parts == ["init", "error"]:
            container.failed_init(Outcome(False, self.rfile.read(min(size, MAX_ERROR)), self._error_type()))
            return self._reply(202, {"status": "OK"})
        if len(parts) != 3 or parts[0] != "invocation" or parts[2] not in ("response", "error"):
            return self._reply(404, {"errorType": "InvalidRequest", "errorMessage": f"no such endpoint {self.path[:80]}"})
        if parts[2] == "response" and size > MAX_RESPONSE:
            self.close_connection = True  # its body is not read
            message = f"Response payload size ({size} bytes) exceeded maximum allowed payload size ({MAX_RESPONSE} bytes)."
            container.answer(parts[1], Outcome(False, json.dumps({"errorMessage": message}).encode(),
                                               "Function.ResponseSizeTooLarge"))
            return self._reply(413, {"errorType": "RequestEntityTooLarge", "errorMessage": message})
        body = self.rfile.read(min(size, MAX_RESPONSE if parts[2] == "response" else MAX_ERROR))
        outcome = Outcome(True, body) if parts[2] == "response" else Outcome(False, body, self._error_type())
        if not container.answer(parts[1], outcome):
            return self._reply(400, {"errorType": "InvalidRequestID", "errorMessage": f"{parts[1][:40]}: not the current invocation"})
        self._reply(202, {"status": "OK"})

    def _error_type(self) -> str:
        given = self.headers.get("Lambda-Runtime-Function-Error-Type", "") or "Unhandled"
        return given[:200]

    def _reply(self, status: int, body, headers: dict | None = None) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        try:
            self.send_response(status)
            for k, v in ({"Content-Type": "application/json"} | (headers or {})).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client went (it exits right after reporting an init error)
            self.close_connection = True


def error_of(outcome: Outcome) -> tuple[str, str]:
    """(errorType, errorMessage) of a failed invocation, from the client's error document."""
    try:
        doc = json.loads(outcome.body)
    except ValueError:
        doc = {}
    if not isinstance(doc, dict):
        doc = {}
    return str(doc.get("errorType") or outcome.error_type), str(doc.get("errorMessage", outcome.body[:500].decode(errors="replace")))


def python_with(paths: list[str]) -> tuple[tuple[str, ...], dict[str, str]]:
    """The flags and environment of a container's Python that sees only ``paths`` (the build context, the
    image's packages; absolute) and the standard library: no site-packages (``-S``), ``PYTHONPATH`` the
    folders, as the image's ``ENV PYTHONPATH=${LAMBDA_TASK_ROOT}`` over its own Python's packages."""
    return ("-S",), {"PYTHONPATH": os.pathsep.join(paths)}


class Pool:
    """Warm containers, one per invocation running at once, each started by ``start()`` when none is
    idle (a cold start); one that died or timed out is closed, and the next call starts another."""

    def __init__(self, start):
        self._start = start
        self._idle: list[Container] = []
        self._lock = threading.Lock()
        self.containers: list[Container] = []  # every container started, in order

    def invoke(self, payload: bytes, timeout_s: float) -> Outcome:
        with self._lock:
            container = self._idle.pop() if self._idle else None
        if container is None:
            container = self._start()
            with self._lock:
                self.containers.append(container)
        try:
            return container.invoke(payload, timeout_s)
        finally:
            if container.alive:
                with self._lock:
                    self._idle.append(container)
            else:
                container.close()

    def close(self) -> None:
        with self._lock:
            containers, self._idle = list(self.containers), []
        for c in containers:
            c.close()
