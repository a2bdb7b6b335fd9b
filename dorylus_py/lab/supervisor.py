"""A process supervisor for a lab host: what systemd does for ``dorylus`` on a real server.

``python -m dorylus_py.lab.supervisor [--restart-s S] [--burst N --window-s W] -- COMMAND...`` runs
COMMAND and, like a unit with ``Restart=on-failure``, starts it again ``--restart-s`` after it exits
with a non-zero code or is killed by a signal, at most ``--burst`` times within ``--window-s``
(``StartLimitBurst``/``StartLimitIntervalSec``; past that it gives up, exit code 1). A clean exit (0)
ends the supervisor with 0. SIGTERM or SIGINT stop the command (SIGTERM, then SIGKILL after
``--stop-timeout-s``) and end the supervisor with 0. Each start and exit is one line on stderr, as
in a journal. The command inherits the supervisor's environment, output and namespace.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
import time


def _say(name: str, text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} supervisor[{name}]: {text}", file=sys.stderr, flush=True)


def _describe(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exited with code {code}"


def supervise(command: list[str], name: str, restart_s: float, burst: int, window_s: float,
              stop_timeout_s: float) -> int:
    stopping = threading.Event()
    child: subprocess.Popen | None = None

    def stop(signum, _frame) -> None:
        stopping.set()
        if child is not None and child.poll() is None:
            child.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    starts: list[float] = []
    while not stopping.is_set():
        now = time.monotonic()
        starts = [t for t in starts if now - t < window_s] + [now]
        if len(starts) > burst + 1:
            _say(name, f"restarted {burst} times within {window_s:.0f} s; giving up")
            return 1
        child = subprocess.Popen(command)
        _say(name, f"started (pid {child.pid})")
        if stopping.is_set():  # the signal came while it was starting
            child.terminate()
        while True:
            try:
                code = child.wait(timeout=stop_timeout_s if stopping.is_set() else None)
                break
            except subprocess.TimeoutExpired:
                child.kill()
        _say(name, _describe(code))
        if code == 0 or stopping.is_set():
            return 0
        stopping.wait(restart_s)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dorylus_py.lab.supervisor", description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", default="service", help="what the journal lines call the command")
    ap.add_argument("--restart-s", type=float, default=1.0, help="wait before a restart (RestartSec)")
    ap.add_argument("--burst", type=int, default=5, help="restarts allowed within --window-s (StartLimitBurst)")
    ap.add_argument("--window-s", type=float, default=60.0, help="StartLimitIntervalSec")
    ap.add_argument("--stop-timeout-s", type=float, default=10.0, help="SIGTERM, then SIGKILL after this")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command to supervise (put it after --)")
    if args.restart_s < 0 or args.burst < 0 or args.window_s <= 0 or args.stop_timeout_s <= 0:
        ap.error("--restart-s and --burst must be >= 0, --window-s and --stop-timeout-s > 0")
    return supervise(command, args.name, args.restart_s, args.burst, args.window_s, args.stop_timeout_s)


if __name__ == "__main__":
    sys.exit(main())
