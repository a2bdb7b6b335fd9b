"""The job key: the 32-byte HMAC key every message of a job is signed with (``protocol/session.py``).

Where a process finds it, first match wins:

1. ``DORYLUS_KEY``: the key in hex. The driver of a one-machine job makes a fresh key and hands it to
   the processes it starts this way (and the local Lambda emulator's workers inherit it); in a
   multi-machine job without AWS, export the same value everywhere (``dorylus keys gen`` writes one).
2. A secret in AWS Secrets Manager, named by ``DORYLUS_KEY_SECRET`` (the Lambda function's
   environment) or by the cluster file's ``key_secret`` (servers and driver): read once at start
   through the process's IAM role. Its value is written by ``dorylus aws put-secret``, outside
   Terraform, so the key is in no state file, user data, output or event payload.

The key is never printed, logged or sent; only MACs made with it travel (and the CurveZMQ client key
derived from it, ``protocol/zap.py``).
"""

from __future__ import annotations

import os
import secrets

from dorylus_py.errors import ConfigError

KEY_ENV = "DORYLUS_KEY"
SECRET_ENV = "DORYLUS_KEY_SECRET"
KEY_BYTES = 32


def new_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def key_from_text(text: str, where: str) -> bytes:
    """The key in ``text`` (hex, at least 32 digits), or a one-line error naming ``where`` it came from."""
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        raise ConfigError(f"{where}: the job key must be hex digits (make one with `dorylus keys gen DIR`)") from None
    if len(key) < 16:
        raise ConfigError(f"{where}: the job key has {len(key)} bytes; at least 16 are needed (32 recommended)")
    return key


def load_job_key(key_secret: str = "", region: str = "", environ=None) -> bytes:
    """The job key from ``DORYLUS_KEY``, else from the Secrets Manager secret ``DORYLUS_KEY_SECRET`` or
    ``key_secret`` (see the module docstring)."""
    env = os.environ if environ is None else environ
    if env.get(KEY_ENV):
        return key_from_text(env[KEY_ENV], f"environment variable {KEY_ENV}")
    secret_id = env.get(SECRET_ENV) or key_secret
    if secret_id:
        return read_secret(secret_id, region)
    raise ConfigError(f"no job key: set {KEY_ENV} (hex; the same on every machine), or name a Secrets Manager "
                      f"secret in {SECRET_ENV} or in the cluster file's key_secret")


def _client(region: str = "", profile: str = ""):
    try:
        import boto3
    except ImportError:
        raise ConfigError("reading the job key from Secrets Manager needs boto3: pip install 'dorylus-py[aws]'") from None
    return boto3.Session(profile_name=profile or None, region_name=region or None).client("secretsmanager")


def _error(e, secret_id: str) -> ConfigError:
    code = getattr(e, "response", {}).get("Error", {}).get("Code", type(e).__name__)
    if code == "ResourceNotFoundException":
        return ConfigError(f"secret {secret_id}: not found, or no value stored yet (run `dorylus aws put-secret "
                           f"--secret-id {secret_id}`)")
    if code in ("AccessDeniedException", "AccessDenied"):
        return ConfigError(f"secret {secret_id}: access denied (this machine's IAM role must allow "
                           "secretsmanager:GetSecretValue on it; see infra/iam.tf)")
    return ConfigError(f"secret {secret_id}: {code}")


def read_secret(secret_id: str, region: str = "") -> bytes:
    """The job key stored in ``secret_id`` (name or ARN), through this process's AWS credentials."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        value = _client(region).get_secret_value(SecretId=secret_id).get("SecretString") or ""
    except (ClientError, BotoCoreError) as e:
        raise _error(e, secret_id) from None
    return key_from_text(value, f"secret {secret_id}")


def put_secret(secret_id: str, region: str = "", profile: str = "") -> str:
    """Store a new random job key in ``secret_id``; return the new version's id (the key is not returned:
    nobody needs to see it). Processes already running keep the key they read at start."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        resp = _client(region, profile).put_secret_value(SecretId=secret_id, SecretString=new_key().hex())
    except (ClientError, BotoCoreError) as e:
        raise _error(e, secret_id) from None
    return resp.get("VersionId", "")
