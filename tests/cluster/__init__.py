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


def assert_gradients_once(summary: dict, sent: int | None = None) -> None:
    """Exactly once, at both ends: no graph server forwarded a gradient key twice (its own count, whatever
    the weight server makes of it) and no weight server was given one twice (it counts the copies it
    drops), and none was refused (a genuine gradient never is: ``weights/guard.py``). ``sent``: how many
    keys were forwarded (epochs x layers x chunks of all servers, sync)."""
    assert summary["gradients_resent"] == 0 and summary["duplicate_gradients"] == 0, summary
    assert summary["refused_gradients"] == 0, summary
    if sent is not None:
        assert summary["gradients_sent"] == sent, summary
