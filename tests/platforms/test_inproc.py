"""The ``cpu``/``gpu`` backends' in-process pool: a stop is not held up by a task waiting on a gone peer."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from tests.cluster.test_cluster_file import free_ports
from tests.test_memory import REPO

SCRIPT = textwrap.dedent("""
    import sys, time
    import zmq
    from dorylus_py.platforms import InprocPlatform
    from dorylus_py.protocol import Message, Session
    from dorylus_py.protocol.transport import Plain
    from dorylus_py.serving.process import exit_process
    from dorylus_py.worker.task_runner import TaskRunner
    from graph_servers.direct import DirectWorkers
    from tests.graph_servers import TASK
    from tests.worker import event_for

    key = b"k" * 32
    event = event_for("tcp://gs", weight_servers=(sys.argv[1],))
    poller = zmq.Poller()
    direct = DirectWorkers(zmq.Context.instance(), poller, 2, lambda: TaskRunner(event, Session(key), Plain.of_job(key)))
    platform = InprocPlatform(direct)
    for chunk in range(3):  # two start and wait for weights that never come; one is queued
        direct.send(Message("task", {"task": dict(TASK, chunk=chunk), "ws": [0], "id_start": 0, "edge_start": 0,
                                     "ghost_edge_start": 0}))
    time.sleep(1.0)
    assert not poller.poll(0), "a task ended without a reply"
    t0 = time.monotonic()
    platform.close()
    print(f"closed in {time.monotonic() - t0:.3f} s", flush=True)
    exit_process(0)  # as a graph server ends: finalizing under threads blocked in C++ may abort (SIGABRT)
""")


def test_a_closed_pool_lets_the_process_exit_while_its_tasks_wait_for_replies():
    (port,) = free_ports(1)  # nothing listens there: the handler waits its whole request timeout (30 s)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", SCRIPT, f"tcp://127.0.0.1:{port}"], capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    took = time.monotonic() - t0
    assert proc.returncode == 0 and "closed" in proc.stdout, proc.stderr
    assert float(proc.stdout.split()[2]) < 1.0, proc.stdout  # close() does not wait for the waiting tasks
    assert took < 15, f"the process took {took:.1f} s to exit after closing its pool"
