"""The tensor worker: ``handler(event, context)``, the same code in AWS Lambda and in the local Lambda
emulator. An invocation is a *lease* (``event.py``): the worker serves its graph server's tasks one after
another until it is released, has waited ``idle_ms`` for a task, or its time runs out.

It connects *out* (Lambdas accept no inbound connections) with a DEALER to its graph server and says its
lease id (``lease``, with the static rows it holds); the server then sends it tasks (``task``: the task
and its rows in one message, up to two at a time, so the next task's rows travel while it computes this
one), and it answers each with its ``result`` (``task_runner.py``: the rows, the weights pulled from the
weight servers, the kernels). Nothing answers a result: the server accepts the first result of a task and
only then forwards its gradient to the weight server, so result and gradient take effect together,
exactly once, however often the task was launched; a copy that is not wanted any more is simply refused.
Before it stops, it says so (``leave``), and the server gives the tasks it still held to others.

Every message is signed with the job key, which the worker reads at its cold start from its own
environment (``DORYLUS_KEY``; on AWS the Secrets Manager secret named by ``DORYLUS_KEY_SECRET``, through
the function's role). The event carries no secret. Sockets are cached per process, as a warm Lambda
container keeps them, and so are the static rows it was sent and recent weights. In the local emulator,
``context.bandwidth_mbps`` paces every message both ways (``link.py``): a task is used once the link
would have carried it in, a result leaves once the link would have carried it out.
"""

from __future__ import annotations

import resource
import threading
import time

from dorylus_py.jobkey import load_job_key
from dorylus_py.protocol import Message, ProtocolError, Session
from dorylus_py.protocol.transport import Curve, Plain
from dorylus_py.timescale import scaled_ms
from dorylus_py.worker.channel import Channel
from dorylus_py.worker.event import LeaseEvent
from dorylus_py.worker.task_runner import SAFETY_MARGIN_MS, TaskAborted, TaskRunner, _socket

LEAVE_MARGIN_MS = 1000  # a lease takes no task this close to its Lambda timeout (twice the task's own margin)

_container: dict[str, Session] = {}  # this container's session, made at its cold start
_container_lock = threading.Lock()


def handler(event: dict | LeaseEvent, context=None) -> dict:
    """Serve the lease of ``event`` (a :class:`LeaseEvent`, or its JSON form as a Lambda gets it); what it
    did, and the container's peak memory so far (the least a Lambda running it must have)."""
    t0 = time.perf_counter()
    ev = LeaseEvent.from_dict(event)
    out = Lease(ev, _container_session().for_job(bytes.fromhex(ev.job)), context).run()
    return out | {"seconds": time.perf_counter() - t0,
                  "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def _container_session() -> Session:
    with _container_lock:
        if "session" not in _container:
            _container["session"] = Session(load_job_key())
        return _container["session"]


class Lease:
    def __init__(self, event: LeaseEvent, session: Session, context=None):
        self.event, self.session, self.context = event, session, context
        gate = Curve(event.curve_public_key.encode(), None, *session.curve_client_keys()) if event.curve_public_key \
            else Plain(session.plain_password())
        self.runner = TaskRunner(event, session, gate, context)
        mine = lambda msg: msg.op in ("task", "release") and msg.get("lease") == event.lease  # noqa: E731
        self.channel = Channel(_socket(event.graph_server, gate), event.graph_server, session, context, accept=mine)
        self.said: list[str] | None = None  # the static rows' tokens the server last heard we hold

    def run(self) -> dict:
        """Serve tasks until released, idle or out of time; what the lease did."""
        self._send(Message("lease", {"lease": self.event.lease} | self._have()), wait=False)
        tasks = 0
        try:
            while True:
                if self._remaining_ms() < scaled_ms(LEAVE_MARGIN_MS):
                    return self._leave("deadline", tasks)
                msg = self._next(min(self.event.idle_ms, self._remaining_ms() - scaled_ms(LEAVE_MARGIN_MS)))
                if msg is None:
                    return self._leave("idle", tasks)
                if msg.op == "release":
                    return {"status": "released", "tasks": tasks}
                tasks += 1
                self._run(msg)
        finally:
            self.runner.forget()

    def _run(self, task: Message) -> None:
        """Run one task message and send its result; a task that cannot run is reported failed (the server
        relaunches it), unless the lease's own time ran out (then the invocation fails)."""
        if self.context is not None and hasattr(self.context, "task_started"):
            self.context.task_started()  # the emulator's injected failures (--lambda-fail-rate)
        try:
            result = self.runner.run(task)
        except (TaskAborted, ProtocolError) as e:
            if self._remaining_ms() < scaled_ms(SAFETY_MARGIN_MS):
                raise
            failed = {"task": task.get("task"), "failed": str(e)[:300]}
            self._send(Message("result", {"lease": self.event.lease} | failed), wait=True)
            return
        if result is None:  # a part whose rows give nothing back: its sums go with the last part
            return
        result.fields["lease"] = self.event.lease
        result.fields |= self._have()
        self._send(result, wait="part" not in result.fields or result.get("last") is True)

    def _have(self) -> dict:
        """The static rows' tokens we hold, when they changed since the server last heard them."""
        held = self.runner.held()
        if held == self.said:
            return {}
        self.said = held
        return {"have": held}

    def _leave(self, why: str, tasks: int) -> dict:
        """Say so and wait (bounded) for the server's ``release``: once it came, the server has read all
        this lease sent, and ending the invocation can overtake none of it (the platform's completion
        travels apart from the socket)."""
        self._send(Message("leave", {"lease": self.event.lease, "reason": why}), wait=False)
        wait = min(scaled_ms(LEAVE_MARGIN_MS), self._remaining_ms() - scaled_ms(SAFETY_MARGIN_MS))
        while (msg := self._next(wait)) is not None and msg.op != "release":
            pass  # a task sent before the server read the leave: it goes back to its queue there
        return {"status": why, "tasks": tasks}

    # --- the link to the graph server ----------------------------------------------------------------

    def _send(self, msg: Message, wait: bool) -> None:
        """Send ``msg`` to the graph server; on a capped link once the link would have carried it out
        (``wait``), or at once with its bytes still counted before the next message's."""
        self.channel.send(msg, wait=wait, answered=False)

    def _next(self, timeout_ms: float) -> Message | None:
        """The next task or release for this lease, once the link has carried it in; None after
        ``timeout_ms`` without one (what is not for this lease, a task sent to an earlier lease of this
        warm container, is skipped)."""
        return self.channel.next(time.monotonic() + max(0.0, timeout_ms) / 1000)

    def _remaining_ms(self) -> float:
        return self.context.get_remaining_time_in_millis() if self.context is not None else float("inf")
