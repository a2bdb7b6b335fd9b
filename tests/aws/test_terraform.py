"""infra/: parsed with python-hcl2 and checked for wiring and least privilege; `terraform fmt -check`
and checkov (offline) when their binaries are here. Policies are also created in moto's IAM."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

hcl2 = pytest.importorskip("hcl2")

INFRA = Path(__file__).resolve().parents[2] / "infra"


def _clean(x):
    """python-hcl2 keeps HCL's quotes and adds markers; strip both."""
    if isinstance(x, dict):
        return {_clean(k): _clean(v) for k, v in x.items() if k not in ("__is_block__", "__comments__")}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    if isinstance(x, str) and len(x) >= 2 and x[0] == x[-1] == '"':
        return x[1:-1]
    return x


def _one(x):
    """A nested block parses as a list of one."""
    return x[0] if isinstance(x, list) and len(x) == 1 else x


def _blocks(kind: str) -> dict[tuple, dict]:
    """(type, name) -> body for every ``resource``/``data`` block; (name,) for variables and outputs."""
    out = {}
    for tf in sorted(INFRA.glob("*.tf")):
        parsed = _clean(hcl2.load(open(tf)))
        for entry in parsed.get(kind, []):
            for type_or_name, body in entry.items():
                if kind in ("variable", "output"):
                    out[(type_or_name,)] = body
                else:
                    for name, inner in body.items():
                        out[(type_or_name, name)] = inner
    return out


def _text() -> str:
    return "\n".join(p.read_text() for p in sorted(INFRA.rglob("*")) if p.suffix in (".tf", ".tftpl"))


def test_every_variable_is_used_and_documented():
    variables = _blocks("variable")
    assert variables, "no variables parsed"
    text = _text()
    for (name,), body in variables.items():
        assert re.search(rf"var\.{name}\b", text), f"variable {name} is never used"
        assert body.get("description"), f"variable {name} has no description"


def test_no_ingress_from_the_whole_internet_and_ports_match_the_cluster():
    resources = _blocks("resource")
    ingress = {n: b for (t, n), b in resources.items() if t == "aws_vpc_security_group_ingress_rule"}
    assert ingress
    for name, rule in ingress.items():
        assert rule.get("cidr_ipv4") != "0.0.0.0/0" and rule.get("cidr_ipv6") != "::/0", name
        assert "cidr_ipv4" not in rule or rule["cidr_ipv4"] == "${var.operator_cidr}", name  # SSH only
    server_ports = {r["from_port"] for r in ingress.values() if r.get("referenced_security_group_id")}
    assert server_ports == {"${var.graph_server_port}", "${var.weight_server_port}", "${var.driver_port}"}
    lambda_sources = {r["from_port"] for r in ingress.values()
                      if r.get("referenced_security_group_id") == "${aws_security_group.lambda.id}"}
    assert lambda_sources == {"${var.graph_server_port}", "${var.weight_server_port}"}  # never the driver
    for sg in (b for (t, _), b in resources.items() if t == "aws_security_group"):
        assert "ingress" not in sg and "egress" not in sg  # rules live in their own resources only
    # the cluster file the servers are started with uses the same port variables
    network = (INFRA / "network.tf").read_text()
    for var in ("driver_port", "graph_server_port", "weight_server_port"):
        assert f"${{var.{var}}}" in network


def _statements() -> dict[str, list[dict]]:
    docs = {n: b for (t, n), b in _blocks("data").items() if t == "aws_iam_policy_document"}
    return {n: (d["statement"] if isinstance(d["statement"], list) else [d["statement"]]) for n, d in docs.items()}


def test_iam_is_least_privilege():
    st = _statements()
    for doc in ("lambda", "server"):
        for s in st[doc]:
            for action in s["actions"]:
                assert "*" not in action, f"{doc}: wildcard action {action}"
    lam = {s["sid"]: s for s in st["lambda"]}
    assert set(lam) == {"OwnLogs", "VpcNetworkInterfaces"}
    assert lam["OwnLogs"]["resources"] == ["${aws_cloudwatch_log_group.lambda.arn}:*"]
    assert all(a.startswith("ec2:") and ("NetworkInterface" in a or "PrivateIp" in a)
               for a in lam["VpcNetworkInterfaces"]["actions"])
    server = {s["sid"]: s for s in st["server"]}
    assert server["InvokeTensorWorker"]["resources"] == ["${aws_lambda_function.tensor.arn}"]
    assert server["WriteCheckpoints"]["actions"] == ["s3:PutObject"]
    assert all("checkpoint_prefix" in r for r in server["WriteCheckpoints"]["resources"])
    assert all(r != "*" for s in st["server"] for r in s["resources"])
    assert set(a for s in st["server"] for a in s["actions"]) == {"s3:ListBucket", "s3:GetObject", "s3:PutObject",
                                                                  "lambda:InvokeFunction"}


def test_bucket_is_encrypted_versioned_and_private():
    resources = _blocks("resource")
    assert ("aws_s3_bucket_server_side_encryption_configuration", "data") in resources
    assert _one(resources[("aws_s3_bucket_versioning", "data")]["versioning_configuration"])["status"] == "Enabled"
    block = resources[("aws_s3_bucket_public_access_block", "data")]
    assert all(block[k] is True for k in ("block_public_acls", "block_public_policy", "ignore_public_acls",
                                          "restrict_public_buckets"))


PLACEHOLDERS = {
    "${aws_cloudwatch_log_group.lambda.arn}": "arn:aws:logs:us-east-1:123456789012:log-group:/aws/lambda/dorylus-tensor",
    "${aws_s3_bucket.data.arn}": "arn:aws:s3:::dorylus-data-x",
    "${aws_lambda_function.tensor.arn}": "arn:aws:lambda:us-east-1:123456789012:function:dorylus-tensor",
    "${var.dataset_prefix}": "datasets", "${var.checkpoint_prefix}": "checkpoints",
}


def _render(statements: list[dict]) -> str:
    def sub(s: str) -> str:
        for k, v in PLACEHOLDERS.items():
            s = s.replace(k, v)
        assert "${" not in s, s
        return s

    out = []
    for s in statements:
        st = {"Sid": s["sid"], "Effect": s.get("effect", "Allow"), "Action": s["actions"],
              "Resource": [sub(r) for r in s["resources"]]}
        if "condition" in s:
            c = _one(s["condition"])
            st["Condition"] = {c["test"]: {c["variable"]: [sub(v) for v in c["values"]]}}
        out.append(st)
    return json.dumps({"Version": "2012-10-17", "Statement": out})


def test_policies_are_accepted_by_iam(moto_url):
    import boto3

    iam = boto3.client("iam")
    for doc in ("lambda", "server"):
        arn = iam.create_policy(PolicyName=f"dorylus-{doc}", PolicyDocument=_render(_statements()[doc]))["Policy"]["Arn"]
        version = iam.get_policy(PolicyArn=arn)["Policy"]["DefaultVersionId"]
        stored = iam.get_policy_version(PolicyArn=arn, VersionId=version)["PolicyVersion"]["Document"]
        stored = json.loads(stored) if isinstance(stored, str) else stored
        assert len(stored["Statement"]) == len(_statements()[doc])


def _binary(name: str, env: str) -> str | None:
    return os.environ.get(env) or shutil.which(name)


def test_terraform_fmt_check():
    terraform = _binary("terraform", "TERRAFORM")
    if not terraform:
        pytest.skip("terraform is not installed here")
    proc = subprocess.run([terraform, "fmt", "-check", "-recursive", str(INFRA)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"not formatted: {proc.stdout}"


def test_checkov_offline_finds_nothing_unexplained():
    checkov = _binary("checkov", "CHECKOV")
    if not checkov:
        pytest.skip("checkov is not installed here (it pins an old boto3: give it its own venv, set CHECKOV=path)")
    proc = subprocess.run([checkov, "-d", str(INFRA), "--framework", "terraform", "--skip-download", "--compact",
                           "--quiet", "-o", "json"], capture_output=True, text=True, check=False, timeout=600)
    report = json.loads(proc.stdout)
    reports = report if isinstance(report, list) else [report]
    failed = [f"{c['check_id']} {c['resource']}" for r in reports for c in r.get("results", {}).get("failed_checks", [])]
    assert not failed, "checkov findings without a justification next to the resource:\n" + "\n".join(failed)
