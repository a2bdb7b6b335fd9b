"""`dorylus aws rehearse`: docs/aws.md from `terraform apply` to two trained models and back to nothing,
against moto with IAM enforced (dorylus_py/rehearsal/). Without terraform or the provider mirror these
tests skip, naming what is missing; with DORYLUS_REQUIRE_TERRAFORM=1 (.ci/run sets it) that is a failure.
DORYLUS_SKIP_REHEARSAL=1 skips them by hand. About 3-4 minutes on 2 cores (marked long); its own checks
(losses, leftovers, calls, refusals, docs) raise."""

from __future__ import annotations

import json
import os

import pytest

from dorylus_py.cli import main


@pytest.fixture()
def rehearsal_tools():
    if os.environ.get("DORYLUS_SKIP_REHEARSAL") == "1":
        pytest.skip("DORYLUS_SKIP_REHEARSAL=1")
    from dorylus_py.errors import ConfigError
    from dorylus_py.rehearsal.terraform import find_tools

    try:
        return find_tools()
    except ConfigError as e:
        if os.environ.get("DORYLUS_REQUIRE_TERRAFORM") == "1":
            pytest.fail(f"{e} (DORYLUS_REQUIRE_TERRAFORM=1)", pytrace=False)
        pytest.skip(f"{e} (set DORYLUS_REQUIRE_TERRAFORM=1 to make this a failure)")


@pytest.mark.timeout(1500)  # 3.5 min alone, over 6 under load
@pytest.mark.long
def test_rehearsal_from_terraform_apply_to_trained_models_and_back_to_nothing(rehearsal_tools, tmp_path, monkeypatch):
    from dorylus_py.rehearsal.run import STEPS, Rehearsal

    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)  # the rehearsal hands each identity its own credentials
    result = Rehearsal(tmp_path / "r", epochs=2, say=print).run()  # each step and its time, under pytest -s
    assert tuple(step for step, _ in result["steps"] if not step.startswith("(")) == STEPS
    assert result["jobs"] == 2 and len(result["job_losses"]) == 2  # two jobs on the same servers
    assert all(job == result["losses"] for job in result["job_losses"])  # each equals --backend local's
    assert len(result["losses"]) == 2  # one loss an epoch: --epochs 2
    # every server came up before the job key was there, exited, and was started again by its unit
    assert sorted(result["exits"]) == ["graph-server-0", "graph-server-1", "weight-server-0"]
    assert all(exits[0] == 2 for exits in result["exits"].values()), result["exits"]
    calls = [json.loads(line) for line in (tmp_path / "r" / "calls.jsonl").read_text().splitlines()]
    server = {(c["action"], c["resource"].split(":::")[-1].split("/")[1] if ":::" in c["resource"] else "")
              for c in calls if c["who"] == "server"}
    assert ("s3:PutObject", "checkpoints") in server and ("lambda:GetFunctionConfiguration", "") in server
    assert ("s3:GetObject", "packages") in server and ("lambda:InvokeFunction", "") in server
    assert all(c["allowed"] for c in calls if c["who"] != "harness")  # what no role may do: audit.overbroad, inside
    print(f"rehearsal: {result['seconds']} s; " + "; ".join(f"{s} {t} s" for s, t in result["steps"]))


def test_rehearse_refuses_a_work_folder_that_holds_files(tmp_path, capsys):
    (tmp_path / "x").write_text("")
    assert main(["aws", "rehearse", "--work", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "not empty" in err and "Traceback" not in err
    assert main(["aws", "rehearse", "--epochs", "0"]) == 2


@pytest.mark.timeout(900)  # three plans; minutes on a loaded machine
@pytest.mark.long
def test_terraform_plans_gpu_graph_servers_on_their_image(rehearsal_tools, moto_aws, tmp_path):
    """graph_server_type and graph_server_ami: `terraform plan` against moto makes the graph servers of that
    type from that image (with room for its CUDA libraries), the weight server stays on Amazon Linux 2023's
    CPU type, and the graph servers' requirements are the lock less its CPU torch; bad values stop it."""
    from dorylus_py.errors import ConfigError
    from dorylus_py.rehearsal.run import Rehearsal
    from dorylus_py.rehearsal.terraform import Terraform

    terraform, mirror = rehearsal_tools
    wheel = tmp_path / "dorylus_py-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"a wheel")
    tf = Terraform(terraform, tmp_path, moto_aws.url, ("testing", "testing"), "", tmp_path / "terraform.log")
    tf.init(mirror)
    gpu = {"graph_server_type": "g5.xlarge", "graph_server_ami": "ami-0123456789abcdef0"}
    variables = Rehearsal.VARIABLES | {"server_wheel": str(wheel)} | gpu
    resources = {r["address"]: r.get("values", {}) for r in tf.plan(variables)["planned_values"]["root_module"]["resources"]}
    planned = {a: v for a, v in resources.items() if a.startswith("aws_instance.")}
    al2023 = moto_aws_ssm_al2023()
    assert {a: (v["instance_type"], v.get("ami"), v["root_block_device"][0]["volume_size"]) for a, v in planned.items()} == {
        'aws_instance.server["graph-server-0"]': ("g5.xlarge", "ami-0123456789abcdef0", 200),
        'aws_instance.server["graph-server-1"]': ("g5.xlarge", "ami-0123456789abcdef0", 200),
        'aws_instance.server["weight-server-0"]': ("c5.xlarge", None, 30)}  # the pinned image: known once applied
    assert resources["terraform_data.al2023"]["input"] == al2023  # what the weight server boots, kept by later applies
    # zones by offering (moto's us-east-1 offers both types in a, b, c, d, f): the servers and one Lambda
    # subnet in the first, the other Lambda subnet in the next; an excluded zone id is never used
    assert _zones(resources) == ("us-east-1a", ["us-east-1a", "us-east-1b"])
    assert _zones(tf.plan(variables | {"excluded_zone_ids": '["use1-az6","use1-az1"]'})["planned_values"]["root_module"]
                  ["resources"]) == ("us-east-1c", ["us-east-1c", "us-east-1d"])  # moto: use1-az6 is a, use1-az1 b
    with pytest.raises(ConfigError, match="terraform plan failed"):
        tf.plan(variables | {"graph_server_type": "c9z.huge"})  # offered in no zone: the subnet's precondition
    assert "offers every server type" in (tmp_path / "terraform.log").read_text()
    servers = tf.evaluate('{for k, s in local.servers : k => [s.python, s.image_torch]}', variables)
    assert servers == {"graph-server-0": ["/opt/pytorch/bin/python3", True],
                       "graph-server-1": ["/opt/pytorch/bin/python3", True], "weight-server-0": ["python3.11", False]}
    dropped = tf.evaluate('setsubtract(split("\\n", local.lock), split("\\n", local.lock_without_torch))', variables)
    assert [d.split()[0] for d in dropped] == ["torch==2.13.0+cpu"]
    cpu = tf.evaluate('{for k, s in local.servers : k => s.image_torch}', {**variables, "graph_server_ami": ""})
    assert cpu == {"graph-server-0": False, "graph-server-1": False, "weight-server-0": False}
    for name, bad, message in (("graph_server_ami", "ami-12345", "ami- and 8 or 17 hex digits"),
                               ("graph_server_image_python", "python3", "must be an absolute path"),
                               ("graph_server_type", "g5 xlarge", "must be an EC2 instance type")):
        with pytest.raises(ConfigError, match="terraform console failed"):
            tf.evaluate("local.servers", {**variables, name: bad})
        assert message in (tmp_path / "terraform.log").read_text()


def _zones(resources) -> tuple[str, list[str]]:
    """The servers' subnet's zone and the Lambda subnets' zones, from planned resources (a dict or plan list)."""
    values = resources if isinstance(resources, dict) else {r["address"]: r.get("values", {}) for r in resources}
    return values["aws_subnet.servers"]["availability_zone"], [values[f"aws_subnet.lambda[{i}]"]["availability_zone"]
                                                                for i in range(2)]


def moto_aws_ssm_al2023() -> str:
    """The Amazon Linux 2023 AMI moto's public SSM parameter names (what the weight server boots)."""
    import boto3

    name = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"
    return boto3.client("ssm").get_parameter(Name=name)["Parameter"]["Value"]
