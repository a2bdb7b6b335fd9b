"""The Lambda service for a function whose code is a set of folders: the Invoke API on loopback, each
invocation run as the image runs it, by AWS's runtime client in a warm container that sees nothing but
those folders (``lab/runtime_api.py``).

Every request goes first to the moto server, the control plane: it checks the caller's signature
and its IAM policy (``lambda:InvokeFunction``), and answers everything but invocations itself (the
function's configuration, for one). An invocation moto accepted is then run in a container, one warm
container per concurrent call: ``python -P -S -m awslambdaric lambda_functions.handler.handler`` (the
image's ENTRYPOINT and CMD; no site-packages, nor the working folder: ``children.py``) with ``PYTHONPATH``
the given folders (the build context, then the packages), the function's environment variables from its
configuration, and its role's credentials. Its answer goes back as Lambda's does: the handler's result, or ``X-Amz-Function-Error``
and the runtime client's error document, with a log tail whose ``REPORT`` line carries the billed
duration.
"""

from __future__ import annotations

import base64
import json
import math
import re
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from dorylus_py.lab.runtime_api import Container, Pool, QuietServer, error_of, python_with

INVOKE = re.compile(r"^/20\d\d-\d\d-\d\d/functions/([^/]+)/invocations$")


class LambdaService:
    """The Invoke API for ``function`` at ``url`` (``start()``), backed by moto at ``control``."""

    def __init__(self, control: str, function: dict, paths: list[str], env: dict[str, str], ca_bundle: str = "",
                 log: Path | None = None):
        self.control, self.function, self.paths, self.ca_bundle = control, function, paths, ca_bundle
        flags, path_env = python_with(paths)
        self.env = env | function.get("Environment", {}).get("Variables", {}) | path_env
        self.pool = Pool(lambda: Container(self.env, paths[0], function, log, flags))
        self.invocations: list[dict] = []  # each invocation's outcome: ok, ms, error
        self._lock = threading.Lock()
        self._server: QuietServer | None = None

    @property
    def containers(self) -> list[Container]:
        return self.pool.containers

    def start(self) -> str:
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                service._serve(self)

            do_POST = do_PUT = do_DELETE = do_GET

            def log_message(self, *args):
                pass

        self._server = QuietServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, name="lambda-service", daemon=True).start()
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
        self.pool.close()

    def _serve(self, request: BaseHTTPRequestHandler) -> None:
        import requests

        body = request.rfile.read(int(request.headers.get("Content-Length") or 0))
        control = requests.request(request.command, self.control + request.path, data=body, timeout=60,
                                   headers=dict(request.headers), verify=self.ca_bundle or True)
        status, headers, answer = control.status_code, {"Content-Type": "application/json"}, control.content
        if INVOKE.match(request.path.split("?")[0]) and status == 200:  # accepted: now run it
            outcome = self.pool.invoke(body, float(self.function["Timeout"]))
            with self._lock:
                self.invocations.append({"ok": outcome.ok, "ms": outcome.ms, "error": outcome.error})
            headers["X-Amz-Log-Result"] = base64.b64encode(
                f"REPORT RequestId: {outcome.request_id}\tDuration: {outcome.ms:.2f} ms\tBilled Duration: "
                f"{max(1, math.ceil(outcome.ms))} ms\tMemory Size: {self.function['MemorySize']} MB\n".encode()).decode()
            answer = outcome.body
            if not outcome.ok:
                kind, message = error_of(outcome)
                headers["X-Amz-Function-Error"] = "Unhandled"
                if not outcome.body.startswith(b"{"):  # the service's own (a timeout, a dead container)
                    answer = json.dumps({"errorMessage": message, "errorType": kind}).encode()
        elif status != 200 or not INVOKE.match(request.path.split("?")[0]):
            headers = {k: v for k, v in control.headers.items() if k.lower().startswith(("content-type", "x-amz"))}
        request.send_response(status)
        for k, v in headers.items():
            request.send_header(k, v)
        request.send_header("Content-Length", str(len(answer)))
        request.end_headers()
        request.wfile.write(answer)
