"""What handing a task off costs its graph server, counted: a task and its rows go out in one message,
its result comes back in one (a streamed task: one of each per part), and a lease's own messages
(its hello, its leave, a release) are a few per invocation, not per task. The old path, an invocation
per task with a pull and its reply, a push and its acknowledgement, cost about 7 messages a task (issue
53); this fails if it returns."""

import json
from collections import Counter

import pytest

from tests.cluster.test_fused import run

WORKER_OPS = ("out:task", "in:result", "in:lease", "in:leave", "out:release")  # what a server and its leases say


def end_lines(tmp_path, name) -> list[dict]:
    return [json.loads(line.split(" end ", 1)[1]) for p in sorted((tmp_path / name / "logs").glob("graph-server-*"))
            for line in p.read_text().splitlines() if " end {" in line]


@pytest.mark.parametrize("stream_rows", [0, 40], ids=["whole", "streamed"])
def test_a_task_costs_its_server_two_messages(small_graph, tmp_path, stream_rows):
    run(small_graph, tmp_path, "run", backend="local", stream_rows=stream_rows)  # 2 servers, 3 chunks, 3 Lambdas
    tasks = [json.loads(line) for line in (tmp_path / "run" / "tasks.jsonl").read_text().splitlines()]
    leases = [json.loads(line) for line in (tmp_path / "run" / "leases.jsonl").read_text().splitlines()]
    for k, end in enumerate(end_lines(tmp_path, "run")):
        ops = Counter(end["messages"])
        copies = [t for t in tasks if t["server"] == k and "lease" in t]  # every copy sent, ended well or not
        ran = [t for t in leases if t["server"] == k]
        parts = -(-100 // stream_rows) if stream_rows else 1  # a chunk of 100 rows in parts of 40: 3
        assert copies and ran and set(ops) >= {"out:task", "in:result"}
        assert ops["out:task"] <= parts * len(copies) and ops["in:result"] <= parts * len(copies)
        assert ops["out:task"] >= len([t for t in copies if t["ok"]])  # each ran copy was sent, at least once
        per_task = sum(ops[op] for op in WORKER_OPS) / len(copies)
        assert per_task <= 2 * parts + 3 * len(ran) / len(copies), (per_task, ops)
        assert not {"in:pull_rows", "in:push_result", "in:push_block", "out:rows"} & set(ops)  # no old path
