"""A graph server that tells the test its job's nonce, as every task event tells a worker: what a key holder
knows, for the tests that act as one against a live job (the servers log no nonce: issue 52). Started in
place of ``dorylus graph-server`` with the same flags (:func:`command`); it appends each job's nonce to
the file ``DORYLUS_TEST_NONCE_FILE`` names (:func:`nonces` reads them)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from dorylus_py.serving.process import exit_process, serve_process
from graph_servers.server import GraphServer

NONCE_FILE_ENV = "DORYLUS_TEST_NONCE_FILE"
ROOT = Path(__file__).resolve().parents[2]  # this module's import root, for its process


class InsiderGraphServer(GraphServer):
    def __init__(self, node, start):
        super().__init__(node, start)
        with open(os.environ[NONCE_FILE_ENV], "a") as f:
            f.write(node.session.job.hex() + "\n")


def command(cluster: Path, rank: int, jobs: int) -> list[str]:
    """The command line of an insider graph server of ``cluster`` (as ``dorylus graph-server`` takes it)."""
    return [sys.executable, "-m", "tests.security.insider", "--cluster", str(cluster), "--rank", str(rank),
            "--jobs", str(jobs)]


def environment(env: dict, nonce_file: Path) -> dict:
    """``env`` for an insider graph server that writes its nonces to ``nonce_file``."""
    return env | {NONCE_FILE_ENV: str(nonce_file), "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)}


def nonces(nonce_file: Path, count: int = 1, timeout_s: float = 120) -> list[bytes]:
    """The first ``count`` job nonces the insider wrote (waiting for them up to ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        lines = nonce_file.read_text().split() if nonce_file.exists() else []
        if len(lines) >= count:
            return [bytes.fromhex(line) for line in lines[:count]]
        assert time.monotonic() < deadline, f"the insider graph server wrote {len(lines)} of {count} nonces"
        time.sleep(0.1)


if __name__ == "__main__":
    exit_process(serve_process("graph-server", InsiderGraphServer))  # as graph_servers/__main__.py ends (its docstring: why)
