"""The Lambda service for a function whose code is a set of folders: the Invoke API on loopback, each
invocation run by the real handler in a warm process that sees nothing but those folders.

Every request goes first to the moto server, the control plane: it checks the caller's signature
and its IAM policy (``lambda:InvokeFunction``), and answers everything but invocations itself (the
function's configuration, for one). An invocation moto accepted is then run by a runtime process,
one warm "container" per concurrent call: ``python -S -I`` (no site-packages, no ``PYTHON*``
variables) with ``sys.path`` = the given folders ahead of the standard library, the function's
environment variables from its configuration, and its role's credentials. Its answer goes back as
Lambda's does: the handler's result, or ``X-Amz-Function-Error`` and the error, with a log tail
whose ``REPORT`` line carries the billed duration.
"""

from __future__ import annotations

import base64
import json
import math
import queue
import re
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from dorylus_py import children

# The runtime's entry point: folders first on sys.path, import the handler once, then one event per
# line on stdin, one answer per line on stdout. Its first line says what it loaded, and from where.
BOOTSTRAP = r"""
import json, sys, time
paths, timeout_ms = json.loads(sys.argv[1]), int(sys.argv[2])
sys.path[:0] = paths
import lambda_functions.handler as h
files = {n: getattr(m, "__file__", None) or "" for n, m in list(sys.modules.items())}
print(json.dumps({"path": sys.path, "files": files}), flush=True)
class Context:
    def __init__(self):
        self.deadline = time.monotonic() + timeout_ms / 1000
    def get_remaining_time_in_millis(self):
        return max(0, int((self.deadline - time.monotonic()) * 1000))
for line in sys.stdin:
    start = time.monotonic()
    try:
        out = {"result": h.handler(json.loads(line), Context())}
    except Exception as e:
        out = {"error": f"{type(e).__name__}: {e}"}
    out["ms"] = (time.monotonic() - start) * 1000
    print(json.dumps(out, default=str), flush=True)
"""
INVOKE = re.compile(r"^/20\d\d-\d\d-\d\d/functions/([^/]+)/invocations$")


class Runtime:
    """One warm container: a runtime process that runs one invocation at a time."""

    def __init__(self, paths: list[str], env: dict[str, str], timeout_s: float):
        self.timeout_s = timeout_s
        self.proc = subprocess.Popen(children.python("-S", "-I", "-c", BOOTSTRAP, json.dumps(paths), int(timeout_s * 1000)),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
        self.loaded = json.loads(self._line() or "{}")  # the cold start

    def _line(self) -> str:
        return self.proc.stdout.readline()

    def invoke(self, payload: str) -> dict:
        try:
            self.proc.stdin.write(payload.replace("\n", " ") + "\n")
            self.proc.stdin.flush()
            line = self._line()
        except OSError:  # it died (at its import, say): every invocation fails, as on Lambda
            line = ""
        return json.loads(line) if line else {"error": f"Runtime.ExitError: exit {self.proc.wait()}", "ms": 0}

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


class LambdaService:
    """The Invoke API for ``function`` at ``url`` (``start()``), backed by moto at ``control``."""

    def __init__(self, control: str, function: dict, paths: list[str], env: dict[str, str], ca_bundle: str = ""):
        self.control, self.function, self.paths, self.ca_bundle = control, function, paths, ca_bundle
        self.env = env | function.get("Environment", {}).get("Variables", {})
        self.idle: queue.Queue[Runtime] = queue.Queue()
        self.runtimes: list[Runtime] = []
        self.invocations: list[dict] = []  # each invocation's outcome: ok, ms
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> str:
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                service._serve(self)

            do_POST = do_PUT = do_DELETE = do_GET

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, name="lambda-service", daemon=True).start()
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
        for runtime in self.runtimes:
            runtime.close()

    def _serve(self, request: BaseHTTPRequestHandler) -> None:
        import requests

        body = request.rfile.read(int(request.headers.get("Content-Length") or 0))
        control = requests.request(request.command, self.control + request.path, data=body, timeout=60,
                                   headers=dict(request.headers), verify=self.ca_bundle or True)
        status, headers, answer = control.status_code, {"Content-Type": "application/json"}, control.content
        if INVOKE.match(request.path.split("?")[0]) and status == 200:  # accepted: now run it
            outcome = self._run(body.decode())
            headers["X-Amz-Log-Result"] = base64.b64encode(
                f"REPORT RequestId: rehearsal\tDuration: {outcome['ms']:.2f} ms\tBilled Duration: "
                f"{max(1, math.ceil(outcome['ms']))} ms\tMemory Size: {self.function['MemorySize']} MB\n".encode()).decode()
            if "error" in outcome:
                headers["X-Amz-Function-Error"] = "Unhandled"
                answer = json.dumps({"errorMessage": outcome["error"]}).encode()
            else:
                answer = json.dumps(outcome["result"]).encode()
        elif status != 200 or not INVOKE.match(request.path.split("?")[0]):
            headers = {k: v for k, v in control.headers.items() if k.lower().startswith(("content-type", "x-amz"))}
        request.send_response(status)
        for k, v in headers.items():
            request.send_header(k, v)
        request.send_header("Content-Length", str(len(answer)))
        request.end_headers()
        request.wfile.write(answer)

    def _run(self, payload: str) -> dict:
        try:
            runtime = self.idle.get_nowait()
        except queue.Empty:
            runtime = Runtime(self.paths, self.env, float(self.function["Timeout"]))  # a cold start
            with self._lock:
                self.runtimes.append(runtime)
        try:
            outcome = runtime.invoke(payload)
        finally:
            self.idle.put(runtime)
        with self._lock:
            self.invocations.append({"ok": "error" not in outcome, "ms": outcome["ms"], "error": outcome.get("error")})
        return outcome
