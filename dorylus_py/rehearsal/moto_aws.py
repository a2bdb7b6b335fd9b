"""AWS on loopback: a moto server that checks every request against the caller's IAM policies, as
AWS would, and records each check.

moto checks the signature and finds the caller (an IAM user's key, or a role's STS credentials), but
its own policy check knows the resource of S3 and IAM requests only: a statement scoped to one Lambda
function or one secret never matches, and a condition denies outright. Here moto's check is replaced
by ``iam.allowed`` on the resource each request names (``resource_of``), with the condition keys our
policies use; handing a role to a service also checks ``iam:PassRole``, creating with tags the
service's tagging action, and ``sts:AssumeRole`` the role's trust policy, as AWS does. Of the
resource policies, the bucket's is evaluated (moto's own check denies whenever a condition is
present); the KMS key's and the VPC endpoint's are not. Every check, allowed or not, lands in
``calls``, so a run can be compared with the policies afterwards.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

from dorylus_py.rehearsal.iam import allowed, decision

ACCOUNT = "123456789012"  # moto's default account
RENAMED = {"lambda:Invoke": "lambda:InvokeFunction"}  # API operation -> IAM action, where they differ


@dataclass(frozen=True)
class Call:
    principal: str  # the caller's ARN: an IAM user, or an assumed role's session
    action: str  # IAM action, e.g. lambda:InvokeFunction
    resource: str  # ARN, or "*" for actions AWS does not scope to resources
    allowed: bool
    context: dict = field(default_factory=dict, compare=False)  # condition keys, e.g. s3:prefix


class MotoAws:
    """``start()`` a moto server on 127.0.0.1 (any free port); ``enforce(True)`` makes every request
    pass ``iam.allowed``; ``calls`` lists every check. One per process: moto's state is global.

    With ``tls_dir``, it serves HTTPS with a certificate made for 127.0.0.1 (``ca_bundle``, for
    ``AWS_CA_BUNDLE``): the bucket's ``aws:SecureTransport`` condition then holds, as it does on AWS."""

    def __init__(self, tls_dir: Path | None = None):
        self.url, self.ca_bundle, self.tls_dir = "", "", tls_dir
        self.calls: list[Call] = []
        self._lock = threading.Lock()
        self._server = None
        self._thread = None
        self._saved: dict = {}

    def start(self) -> str:
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        ssl_context = self._certificate() if self.tls_dir else None
        self._server = make_server("127.0.0.1", 0, DomainDispatcherApplication(create_backend_app), threaded=True,
                                   request_handler=MotoRequestHandler, ssl_context=ssl_context)
        self._thread = threading.Thread(target=self._server.serve_forever, name="moto", daemon=True)
        self._thread.start()
        self.url = f"{'https' if ssl_context else 'http'}://127.0.0.1:{self._server.server_address[1]}"
        self._api("reset")
        self._api("config", json={"lambda": {"use_docker": False}})
        self._patch()
        return self.url

    def _api(self, what: str, **kw) -> None:
        import requests

        requests.post(f"{self.url}/moto-api/{what}", timeout=10, verify=self.ca_bundle or True, **kw).raise_for_status()

    def _certificate(self) -> tuple[str, str]:
        """A self-signed certificate for 127.0.0.1, valid for a day; its file is the CA bundle."""
        import datetime
        import ipaddress

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dorylus rehearsal")])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                            x509.DNSName("localhost")]), critical=False)
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .sign(key, hashes.SHA256()))
        self.tls_dir.mkdir(parents=True, exist_ok=True)
        cert_path, key_path = self.tls_dir / "moto.pem", self.tls_dir / "moto.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        self.ca_bundle = str(cert_path)
        return str(cert_path), str(key_path)

    def enforce(self, on: bool) -> None:
        self._api("reset-auth", data=b"0" if on else b"inf")

    def record(self, call: Call) -> None:
        with self._lock:
            self.calls.append(call)

    def stop(self) -> None:
        if self._server is not None:
            self.enforce(False)
            self._server.shutdown()
            self._thread.join(10)
            self._server = None
        self._unpatch()

    # --- moto's check, replaced ----------------------------------------------------------------

    def _patch(self) -> None:
        from moto.core.authorization import ActionAuthenticatorMixin as Mixin
        from moto.iam.access_control import (
            IAMPolicy,
            IAMRequest,
            PermissionResult,
            S3IAMRequest,
        )
        from moto.s3.models import FakeBucket

        moto_aws, current = self, threading.local()

        def decide(request, resource: str) -> None:
            key = request._access_key
            policies = [IAMPolicy(p)._policy_json for p in key.collect_policies()]
            for action, res, context in checks(request._action, resource, current.response, request._region):
                ok = action == "sts:GetCallerIdentity" or allowed(policies, action, res, context)
                if ok and action == "sts:AssumeRole":
                    ok = trusted(res, key.arn)
                moto_aws.record(Call(key.arn, action, res, ok, context))
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

        secure = "true" if self.tls_dir else "false"

        def bucket_policy(bucket, action: str, resource: str):
            """The bucket policy's verdict, conditions evaluated (moto denies whenever one is present)."""
            if bucket.policy is None:
                return PermissionResult.NEUTRAL
            verdict = decision([json.loads(bucket.policy)], action, resource, {"aws:SecureTransport": secure})
            return {"deny": PermissionResult.DENIED, "allow": PermissionResult.PERMITTED}.get(verdict,
                                                                                              PermissionResult.NEUTRAL)

        self._saved = {(Mixin, "_authenticate_and_authorize_normal_action"): Mixin._authenticate_and_authorize_normal_action,
                       (Mixin, "_authenticate_and_authorize_s3_action"): Mixin._authenticate_and_authorize_s3_action,
                       (FakeBucket, "get_permission"): FakeBucket.get_permission}
        Mixin._authenticate_and_authorize_normal_action = normal
        Mixin._authenticate_and_authorize_s3_action = s3
        FakeBucket.get_permission = bucket_policy

    def _unpatch(self) -> None:
        for (cls, name), fn in self._saved.items():
            setattr(cls, name, fn)
        self._saved = {}


# --- what each request asks for ---------------------------------------------------------------


def checks(action: str, resource: str, response, region: str) -> list[tuple[str, str, dict]]:
    """The (IAM action, resource ARN, condition context) checks one request needs: its own, iam:PassRole
    for a role it hands to a service, and the tagging action AWS also checks when it creates with tags."""
    action = RENAMED.get(action, action)
    params = _params(response)
    context = {}
    service = action.split(":")[0]
    if service == "s3":
        if "prefix" in params:
            context["s3:prefix"] = params["prefix"]
    elif resource == "*" or service == "iam":
        resource = resource_of(service, action, params, _path(response), region)
    found = [(action, resource, context)]
    passed = _passed_role(action, params)
    if passed:
        found.append(("iam:PassRole", passed, {}))
    tagging = _tag_on_create(action, params)
    if tagging:
        found.append((tagging, "*" if tagging in ("kms:TagResource", "ec2:CreateTags") else resource, {}))
    return found


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
    return "*"  # ec2 and sts:GetCallerIdentity: not scoped here


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
