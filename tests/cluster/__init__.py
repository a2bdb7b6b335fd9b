"""Cluster tests: the whole system's processes on this machine."""

import psutil


def running_children() -> list[psutil.Process]:
    """This process's descendants still running. A zombie (dead, not yet reaped by its parent: with
    pytest-xdist, a process another test in this worker started) holds nothing and is not counted."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out
