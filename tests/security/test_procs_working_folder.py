"""Nothing in the folder where a job is started runs in the processes it starts (issue 52, item 1).

The attack: a ``zmq.py`` in the folder where a user ran ``dorylus train --backend local`` was imported by the
weight server, both graph servers and their Lambda workers' fork servers (``python -m`` and ``-c`` put the
working folder first on the path), each holding the job key, and the job still ended well. Here the planted
module writes down who imported it and then hands over the real one, as an attacker's would, so a job that
imports it still runs and the test names every process that did."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dorylus_py import children

PLANTED = '''
import importlib, os, sys
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "imported-by.txt"), "a") as f:
    f.write(f"{os.getpid()} {sys.argv!r}\\n")
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
del sys.modules[__name__]
sys.modules[__name__] = importlib.import_module(__name__)  # the real one, so that the process goes on
'''


def plant(folder: Path) -> Path:
    """A ``zmq.py`` in ``folder`` (every server, worker and fork server imports zmq); the file it writes to."""
    (folder / "zmq.py").write_text(PLANTED)
    return folder / "imported-by.txt"


def importers(marker: Path) -> list[str]:
    return marker.read_text().splitlines() if marker.exists() else []


def users_env() -> dict[str, str]:
    """A user's shell: no PYTHONSAFEPATH for the processes to inherit unless the project sets it."""
    return {k: v for k, v in os.environ.items() if k != children.SAFE_PATH_ENV}


def test_a_child_python_its_children_and_its_fork_server_leave_the_working_folder_off_their_path(tmp_path):
    """What every spawn site relies on (``children.py``), in a second: a child started through it, a plain
    ``python -c`` that child starts, and a multiprocessing fork server it starts (``-c`` and the parent's
    flags) import nothing from the folder, even with an empty ``PYTHONPATH`` entry (which names it)."""
    marker = plant(tmp_path)
    code = ("import multiprocessing as mp, os, subprocess, sys, zmq\n"
            "assert subprocess.run([sys.executable, '-c', 'import zmq']).returncode == 0\n"
            "ctx = mp.get_context('forkserver'); ctx.set_forkserver_preload(['zmq'])\n"
            "p = ctx.Process(target=os.getpid); p.start(); p.join(); assert p.exitcode == 0\n"
            "print(sys.path)")
    env = children.env(users_env(), PYTHONPATH=os.pathsep + str(tmp_path.parent))  # ":/abs": '' first
    proc = subprocess.run(children.python("-c", code), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert importers(marker) == [], importers(marker)
    assert str(tmp_path) not in proc.stdout and str(tmp_path.parent) in proc.stdout, proc.stdout


def _job(tmp_path, graph_npz, *flags: str) -> list[str]:
    """``dorylus train`` in a folder holding the planted module, as a user starts it (the console script puts
    nothing of the folder on the driver's own path, and sets no PYTHONSAFEPATH); who imported the module."""
    work = tmp_path / "work"
    work.mkdir()
    marker = plant(work)
    argv = [sys.executable, "-P", "-m", "dorylus_py", "train", "--data", graph_npz, "--out", work / "run", "--epochs",
            "2", "--quiet", *flags]
    proc = subprocess.run([str(a) for a in argv], cwd=work, env=users_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return importers(marker)


@pytest.mark.long
def test_no_process_of_a_local_job_imports_a_module_from_the_working_folder(tmp_path, graph_npz):
    """The weight server, 2 graph servers, their fork servers and Lambda workers (before the fix: 5 importers)."""
    assert _job(tmp_path, graph_npz, "--backend", "local", "--graph-servers", "2", "--lambdas", "2") == []


@pytest.mark.long
def test_no_worker_of_a_gossip_job_imports_a_module_from_the_working_folder(tmp_path, graph_npz):
    assert _job(tmp_path, graph_npz, "--mode", "gossip", "--workers", "2") == []
