"""What one request to the rehearsal's AWS asks of IAM, as AWS would check it: the ``(IAM action,
resource ARN, condition context)`` checks of the request (``checks``, ``s3_checks``) and what they are
judged against beyond the caller's policies (a role's trust policy, a KMS key's own policy).

- S3: the actions of AWS's table for the REST request itself (``s3_requests.py``), and, for a read of
  a key that is not there, ``s3:ListBucket`` on the bucket without a prefix: S3 answers such a read
  with 403 AccessDenied to a caller that may not list the bucket, so code that took a refusal for
  absence fails here as it would on AWS.
- EC2: every resource a request names (instance, VPC, subnet, security group, route table, internet
  gateway, endpoint), each with its ``Project`` tag as ``aws:ResourceTag/Project``; tagging on create
  is ``ec2:CreateTags`` with ``ec2:CreateAction``.
- the other services: the operation's ARN (``resource_of``), ``iam:PassRole`` for a role handed to a
  service, the tagging action AWS checks along with a create call that carries tags.

moto's backends are read for what a check needs (a key's existence, a resource's tags, a key policy),
never changed.
"""

from __future__ import annotations

import json
import re
from urllib.parse import parse_qs, unquote, urlparse

from dorylus_py.rehearsal import s3_requests
from dorylus_py.rehearsal.iam import allowed, decision, statements

ACCOUNT = "123456789012"  # moto's default account
RENAMED = {"lambda:Invoke": "lambda:InvokeFunction"}  # API operation -> IAM action, where they differ


def checks(action: str, resource: str, response, region: str) -> list[tuple[str, str, dict]]:
    """The checks of one request to a service other than S3: its own (per EC2 resource it names),
    iam:PassRole for a role it hands to a service, and the tagging action AWS also checks when it
    creates with tags."""
    action = RENAMED.get(action, action)
    params = _params(response)
    service = action.split(":")[0]
    if service == "ec2" and not action.startswith("ec2:Describe"):
        found = [(action, arn, context) for arn, context in ec2_resources(params, region)] or [(action, "*", {})]
    else:
        if resource == "*" or service == "iam":
            resource = resource_of(service, action, params, _path(response), region)
        found = [(action, resource, {})]
    passed = _passed_role(action, params)
    if passed:
        found.append(("iam:PassRole", passed, {}))
    tagging = _tag_on_create(action, params)
    if tagging:
        context = {"ec2:CreateAction": action.split(":")[1]} if tagging == "ec2:CreateTags" else {}
        found.append((tagging, "*" if tagging in ("kms:TagResource", "ec2:CreateTags") else found[0][1], context))
    return found


def s3_checks(response, bucket: str, key: str, account: str = ACCOUNT) -> list[tuple[str, str, dict]]:
    """The checks of one S3 request (``s3_requests.actions``), and ``s3:ListBucket`` for a read of a
    missing key (the 403 of a caller without it)."""
    query = {k: v[0] for k, v in parse_qs(urlparse(getattr(response, "uri", "") or "").query,
                                           keep_blank_values=True).items()}
    body = getattr(response, "raw_body", None) or getattr(response, "body", None) or b""
    found = s3_requests.actions(response.method, bucket, key, query, dict(response.headers), body)
    if response.method in ("GET", "HEAD") and found[0][0] == "s3:GetObject" and not _s3_object_exists(bucket, key, account):
        found.append(("s3:ListBucket", f"arn:aws:s3:::{bucket}", {}))
    return found


def _s3_object_exists(bucket: str, key: str, account: str) -> bool:
    from moto.s3.models import s3_backends

    try:
        return s3_backends[account]["aws"].get_object(bucket, key) is not None
    except Exception:  # noqa: BLE001  (moto's MissingBucket: S3 answers that one NoSuchBucket itself)
        return True


# --- EC2: the resources a request names, and their tags ----------------------------------------------

EC2_PARAMS = {"InstanceId": "instance", "VpcId": "vpc", "SubnetId": "subnet", "GroupId": "security-group",
              "RouteTableId": "route-table", "InternetGatewayId": "internet-gateway", "VpcEndpointId": "vpc-endpoint",
              "NetworkInterfaceId": "network-interface"}


def ec2_resources(params: dict, region: str, account: str = ACCOUNT) -> list[tuple[str, dict]]:
    """(ARN, context with ``aws:ResourceTag/Project`` if it has that tag) of each existing resource the
    request's parameters name (``InstanceId.1``, ``GroupId``, a route table association's table ...)."""
    from moto.ec2.models import ec2_backends

    backend = ec2_backends[account][region]
    named = []
    for name, value in params.items():
        kind = EC2_PARAMS.get(re.sub(r"\.\d+$", "", name))
        if kind and isinstance(value, str) and value:
            named.append((kind, value))
    if params.get("AssociationId", "").startswith("rtbassoc-"):  # DisassociateRouteTable names the association
        named += [("route-table", t.id) for t in backend.route_tables.values()
                  if any(a["RouteTableAssociationId"] == params["AssociationId"] for a in t.associations)]
    out = []
    for kind, rid in named:
        tag = backend.tags.get(rid, {}).get("Project")
        out.append((f"arn:aws:ec2:{region}:{account}:{kind}/{rid}", {"aws:ResourceTag/Project": tag} if tag else {}))
    return out


# --- KMS: the key's own policy ---------------------------------------------------------------------------


def kms_allows(key_doc: dict | None, policies: list[dict], action: str, key_arn: str, context: dict,
               principal: str) -> bool:
    """A request on a KMS key, as KMS judges it in the key's account: allowed if the key's policy
    ``key_doc`` allows the caller itself, or allows the account (its root) and the caller's IAM
    ``policies`` allow it; never if either denies. Without a key policy (a key unknown here), IAM alone."""
    if key_doc is None:
        return allowed(policies, action, key_arn, context)
    mine = {"Statement": [s for s in statements(key_doc) if _names(s, {principal, role_of(principal), "*"})]}
    account = {"Statement": [s for s in statements(key_doc) if _names(s, {f"arn:aws:iam::{ACCOUNT}:root", ACCOUNT})]}
    direct, via_account, iam = (decision(docs, action, key_arn, context) for docs in ([mine], [account], policies))
    if "deny" in (direct, via_account, iam):
        return False
    return direct == "allow" or (via_account == "allow" and iam == "allow")


def key_policy(key_arn: str) -> dict | None:
    from moto.kms.models import kms_backends

    found = re.fullmatch(r"arn:aws:kms:([\w-]+):(\d+):key/([\w-]+)", key_arn)
    if not found:
        return None
    try:
        return json.loads(kms_backends[found.group(2)][found.group(1)].describe_key(found.group(3)).policy)
    except Exception:  # noqa: BLE001  (moto's NotFound: no such key)
        return None


def role_of(principal: str) -> str:
    """``arn:aws:sts::A:assumed-role/R/session`` -> ``arn:aws:iam::A:role/R``; anything else unchanged."""
    found = re.fullmatch(r"arn:aws:sts::(\d+):assumed-role/([^/]+)/.*", principal)
    return f"arn:aws:iam::{found.group(1)}:role/{found.group(2)}" if found else principal


def _names(statement: dict, principals: set[str]) -> bool:
    who = statement.get("Principal", {})
    if who == "*":
        return True
    names = who.get("AWS", []) if isinstance(who, dict) else []
    return any(n in principals for n in (names if isinstance(names, list) else [names]))


# --- the other services ------------------------------------------------------------------------------


def resource_of(service: str, action: str, params: dict, path: str, region: str) -> str:
    """The ARN a request acts on, from its parameters, for the services our policies scope."""
    name = params.get
    if service == "lambda":
        found = re.search(r"/functions/([^/]+)", path)
        function = unquote(found.group(1)) if found else name("FunctionName", "")
        return _arn("lambda", region, f"function:{function}", function) if function else "*"
    if service == "secretsmanager":
        secret = name("SecretId") or name("Name")
        return _arn("secretsmanager", region, f"secret:{secret}", secret) if secret else "*"
    if service == "kms":
        key = name("KeyId")
        return _arn("kms", region, key if key and key.startswith("alias/") else f"key/{key}", key) if key else "*"
    if service == "logs":
        if action == "logs:DescribeLogGroups":  # AWS does not scope it to a group
            return f"arn:aws:logs:{region}:{ACCOUNT}:log-group:*"
        if name("resourceArn"):
            return name("resourceArn")
        group = name("logGroupName") or name("logGroupNamePrefix")
        return f"arn:aws:logs:{region}:{ACCOUNT}:log-group:{group}" if group else "*"
    if service == "ssm":
        parameter = name("Name") or next(iter(name("Names") or []), "")
        return f"arn:aws:ssm:{region}::parameter{parameter}" if parameter.startswith("/aws/") else \
            _arn("ssm", region, f"parameter/{parameter.lstrip('/')}", parameter) if parameter else "*"
    if service == "iam":
        if name("InstanceProfileName"):
            return f"arn:aws:iam::{ACCOUNT}:instance-profile/{name('InstanceProfileName')}"
        return f"arn:aws:iam::{ACCOUNT}:role/{name('RoleName')}" if name("RoleName") else "*"
    if service == "ecr":
        repo = name("repositoryName")
        return _arn("ecr", region, f"repository/{repo}", repo) if repo else "*"
    return "*"  # sts:GetCallerIdentity and the like: not scoped


def trusted(role_arn: str, principal: str) -> bool:
    """Whether the role's trust policy lets ``principal`` (an IAM user or role session) assume it. Ours
    trust AWS services only, so nobody here can; the rehearsal stands in for EC2 with checks off."""
    from moto.iam.models import iam_backends

    try:
        role = iam_backends[ACCOUNT]["aws"].get_role_by_arn(role_arn)
    except Exception:  # noqa: BLE001  (moto's NotFound: no such role, nobody may assume it)
        return False
    for st in json.loads(role.assume_role_policy_document).get("Statement", []):
        names = st.get("Principal", {}).get("AWS", []) if isinstance(st.get("Principal"), dict) else []
        names = names if isinstance(names, list) else [names]
        if st.get("Effect") == "Allow" and (principal in names or f"arn:aws:iam::{ACCOUNT}:root" in names):
            return True
    return False


def _arn(service: str, region: str, tail: str, given: str) -> str:
    return given if given.startswith("arn:") else f"arn:aws:{service}:{region}:{ACCOUNT}:{tail}"


def _passed_role(action: str, params: dict) -> str:
    """The role ARN an action hands to a service, which AWS checks as iam:PassRole."""
    if action in ("lambda:CreateFunction", "lambda:UpdateFunctionConfiguration") and params.get("Role"):
        return params["Role"]
    if action == "iam:AddRoleToInstanceProfile":
        return f"arn:aws:iam::{ACCOUNT}:role/{params['RoleName']}"
    if action == "ec2:RunInstances":
        profile = params.get("IamInstanceProfile.Name") or params.get("IamInstanceProfile.Arn", "").split("/")[-1]
        if profile:
            from moto.iam.models import iam_backends

            roles = iam_backends[ACCOUNT]["aws"].get_instance_profile(profile).roles
            return roles[0].arn if roles else ""
    return ""


TAG_ON_CREATE = {"iam:CreateRole": "iam:TagRole", "iam:CreateInstanceProfile": "iam:TagInstanceProfile",
                 "lambda:CreateFunction": "lambda:TagResource", "kms:CreateKey": "kms:TagResource",
                 "secretsmanager:CreateSecret": "secretsmanager:TagResource", "logs:CreateLogGroup": "logs:TagResource"}


def _tag_on_create(action: str, params: dict) -> str:
    """The tagging action AWS checks too when a create call carries tags (Terraform's default_tags)."""
    if action.startswith("ec2:") and any(k.startswith("TagSpecification") for k in params):
        return "ec2:CreateTags"
    tagged = params.get("Tags") or params.get("tags") or any(k.startswith("Tags.member") for k in params)
    return TAG_ON_CREATE.get(action, "") if tagged else ""


def _path(response) -> str:
    return urlparse(getattr(response, "uri", "") or "").path or getattr(response, "path", "")


def _params(response) -> dict:
    """The request's parameters: JSON body, form body, or query string (first values)."""
    body = getattr(response, "body", None) or b""
    text = body.decode(errors="replace") if isinstance(body, bytes) else str(body)
    if text.startswith("{"):
        try:
            return json.loads(text)
        except ValueError:
            pass
    flat = {k: v[0] for k, v in parse_qs(text).items()} if "=" in text and not text.startswith("<") else {}
    query = getattr(response, "querystring", {}) or {}
    return flat | {k: (v[0] if isinstance(v, list) and v else v) for k, v in query.items() if k not in flat}
