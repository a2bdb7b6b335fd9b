"""`dorylus aws rehearse`: docs/aws.md from the Lambda image's build context to two trained models and back
to nothing, against moto with IAM enforced (dorylus_py/rehearsal/); the guide's remote state against moto.
Without terraform, the provider mirror or the AWS CLI these tests skip, naming what is missing; with
DORYLUS_REQUIRE_TERRAFORM=1 (.ci/run sets it) that is a failure. DORYLUS_SKIP_REHEARSAL=1 skips them by
hand. About 3-5 minutes on 2 idle cores (marked long); its own checks (losses, leftovers, calls, refusals,
docs) raise."""

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
    from dorylus_py.rehearsal.terraform import find_aws_cli, find_tools

    try:
        find_aws_cli()  # the guide's `aws` commands
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
    server = {(c["action"], c["resource"].split(":::")[-1].partition("/")[2].split("/")[0]) for c in calls
              if c["who"] == "server"}
    assert ("s3:PutObject", "checkpoints") in server and ("lambda:GetFunctionConfiguration", "") in server
    assert ("s3:GetObject", "packages") in server and ("lambda:InvokeFunction", "") in server
    assert ("s3:ListBucket", "") in server  # the first checkpoint's latest.json, listed: absent, never a refused read
    assert {c["action"] for c in calls if c["who"] == "lambda"} == {"secretsmanager:GetSecretValue"}  # the containers
    assert all(c["allowed"] for c in calls if c["who"] != "harness")  # what no role may do: audit.overbroad, inside
    assert (tmp_path / "r" / "src" / "build" / "lambda" / "Dockerfile").is_file()  # section 1, as written
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
    assert _zones(resources) == ("us-east-1a", ["us-east-1a"])  # the Lambdas in the servers' zone: no transfer cost
    assert _zones(tf.plan(variables | {"excluded_zone_ids": '["use1-az6","use1-az1"]', "lambda_zone_count": "2"})
                  ["planned_values"]["root_module"]["resources"]) == ("us-east-1c", ["us-east-1c", "us-east-1d"])
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
                                                                for i in range(2) if f"aws_subnet.lambda[{i}]" in values]


def moto_aws_ssm_al2023() -> str:
    """The Amazon Linux 2023 AMI moto's public SSM parameter names (what the weight server boots)."""
    import boto3

    name = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"
    return boto3.client("ssm").get_parameter(Name=name)["Parameter"]["Value"]


@pytest.mark.timeout(900)
@pytest.mark.long
def test_the_guides_remote_state_keeps_state_and_its_lock_in_s3(rehearsal_tools, moto_aws, tmp_path, monkeypatch):
    """docs/aws.md's "Terraform's state" as written, as the operator (its policy enforced): the state bucket
    made and versioned, the example backend copied, `terraform init` with it (plus the endpoint settings moto
    needs); then an apply writes the state into the bucket, taking and dropping its lock file there."""
    import boto3

    from dorylus_py.rehearsal import guide
    from dorylus_py.rehearsal.run import Rehearsal
    from dorylus_py.rehearsal.terraform import INFRA, Terraform

    terraform, mirror = rehearsal_tools
    iam = boto3.client("iam")
    iam.create_user(UserName="operator")
    arn = iam.create_policy(PolicyName="dorylus-operator", PolicyDocument=(INFRA / "operator-policy.json").read_text())
    iam.attach_user_policy(UserName="operator", PolicyArn=arn["Policy"]["Arn"])
    key = iam.create_access_key(UserName="operator")["AccessKey"]
    creds = {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}
    checkout = tmp_path / "checkout"
    tf = Terraform(terraform, checkout, moto_aws.url, tuple(creds.values()), "", tmp_path / "terraform.log")
    env = tf.env | creds | {"AWS_ENDPOINT_URL": moto_aws.url}
    before, own = guide.section("### Terraform's state")
    assert [c.split(" ")[0:3] for c in own] == [["aws", "s3api", "create-bucket"], ["aws", "s3api", "put-bucket-versioning"],
                                                ["cp", "infra/backend-s3.tf.example", "infra/backend.tf"],
                                                ["terraform", "-chdir=infra", "init"]]
    moto_aws.enforce(True)
    try:
        for i, command in enumerate(own):
            if command.startswith("terraform -chdir=infra init"):  # plus what points the backend at moto
                command += (f" -plugin-dir={mirror} '-backend-config=endpoints={{s3=\"{moto_aws.url}\"}}'"
                            " -backend-config=use_path_style=true -backend-config=skip_credentials_validation=true"
                            " -backend-config=skip_requesting_account_id=true -backend-config=skip_metadata_api_check=true"
                            " -backend-config=skip_s3_checksum=true -no-color")
            guide.run(command, before + own[:i], checkout, env, tmp_path / "guide.log", timeout_s=300)
        wheel = tmp_path / "dorylus_py-0.1.0-py3-none-any.whl"
        wheel.write_bytes(b"a wheel")
        tf.env |= creds  # the backend's credentials: the operator's, from the environment as on a laptop
        tf.run("apply", "-auto-approve", "-no-color", "-target=aws_s3_bucket.data",
               *[f"-var={k}={v}" for k, v in (Rehearsal.VARIABLES | {"server_wheel": str(wheel)}).items()])
    finally:
        moto_aws.enforce(False)
    state_bucket = "dorylus-tfstate-123456789012"
    keys = {o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=state_bucket).get("Contents", [])}
    assert keys == {"dorylus/terraform.tfstate"}  # the lock file taken and dropped again
    lock = [c for c in moto_aws.calls if c.resource.endswith("terraform.tfstate.tflock")]
    assert {c.action for c in lock} >= {"s3:PutObject", "s3:DeleteObject"} and all(c.allowed for c in lock)
    assert all(c.allowed for c in moto_aws.calls if c.principal.endswith(":user/operator"))
    assert not (checkout / "infra" / "terraform.tfstate").exists()  # nothing on the laptop
