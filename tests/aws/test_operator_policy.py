"""The operator's policy and the roles' policies against what AWS enforces and moto does not: each
document under its size limit for how it is attached (docs/aws.md's command for the operator's), every
action the guide's commands and Terraform's resources need (a table, from AWS's documentation) allowed
by infra/operator-policy.json, and an IAM linter (parliament, where installed) finding nothing unexplained."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from dorylus_py.rehearsal.checks import kms_allows
from dorylus_py.rehearsal.iam import allowed

pytest.importorskip("hcl2")
from tests.aws.terraform import INFRA, OPERATOR as OPERATOR_ARN, render, statements  # noqa: E402

DOCS = INFRA.parent / "docs" / "aws.md"
OPERATOR = INFRA / "operator-policy.json"

# IAM counts a policy's characters without whitespace (IAM and AWS STS quotas): per user, the inline
# policies together; per managed policy; per role, the inline policies together; a role's trust policy.
IAM_LIMITS = {"put-user-policy": 2048, "put-group-policy": 5120, "create-policy": 6144, "put-role-policy": 10240,
              "trust": 2048}
# Resource policies, as their services count them: a KMS key policy 32 KB, a bucket policy 20 KB, a VPC
# endpoint policy 20,480 characters.
RESOURCE_LIMITS = {"kms": 32768, "bucket": 20480, "endpoint": 20480}


def iam_size(document: str) -> int:
    return len(re.sub(r"\s", "", document))


def attachment(docs: str = "") -> str:
    """How docs/aws.md attaches infra/operator-policy.json: the ``aws iam`` command that names it."""
    text = (docs or DOCS.read_text()).replace("\\\n", " ")
    found = re.findall(r"aws iam ([a-z-]+)(?:(?!aws iam |\n\n)[^`])*?operator-policy\.json", text)
    assert len(found) == 1, f"docs/aws.md names operator-policy.json in {found or 'no'} aws iam commands"
    return found[0]


def test_every_policy_is_under_its_size_limit_as_it_is_attached():
    how = attachment()
    assert how == "create-policy", f"docs/aws.md attaches the operator's policy with {how}: a managed policy holds 3x"
    text = DOCS.read_text().replace("\\\n", " ")
    assert re.search(r"aws iam attach-user-policy [^\n]*--policy-arn", text)  # and attaches it
    assert iam_size(OPERATOR.read_text()) <= IAM_LIMITS[how], iam_size(OPERATOR.read_text())
    st = statements()
    for role in ("lambda", "server"):  # one inline policy each (aws_iam_role_policy)
        assert iam_size(render(st[role])) <= IAM_LIMITS["put-role-policy"], role
        trust = json.dumps({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                                    "Principal": {"Service": "x.amazonaws.com"}}]})
        assert iam_size(trust) <= IAM_LIMITS["trust"] and len(st[f"{role}_assume"]) == 1
    for name, limit in RESOURCE_LIMITS.items():
        assert len(render(st[name])) + 200 * len(st[name]) <= limit, name  # 200: each statement's principals


def test_the_size_check_refuses_the_inline_attachment_of_issue_43():
    before = "attach it with `aws iam put-user-policy --user-name YOU --policy-name dorylus --policy-document\n" \
             "file://infra/operator-policy.json`"
    assert attachment(before) == "put-user-policy"
    assert iam_size(OPERATOR.read_text()) > IAM_LIMITS["put-user-policy"]


ACCOUNT, REGION = "123456789012", "us-east-1"
REPO = f"arn:aws:ecr:{REGION}:{ACCOUNT}:repository/dorylus-lambda"
FUNCTION = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:dorylus-tensor"
BUCKET = "arn:aws:s3:::dorylus-data-20261203"
KEY = f"arn:aws:kms:{REGION}:{ACCOUNT}:key/0d1e2f3a-4b5c-6d7e-8f90-a1b2c3d4e5f6"
SECRET = f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:dorylus-job-key-20261203-AbCdEf"
INSTANCE = f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/i-0123456789abcdef0"
VPC = f"arn:aws:ec2:{REGION}:{ACCOUNT}:vpc/vpc-0123456789abcdef0"
GROUP = f"arn:aws:ec2:{REGION}:{ACCOUNT}:security-group/sg-0123456789abcdef0"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/dorylus-"
OURS = {"aws:ResourceTag/Project": "dorylus"}  # every resource infra/ makes carries it (default_tags)
STATE = "arn:aws:s3:::dorylus-tfstate-123456789012/dorylus/terraform.tfstate"
QUOTA = f"arn:aws:servicequotas:{REGION}:{ACCOUNT}:"
PUSH = ("ecr:BatchCheckLayerAvailability", "ecr:InitiateLayerUpload", "ecr:UploadLayerPart", "ecr:CompleteLayerUpload",
        "ecr:PutImage", "ecr:BatchGetImage")
# What each step asks of the operator's identity, beyond the calls the rehearsal makes and checks: the
# API's own action and what AWS checks with it (the Service Authorization Reference's dependent
# actions, and each service's guide where it names permissions of the caller). (action, resource[, context])
NEEDED = {
    "aws lambda get-account-settings (the concurrency quota)": [("lambda:GetAccountSettings", "*")],
    "aws freetier get-account-plan-state (the plan)": [("freetier:GetAccountPlanState", "*")],
    "aws service-quotas get-service-quota": [("servicequotas:GetServiceQuota", QUOTA + "ec2/L-1216C47A")],
    "aws ecr create-repository": [("ecr:CreateRepository", REPO)],
    "aws ecr get-login-password": [("ecr:GetAuthorizationToken", "*")],
    "docker push": [(a, REPO) for a in PUSH],
    # Lambda's guide, container images: a function from an image in a repository without a policy for
    # Lambda gets one, added by Lambda only if the caller may get and set the repository's policy.
    "aws_lambda_function (image)": [("lambda:CreateFunction", FUNCTION), ("iam:PassRole", ROLE + "lambda"),
                                    ("ecr:BatchGetImage", REPO), ("ecr:GetDownloadUrlForLayer", REPO),
                                    ("ecr:GetRepositoryPolicy", REPO), ("ecr:SetRepositoryPolicy", REPO),
                                    ("lambda:TagResource", FUNCTION)],
    # ... in a VPC: Lambda checks that the caller may describe what the function attaches to
    "aws_lambda_function (vpc_config)": [("ec2:DescribeSecurityGroups", "*"), ("ec2:DescribeSubnets", "*"),
                                         ("ec2:DescribeVpcs", "*")],
    "aws_lambda_function (lambda_reserved_concurrency)": [("lambda:PutFunctionConcurrency", FUNCTION),
                                                          ("lambda:DeleteFunctionConcurrency", FUNCTION)],
    # ec2:CreateVpcEndpoint's dependent action with private DNS: the endpoint's private hosted zone
    "aws_vpc_endpoint (secretsmanager, private_dns_enabled)": [("ec2:CreateVpcEndpoint", "*"),
                                                               ("route53:AssociateVPCWithHostedZone",
                                                                "arn:aws:route53:::hostedzone/Z0123456789ABCDEFGHIJ")],
    # destroy: the Lambda's network interfaces linger after the function; the provider detaches and
    # deletes them before the subnets and the security group can go
    "aws_subnet, aws_security_group (destroy)": [("ec2:DescribeNetworkInterfaces", "*"),
                                                 ("ec2:DetachNetworkInterface", "*"), ("ec2:DeleteNetworkInterface", "*")],
    "data.aws_ec2_instance_type_offerings (zones by offering)": [("ec2:DescribeInstanceTypeOfferings", "*")],
    "data.aws_ssm_parameter (Amazon Linux 2023)": [
        ("ssm:GetParameter", f"arn:aws:ssm:{REGION}::parameter/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64")],
    "aws_instance": [("ec2:RunInstances", "*"), ("iam:PassRole", ROLE + "server"),
                     ("ec2:CreateTags", INSTANCE, {"ec2:CreateAction": "RunInstances"})],
    "aws_kms_key": [("kms:CreateKey", "*"), ("kms:TagResource", "*"), ("kms:EnableKeyRotation", KEY),
                    ("kms:PutKeyPolicy", KEY)],  # CreateKey's lockout check: the key's policy lets its creator change it
    "dorylus aws put-secret": [("secretsmanager:PutSecretValue", SECRET), ("kms:GenerateDataKey", KEY)],
    "dorylus prepare (s3://)": [("s3:PutObject", BUCKET + "/datasets/mygraph/manifest.json"), ("kms:GenerateDataKey", KEY)],
    "aws ec2-instance-connect send-ssh-public-key": [
        ("ec2-instance-connect:SendSSHPublicKey", INSTANCE, {"ec2:osuser": "ec2-user"} | OURS)],
    "dorylus aws update-function": [("lambda:UpdateFunctionCode", FUNCTION), ("lambda:GetFunction", FUNCTION),
                                    ("ecr:BatchGetImage", REPO), ("ecr:GetDownloadUrlForLayer", REPO)],
    "terraform destroy": [("ec2:TerminateInstances", INSTANCE, OURS), ("ec2:DeleteVpc", VPC, OURS),
                          ("ec2:RevokeSecurityGroupIngress", GROUP, OURS), ("kms:ScheduleKeyDeletion", KEY),
                          ("s3:DeleteObjectVersion", BUCKET + "/datasets/mygraph/x.npy")],  # force_destroy's emptying
    "aws ecr delete-repository --force": [("ecr:DeleteRepository", REPO)],
    "aws resourcegroupstaggingapi get-resources (what is left)": [("tag:GetResources", "*")],
    "aws service-quotas request-service-quota-increase": [
        ("servicequotas:RequestServiceQuotaIncrease", QUOTA + "lambda/L-B99A9384"),
        ("servicequotas:RequestServiceQuotaIncrease", QUOTA + "ec2/L-1216C47A")],
    "aws budgets create-budget (the checklist's alarm)": [("budgets:ModifyBudget", f"arn:aws:budgets::{ACCOUNT}:budget/dorylus")],
    "terraform init with the S3 backend (remote state and its lock file)": [
        ("s3:ListBucket", "arn:aws:s3:::dorylus-tfstate-123456789012"), ("s3:GetObject", STATE), ("s3:PutObject", STATE),
        ("s3:PutObject", STATE + ".tflock"), ("s3:DeleteObject", STATE + ".tflock")],
}


def key_policy() -> dict:
    """infra/s3.tf's key policy as the first apply by user ``operator`` renders it."""
    return json.loads(render(statements()["kms"]))


def may(policy: dict, action: str, resource: str, context: dict | None = None) -> bool:
    """Whether the operator may: by its IAM ``policy`` or, for this deployment's key (KEY), that key's policy."""
    if resource.startswith("arn:aws:kms:"):
        return kms_allows(key_policy() if resource == KEY else None, [policy], action, resource, context or {}, OPERATOR_ARN)
    return allowed([policy], action, resource, context or {})


def missing(policy: dict, needed: dict = NEEDED) -> list[str]:
    return [f"{step}: {need[0]} on {need[1]}" for step, needs in needed.items() for need in needs
            if not may(policy, need[0], need[1], need[2] if len(need) > 2 else {})]


def test_every_action_the_guide_and_terraform_need_is_in_the_operators_policy():
    assert missing(json.loads(OPERATOR.read_text())) == []


OTHER_KEY = f"arn:aws:kms:{REGION}:{ACCOUNT}:key/99999999-0000-4000-8000-000000000000"  # not the deployment's
# What the operator may not do outside the deployment (issue 54): tag what it did not create, then use a
# tag-gated permission on it; change or delete what is not tagged as the deployment's; use or retire any
# other KMS key. (action, resource, context)
REFUSED = [
    ("ec2:CreateTags", INSTANCE, {}),  # tagging an instance that exists: Project=dorylus would open the rest
    ("ec2:CreateTags", INSTANCE, {"ec2:CreateAction": "CreateTags"}),
    ("ec2-instance-connect:SendSSHPublicKey", INSTANCE, {"ec2:osuser": "ec2-user"}),  # not tagged as ours
    ("ec2:TerminateInstances", INSTANCE, {}), ("ec2:TerminateInstances", INSTANCE, {"aws:ResourceTag/Project": "other"}),
    ("ec2:ModifyInstanceAttribute", INSTANCE, {}), ("ec2:DeleteVpc", VPC, {}), ("ec2:RevokeSecurityGroupIngress", GROUP, {}),
    ("ec2:DeleteSecurityGroup", GROUP, {}), ("ec2:DeleteSubnet", f"arn:aws:ec2:{REGION}:{ACCOUNT}:subnet/subnet-1", {}),
    ("kms:Decrypt", OTHER_KEY, {}), ("kms:ScheduleKeyDeletion", OTHER_KEY, {}), ("kms:DisableKey", KEY, {}),
    ("kms:PutKeyPolicy", OTHER_KEY, {}), ("s3:GetObject", "arn:aws:s3:::someone-elses-bucket/x", {}),
    ("iam:PassRole", f"arn:aws:iam::{ACCOUNT}:role/admin", {}),
]


def test_the_operator_may_not_touch_what_is_not_the_deployments():
    """The deny side of each narrowing: every request of REFUSED is refused, and the same request on the
    deployment's own resource (tagged, or its key) is allowed, so each refusal is the narrowing's doing."""
    policy = json.loads(OPERATOR.read_text())
    assert [r for r in REFUSED if may(policy, *r)] == []
    ours = [(a, KEY if r == OTHER_KEY else r, c | OURS if a.startswith("ec2") and a != "ec2:CreateTags" else c)
            for a, r, c in REFUSED if not a.startswith(("s3:", "iam:")) and a != "kms:DisableKey"]
    ours = [(a, r, {"ec2:CreateAction": "RunInstances"} if a == "ec2:CreateTags" else c) for a, r, c in ours]
    assert [r for r in ours if not may(policy, *r)] == []


def test_the_deny_tests_find_the_policy_of_before_issue_54():
    """The operator's policy before issue 54 (CreateTags on every resource, destructive EC2 actions and KMS use
    on every resource and key) fails the refusal test on each of those."""
    policy = json.loads(OPERATOR.read_text())
    loose = {"Sid": "Before", "Effect": "Allow", "Resource": "*", "Action": [
        "ec2:CreateTags", "ec2:TerminateInstances", "ec2:ModifyInstanceAttribute", "ec2:DeleteVpc", "kms:Decrypt",
        "kms:ScheduleKeyDeletion"]}
    before = dict(policy, Statement=policy["Statement"] + [loose])
    assert {a for a, r, c in REFUSED if may(before, a, r, c)} >= set(loose["Action"])


def test_the_table_finds_what_the_policy_of_issue_43_lacked():
    policy = json.loads(OPERATOR.read_text())
    lacked = {"ecr:GetRepositoryPolicy", "ecr:SetRepositoryPolicy", "lambda:PutFunctionConcurrency",
              "route53:AssociateVPCWithHostedZone", "ec2:DetachNetworkInterface", "ec2:DeleteNetworkInterface",
              "ec2-instance-connect:SendSSHPublicKey"}
    for st in policy["Statement"]:
        actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
        st["Action"] = [a for a in actions if a not in lacked] or ["none:None"]
    found = {line.split(": ")[1].split(" on ")[0] for line in missing(policy)}
    assert found == lacked


# parliament's findings, each explained: (issue, the policy's statement Sid or role) -> why it stays.
EXPLAINED = {
    ("RESOURCE_STAR", "Network"): "Terraform creates and deletes VPC resources whose ids exist only once made; "
                                  "the statement is EC2 networking and instances, nothing else",
    ("RESOURCE_STAR", "NotScopedByAws"): "kms:TagResource while kms:CreateKey runs is checked on \"*\" (no key yet)",
    ("RESOURCE_MISMATCH", "Bucket"): "s3:* on this deployment's bucket and its objects only; the actions of other "
                                     "resource types (access points, batch jobs) match nothing there, as meant",
    ("RESOURCE_MISMATCH", "AmazonLinuxImage"): "AWS's public parameters have no account in their ARN "
                                               "(arn:aws:ssm:REGION::parameter/aws/service/...)",
    ("RESOURCE_STAR", "lambda"): "the VPC network-interface actions a function's role needs support no resource "
                                 "(AWS's AWSLambdaVPCAccessExecutionRole grants them on \"*\")",
}


def _parliament() -> str:
    found = os.environ.get("PARLIAMENT") or shutil.which("parliament")
    if not found:
        pytest.skip("parliament is not installed here (pip install parliament in a venv of its own; PARLIAMENT=path)")
    return found


def _sid_at(text: str, line: int) -> str:
    """The Sid of the statement that starts at ``line`` (1-based) of a pretty-printed policy."""
    return re.search(r'"Sid": "(\w+)"', "\n".join(text.splitlines()[line - 1:])).group(1)


def test_parliament_finds_nothing_unexplained():
    parliament = _parliament()
    documents = {"operator": OPERATOR.read_text(), "lambda": render(statements()["lambda"]),
                 "server": render(statements()["server"])}
    unexplained = []
    for who, text in documents.items():
        proc = subprocess.run([parliament, "--json"], input=text, capture_output=True, text=True, timeout=120,
                              check=False)
        findings = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        assert proc.returncode in (0, 1) and (findings or not proc.stdout.strip()), proc.stderr[-1000:]
        for f in findings:
            where = _sid_at(text, f["location"]["line"]) if who == "operator" else who
            if (f["issue"], where) not in EXPLAINED:
                unexplained.append(f"{who} {where}: {f['issue']} {f['detail']}")
    assert unexplained == []


def test_guide_commands_name_their_region():
    """The AWS CLI and dorylus's AWS commands use the CLI's default region unless told: each names $REGION."""
    text = DOCS.read_text().replace("\\\n", " ")
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    lines = [line for b in blocks for line in b.splitlines()]
    aws = [line for line in lines if re.search(r"(^|\$\(|\| )aws (?!iam )", line) or "dorylus aws put-secret" in line
           or "dorylus aws update-function" in line]
    assert aws and [a for a in aws if "--region" not in a] == []
    terraform = [a for a in lines if re.match(r"terraform (-chdir=infra )?(apply|destroy)", a)]
    assert len(terraform) == 3 and [a for a in terraform if "-var region=$REGION" not in a] == []


def test_tools_are_listed():
    need = re.search(r"What you need:(.*?)\n\n", DOCS.read_text(), re.S).group(1)
    for tool in ("jq", "Terraform", "Docker", "AWS CLI"):
        assert tool in need, tool

