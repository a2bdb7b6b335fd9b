"""AWS on loopback: a moto server that checks every request against the caller's IAM policies, as
AWS would, and records each check.

moto checks the signature and finds the caller (an IAM user's key, or a role's STS credentials), but
its own policy check knows the resource of S3 and IAM requests only: a statement scoped to one Lambda
function or one secret never matches, and a condition denies outright. Here moto's check is replaced
by ``iam.allowed`` on the resource each request names (``resource_of``), with the condition keys our
policies use; ``lambda:CreateFunction`` and ``ec2:RunInstances`` also check ``iam:PassRole`` on the
role they hand over, as AWS does. Resource policies (bucket, KMS key, VPC endpoint) are not
evaluated: on AWS they are a second gate, never a way around the first. Every check, allowed or
not, lands in ``calls``, so a run can be compared with the policies afterwards.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlparse

from dorylus_py.rehearsal.iam import allowed

ACCOUNT = "123456789012"  # moto's default account
RENAMED = {"lambda:Invoke": "lambda:InvokeFunction"}  # API operation -> IAM action, where they differ


@dataclass(frozen=True)
class Call:
    principal: str  # the caller's ARN: an IAM user, or an assumed role's session
    action: str  # IAM action, e.g. lambda:InvokeFunction
    resource: str  # ARN, or "*" for actions AWS does not scope to resources
    allowed: bool


class MotoAws:
    """``start()`` a moto server on 127.0.0.1 (any free port); ``enforce(True)`` makes every request
    pass ``iam.allowed``; ``calls`` lists every check. One per process: moto's state is global."""

    def __init__(self):
        self.url = ""
        self.calls: list[Call] = []
        self._lock = threading.Lock()
        self._server = None
        self._saved: dict = {}

    def start(self) -> str:
        import requests
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.url = f"http://{host}:{port}"
        requests.post(f"{self.url}/moto-api/reset", timeout=10).raise_for_status()
        requests.post(f"{self.url}/moto-api/config", json={"lambda": {"use_docker": False}}, timeout=10)
        self._patch()
        return self.url

    def enforce(self, on: bool) -> None:
        import requests

        requests.post(f"{self.url}/moto-api/reset-auth", data=b"0" if on else b"inf", timeout=10).raise_for_status()

    def record(self, call: Call) -> None:
        with self._lock:
            self.calls.append(call)

    def stop(self) -> None:
        if self._server is not None:
            self.enforce(False)
            self._server.stop()
            self._server = None
        self._unpatch()

    # --- moto's check, replaced ----------------------------------------------------------------

    def _patch(self) -> None:
        from moto.core.authorization import ActionAuthenticatorMixin as Mixin
        from moto.iam.access_control import IAMPolicy, IAMRequest, S3IAMRequest

        moto_aws, current = self, threading.local()

        def decide(request, resource: str) -> None:
            key = request._access_key
            policies = [IAMPolicy(p)._policy_json for p in key.collect_policies()]
            for action, res, context in checks(request._action, resource, current.response, request._region):
                ok = action == "sts:GetCallerIdentity" or allowed(policies, action, res, context)
                moto_aws.record(Call(key.arn, action, res, ok))
                if not ok:
                    request._raise_access_denied()

        class Checked(IAMRequest):
            check_action_permitted = decide

            def _create_aws_request(self):  # a GET signs an empty body; moto adds its URL parameters
                request = super()._create_aws_request()
                if self._method in ("GET", "HEAD", "DELETE"):
                    request.data = self._body or b""
                return request

        class CheckedS3(S3IAMRequest):
            check_action_permitted = decide

        def normal(response, resource: str = "*") -> None:
            current.response = response
            response._authenticate_and_authorize_action(Checked, resource)

        def s3(response, bucket_name: str | None = None, key_name: str | None = None) -> None:
            current.response = response
            arn = f"{bucket_name or '*'}/{key_name}" if key_name else (bucket_name or "*")
            response._authenticate_and_authorize_action(CheckedS3, f"arn:aws:s3:::{arn}")

        self._saved = {"_authenticate_and_authorize_normal_action": Mixin._authenticate_and_authorize_normal_action,
                       "_authenticate_and_authorize_s3_action": Mixin._authenticate_and_authorize_s3_action}
        Mixin._authenticate_and_authorize_normal_action = normal
        Mixin._authenticate_and_authorize_s3_action = s3

    def _unpatch(self) -> None:
        from moto.core.authorization import ActionAuthenticatorMixin as Mixin

        for name, fn in self._saved.items():
            setattr(Mixin, name, fn)
        self._saved = {}


# --- what each request asks for ---------------------------------------------------------------


def checks(action: str, resource: str, response, region: str) -> list[tuple[str, str, dict]]:
    """The (IAM action, resource ARN, condition context) checks one request needs."""
    action = RENAMED.get(action, action)
    params = _params(response)
    context = {}
    service = action.split(":")[0]
    if service == "s3":
        if "prefix" in params:
            context["s3:prefix"] = params["prefix"]
    elif resource == "*":
        resource = resource_of(service, params, _path(response), region)
    found = [(action, resource, context)]
    passed = _passed_role(action, params)
    if passed:
        found.append(("iam:PassRole", passed, {}))
    return found


def resource_of(service: str, params: dict, path: str, region: str) -> str:
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
    return "*"  # ec2 and sts:GetCallerIdentity: not scoped here


def _arn(service: str, region: str, tail: str, given: str) -> str:
    return given if given.startswith("arn:") else f"arn:aws:{service}:{region}:{ACCOUNT}:{tail}"


def _passed_role(action: str, params: dict) -> str:
    """The role ARN an action hands to a service, which AWS checks as iam:PassRole."""
    if action in ("lambda:CreateFunction", "lambda:UpdateFunctionConfiguration") and params.get("Role"):
        return params["Role"]
    if action == "ec2:RunInstances":
        profile = params.get("IamInstanceProfile.Name") or params.get("IamInstanceProfile.Arn", "").split("/")[-1]
        if profile:
            from moto.iam.models import iam_backends

            roles = iam_backends[ACCOUNT]["aws"].get_instance_profile(profile).roles
            return roles[0].arn if roles else ""
    return ""


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
