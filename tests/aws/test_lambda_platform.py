"""The AWS Lambda platform: back-off on throttling and 5xx against a real HTTP endpoint that answers
like Lambda's Invoke API, and a whole training job through it against moto."""

from __future__ import annotations

import base64
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

pytest.importorskip("aiobotocore")

from dorylus_py.platforms.aws import AwsLambdaPlatform, backoff_s, billed_from_log  # noqa: E402
from tests.worker import event_for  # noqa: E402

REPORT = base64.b64encode(b"START\nREPORT RequestId: x Duration: 41.20 ms Billed Duration: 42 ms Memory Size: 3008 MB\n").decode()


class FakeLambdaApi(BaseHTTPRequestHandler):
    """Answers Invoke like Lambda does: scripted statuses first, then success with a log tail."""

    script: list = []
    bodies: list = []

    def do_POST(self):  # noqa: N802
        self.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        status, code = self.script.pop(0) if self.script else (200, None)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if code:
            self.send_header("x-amzn-ErrorType", code)
            body = json.dumps({"Type": "User", "message": f"{code} for the test"}).encode()
        else:
            self.send_header("X-Amz-Log-Result", REPORT)
            self.send_header("X-Amz-Executed-Version", "$LATEST")
            if status == 299:  # marker: a function error
                self.send_header("X-Amz-Function-Error", "Unhandled")
            body = b'{"errorMessage": "boom"}' if status == 299 else b"null"
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture()
def api(monkeypatch):
    for k, v in {"AWS_ACCESS_KEY_ID": "t", "AWS_SECRET_ACCESS_KEY": "t"}.items():
        monkeypatch.setenv(k, v)
    FakeLambdaApi.script, FakeLambdaApi.bodies = [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeLambdaApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _one(api, script, **kw):
    FakeLambdaApi.script = list(script)
    platform = AwsLambdaPlatform("dorylus", 4, 3008, region="us-east-1", endpoint_url=api, base_delay_s=0.01,
                                 max_delay_s=0.05, **kw)
    try:
        event = event_for("tcp://127.0.0.1:1")
        platform.invoke(event)
        deadline = time.monotonic() + 30
        while not (done := platform.completions()):
            assert time.monotonic() < deadline, "no completion"
            time.sleep(0.01)
        assert FakeLambdaApi.bodies[-1] == event.to_dict()  # exactly the event, as JSON
        return done[0], platform.stats
    finally:
        platform.close()


def test_throttling_and_5xx_are_retried_with_backoff(api):
    c, stats = _one(api, [(429, "TooManyRequestsException"), (500, "ServiceException"), (429, "TooManyRequestsException")])
    assert c.ok and c.billed_ms == 42 and c.where == "aws-lambda" and c.memory_mb == 3008
    assert stats == {"invocations": 4, "throttled": 2, "retries": 3}


def test_gives_up_after_max_attempts(api):
    c, stats = _one(api, [(500, "ServiceException")] * 3, max_attempts=3)
    assert not c.ok and "gave up after 3 attempts" in c.error and stats["invocations"] == 3


def test_throttling_is_waited_out_until_the_functions_timeout(api):
    """A throttled call never started: it is retried however often (not counted as a failed attempt),
    until the function's own timeout has passed."""
    c, stats = _one(api, [(429, "TooManyRequestsException")] * 5, max_attempts=2)
    assert c.ok and stats["throttled"] == 5 and stats["invocations"] == 6
    c, stats = _one(api, [(429, "TooManyRequestsException")] * 10_000, timeout_s=0.5)
    assert not c.ok and re.search(r"throttled for \d+ s", c.error) and stats["throttled"] == stats["invocations"] > 1


def test_final_errors_are_not_retried(api):
    c, stats = _one(api, [(404, "ResourceNotFoundException")])
    assert not c.ok and "ResourceNotFoundException" in c.error and stats["invocations"] == 1


def test_function_error_is_a_failed_task(api):
    c, _ = _one(api, [(299, None)])
    assert not c.ok and c.error.startswith("Unhandled") and c.billed_ms == 42


def test_backoff_is_jittered_and_capped():
    import random

    rng = random.Random(0)
    waits = [backoff_s(a, 0.1, 1.0, rng) for a in range(10) for _ in range(50)]
    assert max(waits) <= 1.0 and min(waits) >= 0.0 and len(set(waits)) > 400
    assert billed_from_log(REPORT) == 42 and billed_from_log(None) is None


def test_training_through_the_aws_platform_against_moto(moto_url, tmp_path, small_graph, monkeypatch):
    """Leases of tensor workers are invoked on moto (recorded, payloads checked) and run here, their tasks
    streamed in parts of 64 rows (150-row chunks); same maths as local whole chunks."""
    import os

    import boto3
    import requests

    from dorylus_py.cli import main
    from dorylus_py.data import write_npz

    role = boto3.client("iam").create_role(RoleName="dorylus-lambda", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    boto3.client("lambda").create_function(
        FunctionName="dorylus-tensor", Role=role, PackageType="Image", MemorySize=3008, Timeout=60,
        Code={"ImageUri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/dorylus-lambda:latest"})
    data = tmp_path / "g.npz"
    write_npz(small_graph, data)
    monkeypatch.setenv("DORYLUS_KEY", "5e" * 32)  # a key this test knows, to look for it in every payload
    common = ["--data", str(data), "--graph-servers", "2", "--chunks", "2", "--epochs", "3", "--dropout", "0", "--quiet",
              "--lambdas", "2"]
    requests.post(f"{moto_url}/moto-api/recorder/reset-recording", timeout=10)
    requests.post(f"{moto_url}/moto-api/recorder/start-recording", timeout=10)
    assert main(["train", "--backend", "lambda", "--lambda-function", "dorylus-tensor", "--lambda-run-here",
                 "--stream-rows", "64", "--out", str(tmp_path / "aws"), *common]) == 0
    requests.post(f"{moto_url}/moto-api/recorder/stop-recording", timeout=10)
    assert main(["train", "--backend", "local", "--out", str(tmp_path / "local"), *common]) == 0

    recording = requests.get(f"{moto_url}/moto-api/recorder/download-recording", timeout=10).text
    calls = [json.loads(x) for x in recording.splitlines() if x.strip()]
    invokes = [json.loads(base64.b64decode(c["body"])) for c in calls
               if c["url"].endswith("/functions/dorylus-tensor/invocations")]
    tasks = [json.loads(x) for x in (tmp_path / "aws" / "tasks.jsonl").read_text().splitlines()]
    leases = [json.loads(x) for x in (tmp_path / "aws" / "leases.jsonl").read_text().splitlines()]  # billed each
    assert len(invokes) == len(leases) > 0 and {e["lease"] for e in invokes} == {t["id"] for t in leases}
    ran = [t for t in tasks if "lease" in t]  # the tasks, each run in one of them
    assert ran and {t["lease"] for t in ran} <= {e["lease"] for e in invokes} and all(t["where"] == "aws-lambda" for t in ran)
    assert all(e["graph_server"].startswith("tcp://") and "token" not in e for e in invokes)
    ends = [json.loads(line.split(" end ", 1)[1]) for f in (tmp_path / "aws" / "logs").glob("graph-server-*.log")
            for line in f.read_text().splitlines() if " end {" in line]
    assert sum(e["result_blocks"] for e in ends) > 0  # streamed: parts of 64 rows
    assert os.environ["DORYLUS_KEY"] not in recording  # the job key is in no Lambda payload
    loss = {name: [json.loads(x)["loss"] for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
            for name in ("aws", "local")}
    np.testing.assert_allclose(loss["aws"], loss["local"], rtol=1e-5)


@pytest.mark.long
def test_runs_are_billed_at_the_deployed_memory(moto_url, tmp_path, small_graph, capsys):
    """The function is deployed with 1024 MB: the run reads that from the Lambda API, records it in
    config.json and tasks.jsonl, and reports price it; a --lambda-memory-mb that disagrees is refused."""
    import boto3

    from dorylus_py.cli import main
    from dorylus_py.cost import Prices, read_record, run_cost
    from dorylus_py.data import write_npz
    from dorylus_py.errors import ConfigError
    from dorylus_py.platforms.aws import deployed_memory_mb

    role = boto3.client("iam").create_role(RoleName="dorylus-lambda", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    boto3.client("lambda").create_function(
        FunctionName="dorylus-small", Role=role, PackageType="Image", MemorySize=1024, Timeout=60,
        Code={"ImageUri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/dorylus-lambda:latest"})
    assert deployed_memory_mb("dorylus-small") == 1024
    with pytest.raises(ConfigError, match="cannot read the configuration of Lambda function nope"):
        deployed_memory_mb("nope")
    write_npz(small_graph, tmp_path / "g.npz")
    train = ["train", "--backend", "lambda", "--lambda-function", "dorylus-small", "--lambda-run-here", "--data",
             str(tmp_path / "g.npz"), "-k", "1", "--chunks", "2", "--lambdas", "2", "--epochs", "2", "--quiet"]
    assert main([*train, "--lambda-memory-mb", "3008", "--out", str(tmp_path / "bad")]) == 2
    assert "--lambda-memory-mb 3008 disagrees with dorylus-small, deployed with 1024 MB" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
    assert main([*train, "--out", str(tmp_path / "run")]) == 0
    config, metrics, tasks, summary = read_record(tmp_path / "run")
    lam = [t for t in tasks if t["where"] == "aws-lambda"]
    assert config["lambda_memory_mb"] == 1024 and lam and {t["memory_mb"] for t in lam} == {1024}
    cost = run_cost(config, summary["wall_s"], tasks, Prices.load(), "c5.2xlarge")
    assert cost.lambda_gb_seconds == pytest.approx(sum(t["billed_ms"] for t in lam) / 1000 * 1024 / 1024)
