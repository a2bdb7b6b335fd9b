"""The real ``dorylus`` command, as a subprocess of this checkout, for the hostile suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def dorylus(*argv, cwd=None, timeout: float = 300) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "dorylus_py", *map(str, argv)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=timeout)


def refused(proc: subprocess.CompletedProcess, *words: str) -> str:
    """``proc`` ended with one error line (exit 2, no traceback) holding ``words``; return that line."""
    err = proc.stderr.strip()
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    for w in words:
        assert w in err, (w, err)
    return err
