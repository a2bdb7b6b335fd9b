"""The Lambda service: AWS's own client (botocore's signer, aiobotocore's calls through
``platforms/aws.py``) against it, throttling at its concurrency, and refusals of unsigned or wrongly
signed requests."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import pytest

pytest.importorskip("aiobotocore")

from botocore.auth import SigV4Auth  # noqa: E402
from botocore.awsrequest import AWSRequest  # noqa: E402
from botocore.credentials import Credentials as BotoCredentials  # noqa: E402

from dorylus_py.errors import ConfigError  # noqa: E402
from dorylus_py.lab.lambda_service import Function, LambdaService  # noqa: E402
from dorylus_py.lab.sigv4 import Credentials, SignatureError, verify  # noqa: E402
from dorylus_py.platforms.aws import AwsLambdaPlatform, deployed_memory_mb  # noqa: E402
from tests.worker import event_for  # noqa: E402

CREDS = Credentials("AKIDLAB0000000000000", "lab-secret-" + "s" * 29, "us-east-1")


def signed(url: str, body: bytes, creds: Credentials = CREDS, method: str = "POST") -> AWSRequest:
    request = AWSRequest(method=method, url=url, data=body, headers={"X-Amz-Invocation-Type": "RequestResponse"})
    SigV4Auth(BotoCredentials(creds.access_key_id, creds.secret_access_key), "lambda", creds.region).add_auth(request)
    return request


def check(request: AWSRequest, body: bytes, now: float | None = None) -> None:
    path, _, query = request.url.split("//", 1)[1].partition("/")[2].partition("?")
    headers: dict[str, list[str]] = {}
    for name, value in request.headers.items():
        headers.setdefault(name.lower(), []).append(value)
    headers["host"] = [request.url.split("//", 1)[1].split("/")[0]]  # what an HTTP client sends
    verify(CREDS, request.method, "/" + path, query, headers, body, now)


def test_a_botocore_signature_verifies_and_any_change_breaks_it():
    url = "http://198.51.100.13:9000/2015-03-31/functions/arn%3Aaws%3Alambda%3Aus-east-1%3A1%3Afunction%3Adorylus/invocations?Qualifier=%24LATEST"
    body = b'{"task": {"kind": "fwd"}}'
    check(signed(url, body), body)
    with pytest.raises(SignatureError, match="does not match"):
        check(signed(url, body), body.replace(b"fwd", b"bwd"))
    with pytest.raises(SignatureError, match="does not match"):
        check(signed(url, body, Credentials(CREDS.access_key_id, "another secret", "us-east-1")), body)
    with pytest.raises(SignatureError, match="token included in the request is invalid") as e:
        check(signed(url, body, Credentials("AKIDSOMEONEELSE00000", CREDS.secret_access_key, "us-east-1")), body)
    assert e.value.code == "UnrecognizedClientException"
    with pytest.raises(SignatureError, match="expected us-east-1/lambda"):
        check(signed(url, body, Credentials(CREDS.access_key_id, CREDS.secret_access_key, "eu-west-1")), body)
    with pytest.raises(SignatureError, match="expired"):
        check(signed(url, body), body, now=time.time() + 3600)  # a request replayed an hour later
    unsigned = signed(url, body)
    del unsigned.headers["Authorization"]
    with pytest.raises(SignatureError, match="missing or malformed"):
        check(unsigned, body)


def _as_the_service(monkeypatch) -> None:
    """This process's AWS environment: the service's credentials, nothing from the user's files."""
    for k, v in {"AWS_ACCESS_KEY_ID": CREDS.access_key_id, "AWS_SECRET_ACCESS_KEY": CREDS.secret_access_key,
                 "AWS_DEFAULT_REGION": CREDS.region, "AWS_CONFIG_FILE": "/dev/null",
                 "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"}.items():
        monkeypatch.setenv(k, v)


def _invoke_unreachable(address: str, n: int, timeout_s: float) -> tuple[list, dict]:
    """``n`` invocations at once, through the platform's own calls, of events naming no graph server the
    handler can reach: their completions and the platform's counts."""
    platform = AwsLambdaPlatform("dorylus", n, 1769, region="us-east-1", endpoint_url=address,
                                 base_delay_s=0.2, max_delay_s=1.0, max_attempts=20)
    try:
        for i in range(n):
            platform.invoke(event_for("not an address", lease=f"l{i}"))
        done, deadline = [], time.monotonic() + timeout_s
        while len(done) < n:
            assert time.monotonic() < deadline, f"{len(done)} of {n} completions"
            done += platform.wait_completions(1.0)
        return done, dict(platform.stats)
    finally:
        platform.close()


@pytest.fixture()
def service(monkeypatch):
    """A service of one worker whose invocations take half a second each (``--latency-ms``)."""
    _as_the_service(monkeypatch)
    svc = LambdaService(Function(memory_mb=1769, timeout_s=20, concurrency=1, latency_ms=500), CREDS, b"k" * 32,
                        ("127.0.0.1", 0))
    threading.Thread(target=svc.serve_forever, daemon=True).start()
    yield svc
    svc.close()


def test_invocations_through_aiobotocore_are_run_throttled_and_reported(service):
    """Three invocations at once on a one-worker service: two are throttled (429) at first, and the
    platform's back-off brings each through; each runs the real handler, whose error (the event names
    names no graph server it can reach) comes back as a function error with its billed duration."""
    assert deployed_memory_mb("dorylus", "us-east-1", endpoint_url=service.address) == 1769
    done, stats = _invoke_unreachable(service.address, 3, 60)
    assert sorted(c.task["lease"] for c in done) == ["l0", "l1", "l2"]
    assert all(not c.ok and "Unhandled: " in c.error and "ZMQError" in c.error for c in done)
    assert all(c.billed_ms >= 1 and c.memory_mb == 1769 for c in done)
    assert stats["throttled"] >= 2 and service.stats["throttled"] == stats["throttled"]
    assert service.stats["invocations"] == 3 and service.stats["function_errors"] == 3


def test_requests_without_the_services_credentials_are_refused(service, monkeypatch):
    url = f"{service.address}/2015-03-31/functions/dorylus/invocations"
    body = json.dumps({"task": {"kind": "fwd"}}).encode()
    forged = signed(url, body, Credentials(CREDS.access_key_id, "a guessed secret", CREDS.region))
    for headers in ({}, dict(forged.headers.items())):
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(request, timeout=30)
        assert e.value.code == 403
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "a guessed secret")
    with pytest.raises(ConfigError, match="InvalidSignatureException"):
        deployed_memory_mb("dorylus", "us-east-1", endpoint_url=service.address)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", CREDS.secret_access_key)
    with pytest.raises(ConfigError, match="Function not found"):
        deployed_memory_mb("another", "us-east-1", endpoint_url=service.address)
    assert service.stats["refused"] == 3 and service.stats["invocations"] == 0


def test_runtime_awslambdaric_runs_the_handler_as_the_image_does(monkeypatch):
    """``--runtime awslambdaric``: the same invocations, run by AWS's runtime client in a warm container
    (the image's ENTRYPOINT and CMD) against the Lambda Runtime API: the handler's error comes back through
    the client's error document as a function error, with its billed duration."""
    pytest.importorskip("awslambdaric")
    _as_the_service(monkeypatch)
    svc = LambdaService(Function(memory_mb=1769, timeout_s=60, concurrency=1), CREDS, b"k" * 32, ("127.0.0.1", 0),
                        runtime="awslambdaric")
    threading.Thread(target=svc.serve_forever, daemon=True).start()
    try:
        done, _ = _invoke_unreachable(svc.address, 2, 120)
        assert all(not c.ok and "ZMQError" in c.error and c.billed_ms >= 1 for c in done), [c.error for c in done]
        assert len(svc.containers.containers) == 1  # one warm container ran both
        assert svc.containers.containers[0].command[1:] == ["-P", "-m", "awslambdaric", "lambda_functions.handler.handler"]
        assert svc.stats["function_errors"] == 2
    finally:
        svc.close()


def test_runtime_awslambdaric_refuses_the_emulators_knobs(capsys, monkeypatch):
    from dorylus_py.lab.lambda_service import main

    _as_the_service(monkeypatch)
    assert main(["--listen", "127.0.0.1:9", "--runtime", "awslambdaric", "--fail-rate", "0.1"]) == 2
    assert "not with --runtime awslambdaric" in capsys.readouterr().err
