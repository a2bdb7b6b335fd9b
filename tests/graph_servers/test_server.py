"""The graph server carries out every instruction the scheduler can give: each has its ``_on_<name>``,
looked up once at start, so a new instruction without one fails here, not mid-job."""

import dataclasses

from dorylus_py.pipeline import events as ev
from dorylus_py.pipeline.scheduler import Scheduler
from graph_servers.requests import OPS, Requests
from graph_servers.server import INSTRUCTIONS, GraphServer


def test_every_instruction_and_request_op_has_its_handler():
    kinds = {c for c in vars(ev).values() if dataclasses.is_dataclass(c) and c.__module__ == ev.__name__}
    events = {c for c in kinds if hasattr(Scheduler, f"_on_{c.__name__}")}  # what the scheduler handles
    assert events and set(INSTRUCTIONS) == kinds - events  # the rest is what it gives back
    assert all(callable(getattr(GraphServer, f"_on_{c.__name__}", None)) for c in INSTRUCTIONS)
    assert all(callable(getattr(Requests, f"_on_{op}", None)) for op in OPS)
