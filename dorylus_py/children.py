"""How the project starts a Python process: never with the working folder on its ``sys.path``.

``python -m X`` puts the folder it was started in first on the child's path, ``python -c`` puts ``''``
(the same folder) there, and a script puts its own folder: a ``zmq.py`` in the folder where someone ran
``dorylus train`` was imported by the weight server, both graph servers and their Lambda workers' fork
servers, each holding the job key (issue 52). So every Python the project starts gets ``-P``, and
``PYTHONSAFEPATH=1`` in its environment, which the processes it starts in turn inherit (multiprocessing's
fork server and resource tracker start with ``-c``; they also copy the interpreter's flags). An empty or
relative ``PYTHONPATH`` entry names the working folder too (``PYTHONPATH=$PYTHONPATH:/x`` with nothing
before makes one, and ``-P`` keeps it), so those are left out of the child's; absolute ones stay.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

SAFE_PATH_ENV = "PYTHONSAFEPATH"


def python(*args) -> list[str]:
    """The argv of a child Python running ``args`` (``-c CODE``, a script, interpreter flags first)."""
    return [sys.executable, "-P", *map(str, args)]


def module(name: str, *args) -> list[str]:
    """The argv of ``python -m name args...`` as a child of the project."""
    return python("-m", name, *args)


def env(base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """A child Python's environment: ``base`` (default: this process's) updated with ``extra``, with
    the working folder kept off its path and off its own children's."""
    out = dict(os.environ if base is None else base, **extra)
    out[SAFE_PATH_ENV] = "1"
    kept = [p for p in out.pop("PYTHONPATH", "").split(os.pathsep) if os.path.isabs(p)]
    if kept:
        out["PYTHONPATH"] = os.pathsep.join(kept)
    return out
