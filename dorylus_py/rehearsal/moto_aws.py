"""AWS on loopback: a moto server that checks every request against the caller's IAM policies, as
AWS would, and records each check.

moto checks the signature and finds the caller (an IAM user's key, or a role's STS credentials), but
its own policy check knows the resource of S3 and IAM requests only: a statement scoped to one Lambda
function or one secret never matches, and a condition denies outright. Here moto's check is replaced
by ``iam.allowed`` on the checks each request needs (``checks.py``: S3's actions read from the request
itself, each EC2 resource with its tags, the resource of the others, ``iam:PassRole``, tagging on
create), ``sts:AssumeRole`` judged by the role's trust policy and a KMS key's use by its key policy, as
AWS does. Of the other resource policies, the bucket's is evaluated (moto's own check denies whenever a
condition is present); the VPC endpoint's is not. Every check, allowed or not, lands in ``calls``, so a
run can be compared with the policies afterwards. moto's internals this needs are few and named in
``_patch``; tests/aws/test_moto_iam.py fails, naming them, when a moto release changes one.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

from dorylus_py.rehearsal.checks import ACCOUNT, checks, key_policy, kms_allows, s3_checks, trusted
from dorylus_py.rehearsal.iam import allowed, decision

__all__ = ["ACCOUNT", "Call", "MotoAws"]


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
            found = current.checks or checks(request._action, resource, current.response, request._region)
            for action, res, context in found:
                if action.startswith("kms:") and res.startswith("arn:aws:kms:"):
                    ok = kms_allows(key_policy(res), policies, action, res, context, key.arn)
                else:
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
            current.response, current.checks = response, None
            response._authenticate_and_authorize_action(Checked, resource)

        def s3(response, bucket_name: str | None = None, key_name: str | None = None) -> None:
            current.response = response  # S3's actions from the request itself, not moto's names for them
            current.checks = s3_checks(response, bucket_name or "", key_name or "", response.current_account)
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
