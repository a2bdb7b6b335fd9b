"""The Lambda Runtime API (dorylus_py/lab/runtime_api.py) with AWS's own runtime client, awslambdaric, as the
image runs it: events, the context object, results, errors, timeouts, oversized results and init errors;
and the rehearsal's Lambda service (moto the control plane) answering the Invoke API from such containers."""

from __future__ import annotations

import base64
import json
import os
import sysconfig
from pathlib import Path

import pytest

pytest.importorskip("awslambdaric")

from dorylus_py.lab.runtime_api import Container, Pool, error_of  # noqa: E402

PACKAGES = sysconfig.get_paths()["purelib"]  # this environment's packages, awslambdaric among them
REPO = str(Path(__file__).resolve().parents[2])
FUNCTION = {"FunctionName": "fn", "FunctionArn": "arn:aws:lambda:us-east-1:123456789012:function:fn", "MemorySize": 512,
            "Timeout": 3}
HANDLERS = '''
import os, time
def echo(event, context):
    return {"event": event, "request_id": context.aws_request_id, "arn": context.invoked_function_arn,
            "remaining_ms": context.get_remaining_time_in_millis(), "memory": context.memory_limit_in_mb,
            "name": context.function_name, "pid": os.getpid()}
def boom(event, context):
    raise ValueError(f"no good: {event['x']}")
def slow(event, context):
    time.sleep(event["s"])
    return "late"
def big(event, context):
    return "x" * (7 * 2**20)
'''


@pytest.fixture()
def code(tmp_path):
    (tmp_path / "fn.py").write_text(HANDLERS)
    (tmp_path / "broken.py").write_text("raise ImportError('a dependency the image lacks')\n")
    return tmp_path


def container(code, handler: str) -> Container:
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(code)}
    return Container(env, code, FUNCTION, code / "container.log", handler=handler)


def test_results_and_the_context_object_come_through_awslambdaric(code):
    c = container(code, "fn.echo")
    try:
        first = c.invoke(json.dumps({"a": [1, "two"]}).encode(), 3.0)
        second = c.invoke(b'{"b": null}', 3.0)
    finally:
        c.close()
    assert first.ok and second.ok
    one, two = json.loads(first.body), json.loads(second.body)
    assert one["event"] == {"a": [1, "two"]} and two["event"] == {"b": None}
    assert one["request_id"] == first.request_id != two["request_id"] == second.request_id  # Lambda-Runtime-Aws-Request-Id
    assert one["arn"] == FUNCTION["FunctionArn"] and one["name"] == "fn" and str(one["memory"]) == "512"
    assert 2000 < one["remaining_ms"] <= 3000  # Lambda-Runtime-Deadline-Ms: the timeout, from the hand-over
    assert one["pid"] == two["pid"] == c.proc.pid  # one warm container
    assert c.command[1:] == ["-P", "-m", "awslambdaric", "fn.echo"] and c.env["PYTHONSAFEPATH"] == "1"  # children.py


def test_a_containers_working_folder_is_not_on_its_path(code, tmp_path):
    """The client's Python starts as every Python of the project (children.py): a module in its working
    folder shadows nothing; the handler comes from PYTHONPATH, as the image's ENV PYTHONPATH has it."""
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    (elsewhere / "fn.py").write_text("raise ImportError('the working folder was on the path')\n")
    c = Container({"PATH": os.environ["PATH"], "PYTHONPATH": str(code)}, elsewhere, FUNCTION, code / "container.log",
                  handler="fn.echo")
    try:
        answer = c.invoke(b"{}", 3.0)
    finally:
        c.close()
    assert answer.ok, answer.error


def test_errors_timeouts_oversized_results_and_init_errors_are_lambdas(code):
    c = container(code, "fn.boom")
    try:
        failed = c.invoke(b'{"x": 5}', 3.0)
        assert not failed.ok and error_of(failed) == ("ValueError", "no good: 5")  # the client's error document
        assert "stackTrace" in json.loads(failed.body) and c.alive  # the container lives on
    finally:
        c.close()
    c = container(code, "fn.slow")
    try:
        late = c.invoke(b'{"s": 30}', 1.0)
        assert (late.ok, late.error_type, c.alive) == (False, "Sandbox.Timedout", False)  # killed at its deadline
        assert 900 < late.ms < 10_000
    finally:
        c.close()
    c = container(code, "fn.big")
    try:
        too_big = c.invoke(b"{}", 5.0)
        assert (too_big.ok, too_big.error_type) == (False, "Function.ResponseSizeTooLarge")
    finally:
        c.close()
    c = container(code, "broken.handler")
    try:
        init = c.invoke(b"{}", 5.0)
        assert error_of(init) == ("Runtime.ImportModuleError", "Unable to import module 'broken': a dependency the image lacks")
        assert not c.alive and c.invoke(b"{}", 5.0).error_type == init.error_type  # every invocation: the init error
    finally:
        c.close()


def test_a_pool_keeps_a_container_warm_and_replaces_one_that_died(code):
    pool = Pool(lambda: container(code, "fn.slow"))
    try:
        assert json.loads(pool.invoke(b'{"s": 0}', 3.0).body) == "late"
        assert json.loads(pool.invoke(b'{"s": 0}', 3.0).body) == "late" and len(pool.containers) == 1  # warm
        assert pool.invoke(b'{"s": 30}', 0.5).error_type == "Sandbox.Timedout"
        assert pool.invoke(b'{"s": 0}', 3.0).ok and len(pool.containers) == 2  # a cold start after the kill
    finally:
        pool.close()


def test_the_rehearsals_lambda_service_answers_the_invoke_api_from_containers(moto_aws, code, tmp_path):
    """An Invoke API call through boto3: moto checks and accepts it, a container runs it, and the answer is
    Lambda's (the result; or X-Amz-Function-Error with the client's error document), with a REPORT tail."""
    import boto3

    from dorylus_py.rehearsal.lambda_runtime import LambdaService

    role = boto3.client("iam").create_role(RoleName="r", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    lam = boto3.client("lambda")
    made = {}
    for name in ("echo", "boom"):
        made[name] = lam.create_function(FunctionName=f"fn-{name}", Role=role, PackageType="Image", Timeout=3,
                                         MemorySize=256, Code={"ImageUri": "1.dkr.ecr.us-east-1.amazonaws.com/x:v1"},
                                         Environment={"Variables": {"GREETING": "hi"}})
    answers, roots = {}, {}
    for name in ("echo", "boom"):  # each function's code in a folder of its own, as each image has it
        root = roots[name] = tmp_path / name
        (root / "lambda_functions").mkdir(parents=True)
        (root / "fn.py").write_text((code / "fn.py").read_text())
        (root / "lambda_functions" / "__init__.py").write_text("")
        (root / "lambda_functions" / "handler.py").write_text(
            f"import os\nfrom fn import {name}\n"
            "def handler(event, context):\n"
            f"    out = {name}(event, context)\n"
            "    return out | {'greeting': os.environ['GREETING'], 'path': __import__('sys').path}\n")
        service = LambdaService(moto_aws.url, made[name], [str(root), PACKAGES], {"PATH": os.environ["PATH"]},
                                log=tmp_path / "l.log")
        url = service.start()
        try:
            client = boto3.client("lambda", endpoint_url=url)
            answers[name] = client.invoke(FunctionName=f"fn-{name}", Payload=b'{"x": 7}', LogType="Tail")
            answers[name]["Payload"] = json.loads(answers[name]["Payload"].read())
            assert len(service.containers) == 1 and service.containers[0].command[1:4] == ["-P", "-S", "-m"]
        finally:
            service.stop()
    echo, boom = answers["echo"], answers["boom"]
    assert "FunctionError" not in echo and echo["Payload"]["event"] == {"x": 7} and echo["Payload"]["greeting"] == "hi"
    path = echo["Payload"]["path"]  # PYTHONPATH (the task root first), then the standard library: no .pth entries
    root = str(roots["echo"])
    assert path[:2] == [root, PACKAGES] and REPO not in path and not any("site-packages" in p for p in path[2:])
    assert "Billed Duration: " in base64.b64decode(echo["LogResult"]).decode()
    assert boom["FunctionError"] == "Unhandled"
    assert boom["Payload"]["errorType"] == "ValueError" and boom["Payload"]["errorMessage"] == "no good: 7"
