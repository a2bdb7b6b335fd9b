"""The ``cpu``/``gpu`` backends' in-process pool: a stop is not held up by a task waiting on a gone peer."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from tests.cluster.test_cluster_file import free_ports

SCRIPT = textwrap.dedent("""
    import sys, time
    from dorylus_py.platforms import InprocPlatform
    from dorylus_py.protocol import Session
    from dorylus_py.serving.process import exit_process
    from tests.worker import event_for

    platform = InprocPlatform(threads=2, session=Session(b"k" * 32))
    for _ in range(3):  # two start and wait for a reply that never comes; one is queued
        platform.invoke(event_for(sys.argv[1]))
    time.sleep(1.0)
    assert platform.completions() == [], "a task ended without a reply"
    t0 = time.monotonic()
    platform.close()
    print(f"closed in {time.monotonic() - t0:.3f} s", flush=True)
    exit_process(0)  # as a graph server ends: finalizing under threads blocked in C++ may abort (SIGABRT)
""")


def test_a_closed_pool_lets_the_process_exit_while_its_tasks_wait_for_replies():
    (port,) = free_ports(1)  # nothing listens there: the handler waits its whole request timeout (30 s)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", SCRIPT, f"tcp://127.0.0.1:{port}"], capture_output=True, text=True,
                          timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 0 and "closed" in proc.stdout, proc.stderr
    assert float(proc.stdout.split()[2]) < 1.0, proc.stdout  # close() does not wait for the waiting tasks
    assert took < 15, f"the process took {took:.1f} s to exit after closing its pool"
