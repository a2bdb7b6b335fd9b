"""What the rehearsal checks after the fact: least privilege measured on its recorded calls, and an
account left as it was found.

Least privilege: no call of the operator or the servers' role was denied, and every action their
policies grant (infra/operator-policy.json; infra/iam.tf as Terraform rendered it) was used by some
step, or is listed in docs/aws.md's table of permissions the rehearsal does not exercise, with why;
an action listed there that a step did use makes the table stale, which is a finding too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from dorylus_py.rehearsal.iam import allowed, applies, statements

DOCS = Path(__file__).resolve().parents[2] / "docs" / "aws.md"
ROLES = {"server": "dorylus-server", "lambda": "dorylus-lambda"}


@dataclass
class Findings:
    problems: list[str] = field(default_factory=list)
    used: dict[str, list[str]] = field(default_factory=dict)  # who -> the actions its calls used


def who(principal: str) -> str:
    """operator | server | lambda | harness, from the caller's ARN."""
    if principal.endswith(":user/operator"):
        return "operator"
    if principal.endswith(":user/rehearsal-harness"):
        return "harness"
    for name, role in ROLES.items():
        if f":assumed-role/{role}/" in principal:
            return name
    return principal


def not_rehearsed(docs: Path = DOCS) -> list[tuple[str, set[str], set[str]]]:
    """docs/aws.md's rows ``| who | `action`, ... (statement `Sid`) | why |`` under "Permissions the
    rehearsal does not use", as (who, actions, statement ids: empty for any statement)."""
    text = docs.read_text()
    section = text.split("Permissions the rehearsal does not use", 1)[-1].split("\n#", 1)[0]
    rows = []
    for kind, cell in re.findall(r"^\| *(operator|server|lambda) *\|([^|]*)\|", section, re.M):
        names = re.findall(r"`([\w:*-]+)`", cell)
        rows.append((kind, {n for n in names if ":" in n}, {n for n in names if ":" not in n}))
    return rows


def _listed(rows, kind: str, sid: str, action: str) -> bool:
    return any(k == kind and action in actions and (not sids or sid in sids) for k, actions, sids in rows)


# What each role must be refused, whatever else it may do: a policy that allowed everything would pass
# the used-or-listed check above (every call matches "*"), so these requests are put to the policies
# Terraform rendered. ``{bucket}`` is the run's bucket.
MUST_REFUSE = {
    "server": [("s3:PutObject", "arn:aws:s3:::{bucket}/datasets/graph/manifest.json"),  # the dataset is read-only
               ("s3:PutObject", "arn:aws:s3:::{bucket}/elsewhere/x"),  # writes only under checkpoints/
               ("s3:DeleteBucket", "arn:aws:s3:::{bucket}"), ("iam:CreateUser", "*"),
               ("iam:PassRole", "*"), ("lambda:UpdateFunctionCode", "*"), ("ec2:RunInstances", "*")],
    "lambda": [("s3:PutObject", "arn:aws:s3:::{bucket}/datasets/graph/manifest.json"), ("iam:CreateUser", "*"),
               ("lambda:InvokeFunction", "*"), ("ec2:RunInstances", "*")],
}


def overbroad(role_docs: dict[str, dict], bucket: str) -> list[str]:
    """The requests of ``MUST_REFUSE`` that a role's policies allow, as findings."""
    return [f"{kind} may {action} on {resource.format(bucket=bucket)}, which it must never do"
            for kind, requests in MUST_REFUSE.items() for action, resource in requests
            if allowed([role_docs.get(kind, {})], action, resource.format(bucket=bucket))]


def check(calls, role_docs: dict[str, dict], operator_doc: dict, docs: Path = DOCS, bucket: str = "") -> Findings:
    found = Findings(problems=overbroad(role_docs, bucket) if bucket else [])
    listed = not_rehearsed(docs)
    granted = {"operator": operator_doc, **role_docs}
    by_who: dict[str, list] = {}
    for call in calls:
        kind = who(call.principal)
        if kind == "harness":
            continue
        if kind not in granted:
            found.problems.append(f"a call from {call.principal}, who is neither the operator nor a role of infra/")
            continue
        by_who.setdefault(kind, []).append(call)
        if not call.allowed:
            found.problems.append(f"{kind} was denied {call.action} on {call.resource}")
    for kind, doc in granted.items():
        mine = [c for c in by_who.get(kind, []) if c.allowed]
        found.used[kind] = sorted({c.action for c in mine})
        for st in statements(doc):
            for action in st["Action"] if isinstance(st["Action"], list) else [st["Action"]]:
                one = dict(st, Action=[action])
                used = any(applies(one, c.action, c.resource, c.context) for c in mine)
                listed_here = _listed(listed, kind, st.get("Sid", ""), action)
                if used and listed_here:
                    found.problems.append(f"docs/aws.md says the rehearsal does not use {kind}'s {action}, but it did")
                elif not used and not listed_here:
                    found.problems.append(f"{kind} may {action} ({st.get('Sid', '')}) but no step used it, and docs/aws.md "
                                          "does not say why")
    return found


def write_calls(calls, path: Path) -> None:
    """Every checked call, one JSON object a line: who, what, on which resource, allowed or not."""
    import json

    path.write_text("".join(json.dumps({"who": who(c.principal), "principal": c.principal, "action": c.action,
                                        "resource": c.resource, "allowed": c.allowed}) + "\n" for c in calls))


def role_policies(client) -> dict[str, dict]:
    """The inline policies of the servers' and the Lambda's roles, as Terraform rendered them."""
    import json

    iam = client("iam")
    out = {}
    for kind, role in ROLES.items():
        names = iam.list_role_policies(RoleName=role)["PolicyNames"]
        docs = [iam.get_role_policy(RoleName=role, PolicyName=n)["PolicyDocument"] for n in names]
        docs = [json.loads(d) if isinstance(d, str) else d for d in docs]
        out[kind] = {"Version": "2012-10-17", "Statement": [s for d in docs for s in statements(d)]}
    return out


def operator_policy(client, iam_doc: dict, operator_arn: str) -> dict:
    """What the operator is granted: its IAM policy, and the statements of the deployment's KMS key policy
    that name it (the operator's IAM policy grants no key; that key's own policy does)."""
    import json

    kms = client("kms")
    granted = list(statements(iam_doc))
    for key in kms.list_keys()["Keys"]:
        if _customer_key(kms, key["KeyId"]):
            doc = json.loads(kms.get_key_policy(KeyId=key["KeyId"], PolicyName="default")["Policy"])
            granted += [st for st in statements(doc) if operator_arn in _principals(st)]
    return {"Version": "2012-10-17", "Statement": granted}


def _principals(statement: dict) -> list[str]:
    names = statement.get("Principal", {}).get("AWS", []) if isinstance(statement.get("Principal"), dict) else []
    return names if isinstance(names, list) else [names]


def inventory(client) -> dict[str, set[str]]:
    """Every resource of the kinds infra/ makes that exists now (keys and secrets pending deletion, and
    terminated instances, are on their way out, as on AWS, and not counted)."""
    ec2, kms, sm = client("ec2"), client("kms"), client("secretsmanager")
    out = {
        "vpc": {v["VpcId"] for v in ec2.describe_vpcs()["Vpcs"]},
        "subnet": {s["SubnetId"] for s in ec2.describe_subnets()["Subnets"]},
        "security group": {g["GroupId"] for g in ec2.describe_security_groups()["SecurityGroups"]},
        "internet gateway": {g["InternetGatewayId"] for g in ec2.describe_internet_gateways()["InternetGateways"]},
        "route table": {t["RouteTableId"] for t in ec2.describe_route_tables()["RouteTables"]},
        "vpc endpoint": {e["VpcEndpointId"] for e in ec2.describe_vpc_endpoints()["VpcEndpoints"]
                         if e["State"].lower() not in ("deleted", "deleting")},
        "instance": {i["InstanceId"] for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]
                     if i["State"]["Name"] not in ("terminated", "shutting-down")},
        "role": {r["RoleName"] for r in client("iam").list_roles()["Roles"]},
        "instance profile": {p["InstanceProfileName"] for p in client("iam").list_instance_profiles()["InstanceProfiles"]},
        "function": {f["FunctionName"] for f in client("lambda").list_functions()["Functions"]},
        "bucket": {b["Name"] for b in client("s3").list_buckets()["Buckets"]},
        "log group": {g["logGroupName"] for g in client("logs").describe_log_groups()["logGroups"]},
        "secret": {s["ARN"] for s in sm.list_secrets()["SecretList"] if not s.get("DeletedDate")},
        "kms key": {k["KeyId"] for k in kms.list_keys()["Keys"] if _customer_key(kms, k["KeyId"])},
    }
    return out


EBS_DEFAULT_KEY = "Default master key that protects my EBS volumes when no other key is defined"


def _customer_key(kms, key_id: str) -> bool:
    """A key of the account's own, not pending deletion. AWS makes an AWS-managed key, aws/ebs, for the
    servers' encrypted volumes: free, not deletable, and not ours (moto makes it as a customer key,
    once per instance started at the same moment)."""
    meta = kms.describe_key(KeyId=key_id)["KeyMetadata"]
    return meta["KeyManager"] == "CUSTOMER" and meta["KeyState"] != "PendingDeletion" and \
        meta.get("Description") != EBS_DEFAULT_KEY


def leftovers(before: dict[str, set[str]], after: dict[str, set[str]]) -> list[str]:
    return [f"{kind} {name}" for kind in after for name in sorted(after[kind] - before.get(kind, set()))]
