"""The Lambda image's contents, proven without building it: the packages lambda_functions/Dockerfile
installs (its pins, with pip install --target) and the build context `dorylus aws build-context` writes
are all the handler needs. A training job's tensor tasks go through the Invoke API to containers run as
the image runs them (AWS's runtime client, ``python -P -S -m awslambdaric lambda_functions.handler.handler``)
that see those two folders and the standard library only, with the function's environment and its
role's credentials, through which they read the job key, IAM enforced."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

pytest.importorskip("hcl2")
from dorylus_py.cli import main  # noqa: E402
from dorylus_py.data import write_npz  # noqa: E402
from dorylus_py.rehearsal.image_platform import read  # noqa: E402
from dorylus_py.rehearsal.lambda_runtime import LambdaService  # noqa: E402
from tests.aws.terraform import render, statements  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("DORYLUS_TEST_CACHE", Path.home() / ".cache" / "dorylus-tests"))
KEY = "7a" * 32


def dockerfile_pins() -> list[str]:
    """``name==version`` of every ``pip install`` in the Dockerfile; torch from its CPU index is ``+cpu``."""
    installs = read((REPO / "lambda_functions" / "Dockerfile").read_text()).installs
    return [p + "+cpu" if p.startswith("torch==") and "download.pytorch.org/whl/cpu" in i.index_url else p
            for i in installs for p in i.pins]


def image_packages(pins: list[str]) -> Path:
    """The pins installed with ``pip install --target``, once per set of pins (kept in $DORYLUS_TEST_CACHE,
    default ~/.cache/dorylus-tests: torch alone is 200 MB to unpack)."""
    folder = CACHE / f"lambda-image-{hashlib.sha256(' '.join(sorted(pins)).encode()).hexdigest()[:16]}"
    if (folder / ".complete").exists():
        return folder
    part = folder.with_name(f"{folder.name}.{os.getpid()}.part")
    shutil.rmtree(part, ignore_errors=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                           "--only-binary=:all:", "--target", str(part), *pins], capture_output=True, text=True,
                          timeout=1200, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (part / ".complete").write_text(" ".join(pins) + "\n")
    try:
        part.rename(folder)
    except OSError:  # another worker finished first
        shutil.rmtree(part, ignore_errors=True)
    return folder


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.mark.timeout(1200)  # pip installs torch into a folder
@pytest.mark.long
def test_the_images_packages_and_context_run_a_jobs_tasks_alone(moto_aws, small_graph, tmp_path, monkeypatch):
    pins = dockerfile_pins()
    assert {p.split("==")[0] for p in pins} >= {"torch", "numpy", "pyzmq", "cryptography", "boto3"}
    image = image_packages(pins)
    context = tmp_path / "context"
    assert main(["aws", "build-context", str(context)]) == 0

    # the control plane as infra/ makes it: the secret, the function's role and policy, the function
    kms = boto3.client("kms").create_key()["KeyMetadata"]["Arn"]
    secret = boto3.client("secretsmanager").create_secret(Name="dorylus-job-key-t", KmsKeyId=kms, SecretString=KEY)["ARN"]
    iam = boto3.client("iam")
    trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                     "Principal": {"Service": "lambda.amazonaws.com"}}]}
    role = iam.create_role(RoleName="dorylus-lambda", AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"]
    iam.put_role_policy(RoleName="dorylus-lambda", PolicyName="dorylus-lambda", PolicyDocument=render(
        statements()["lambda"], {"${aws_secretsmanager_secret.job_key.arn}": secret}))
    function = boto3.client("lambda").create_function(
        FunctionName="dorylus-tensor", Role=role, PackageType="Image", MemorySize=3008, Timeout=60,
        Code={"ImageUri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/dorylus-lambda:v1"},
        Environment={"Variables": {"DORYLUS_KEY_SECRET": secret}})
    iam.create_user(UserName="server")
    iam.put_user_policy(UserName="server", PolicyName="server", PolicyDocument=render(statements()["server"]))
    server = iam.create_access_key(UserName="server")["AccessKey"]
    as_lambda = boto3.client("sts").assume_role(RoleArn=role, RoleSessionName="container")["Credentials"]  # Lambda's

    moto_aws.enforce(True)
    runtime_env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "AWS_ENDPOINT_URL": moto_aws.url,
                   "AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": as_lambda["AccessKeyId"],
                   "AWS_SECRET_ACCESS_KEY": as_lambda["SecretAccessKey"], "AWS_SESSION_TOKEN": as_lambda["SessionToken"]}
    service = LambdaService(moto_aws.url, function, [str(context), str(image)], runtime_env, log=tmp_path / "lambda.log")
    url = service.start()

    write_npz(small_graph, tmp_path / "g.npz")
    assert main(["prepare", str(tmp_path / "g.npz"), "-k", "2", "--out", str(tmp_path / "parts")]) == 0
    d, g0, g1, w0 = free_ports(4)
    cluster = {"driver": f"tcp://127.0.0.1:{d}", "graph_servers": [f"tcp://127.0.0.1:{g0}", f"tcp://127.0.0.1:{g1}"],
               "weight_servers": [f"tcp://127.0.0.1:{w0}"], "lambda_function": "dorylus-tensor", "region": "us-east-1"}
    (tmp_path / "cluster.json").write_text(json.dumps(cluster))
    for k, v in {"DORYLUS_KEY": KEY, "AWS_ACCESS_KEY_ID": server["AccessKeyId"],
                 "AWS_SECRET_ACCESS_KEY": server["SecretAccessKey"], "PYTHONPATH": str(REPO)}.items():
        monkeypatch.setenv(k, v)
    servers = [subprocess.Popen([sys.executable, "-m", "dorylus_py", role_, "--cluster", str(tmp_path / "cluster.json"),
                                 "--rank", str(rank), "--jobs", "1"], stderr=subprocess.PIPE, text=True)
               for role_, rank in [("graph-server", 0), ("graph-server", 1), ("weight-server", 0)]]
    try:
        code = main(["train", "--backend", "lambda", "--cluster", str(tmp_path / "cluster.json"), "--data",
                     str(tmp_path / "parts"), "--lambda-endpoint", url, "--lambdas", "2", "--epochs", "2",
                     "--dropout", "0", "--quiet", "--out", str(tmp_path / "run")])
        assert code == 0
        for p in servers:
            assert p.wait(timeout=60) == 0, p.stderr.read()[-2000:]
        for container in service.containers:  # as the image runs it, seeing the two folders and the standard library
            assert container.command[1:] == ["-P", "-S", "-m", "awslambdaric", "lambda_functions.handler.handler"]
            assert container.env["PYTHONPATH"] == os.pathsep.join([str(context), str(image)])
            libs = {line.split()[-1] for line in Path(f"/proc/{container.proc.pid}/maps").read_text().splitlines()
                    if ".so" in line.split()[-1]}
            assert not [f for f in libs if f.startswith((sys.prefix, str(REPO)))], libs  # none of this environment's
            assert any(f.startswith(str(image / "torch")) for f in libs)
    finally:
        for p in servers:
            p.kill()
        service.stop()

    tasks = [json.loads(x) for x in (tmp_path / "run" / "tasks.jsonl").read_text().splitlines()]
    leases = [json.loads(x) for x in (tmp_path / "run" / "leases.jsonl").read_text().splitlines()]
    done = [t for t in tasks if t["where"] == "aws-lambda" and t["ok"]]  # each run in one of the leases invoked
    assert done and len(service.invocations) >= len(leases) > 0 and all(i["ok"] for i in service.invocations)
    assert {t["lease"] for t in done} <= {t["id"] for t in leases}
    reads = [c for c in moto_aws.calls if c.action == "secretsmanager:GetSecretValue"]
    assert reads and all(":assumed-role/dorylus-lambda/" in c.principal and c.allowed for c in reads)
    assert len(reads) == len(service.containers)  # once per cold start
