"""Making the keys of a multi-machine job (where a process finds the job key at run time is ``jobkey.py``): the
commands ``dorylus keys gen DIR`` and ``dorylus aws put-secret``.

``keys gen`` writes a CurveZMQ key pair for the servers (``server.key``, public, whose key goes into
the cluster file's ``curve_public_key``; ``server.key_secret``, copied to each server machine and
named by the cluster file's ``curve_secret_key_file``) and a job key (``job.key``, exported as
``DORYLUS_KEY`` on every machine). The folder is readable by its owner only. On AWS the job key lives
in Secrets Manager instead (``aws put-secret``); see docs/aws.md.
"""

from __future__ import annotations

import os
from pathlib import Path

from dorylus_py.atomic import atomic_dir, check_replaceable
from dorylus_py.errors import ConfigError
from dorylus_py.jobkey import new_key

PUBLIC, SECRET, JOB = "server.key", "server.key_secret", "job.key"


def generate(out: Path, overwrite: bool = False) -> bytes:
    """Write a server key pair and a job key into ``out`` (mode 0700, secrets 0600); return the public key."""
    import zmq.auth

    check_replaceable(out, {PUBLIC, SECRET, JOB}, overwrite, "its keys")
    if not out.parent.exists():
        raise ConfigError(f"{out.parent}: folder does not exist")
    with atomic_dir(out, {PUBLIC, SECRET, JOB}) as staging:  # mkdtemp: mode 0700 from the start
        zmq.auth.create_certificates(staging, "server")
        (staging / JOB).write_text(new_key().hex() + "\n")
        for name in (SECRET, JOB):
            os.chmod(staging / name, 0o600)
        public, _ = zmq.auth.load_certificate(staging / PUBLIC)
    return public


def load_curve_secret(path: str, public: str) -> bytes:
    """The secret key in ``path`` (a ``server.key_secret``), checked to belong to ``public``."""
    import zmq.auth

    try:
        got_public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: cannot read a CurveZMQ secret key ({e}); make one with `dorylus keys gen DIR`") from None
    if not secret:
        raise ConfigError(f"{path}: holds no secret key (the server.key_secret file, not server.key)")
    if got_public.decode() != public:
        raise ConfigError(f"{path}: belongs to another key pair than the cluster file's curve_public_key")
    return secret


# --- commands ------------------------------------------------------------------------------------


def add_keys_command(sub, command) -> None:
    p = command(sub, "keys", "make the keys of a multi-machine job (CurveZMQ encryption, message signing)")
    keys = p.add_subparsers(title="keys commands", metavar="KEYS_COMMAND", required=True)
    g = command(keys, "gen", "write a CurveZMQ server key pair and a job key into DIR (readable by you only)",
                epilog="Then: put server.key's public key into the cluster file as curve_public_key; copy "
                "server.key_secret to every server machine and name it in curve_secret_key_file; export "
                "DORYLUS_KEY=$(cat DIR/job.key) on every machine. See the README's multi-machine section.")
    g.add_argument("dir", metavar="DIR", help="folder to write (must be empty unless --overwrite)")
    g.add_argument("--overwrite", action="store_true", help="replace the keys in DIR")
    g.set_defaults(run=_run_gen)


def add_put_secret_command(aws_sub, command) -> None:
    p = command(aws_sub, "put-secret", "store a new random job key in the Secrets Manager secret made by infra/ "
                "(run from your machine, after terraform apply; the key is never printed)",
                epilog="Servers and the Lambda read the key when they start: after a new key, restart the servers "
                "(sudo systemctl restart dorylus) or wait for their next start.")
    p.add_argument("--secret-id", required=True, help="the secret's ARN or name (terraform output -raw job_key_secret)")
    p.add_argument("--region", default="", help="AWS region (default: from the AWS environment)")
    p.add_argument("--profile", default="", help="AWS credentials profile (default: from the AWS environment)")
    p.set_defaults(run=_run_put_secret)


def _run_gen(args) -> int:
    out = Path(args.dir)
    public = generate(out, args.overwrite)
    print(f"wrote {out}/{PUBLIC}, {out}/{SECRET} and {out}/{JOB}\n"
          f'cluster file: "curve_public_key": "{public.decode()}", "curve_secret_key_file": "{out.resolve() / SECRET}"\n'
          f"every machine: export DORYLUS_KEY=$(cat {out / JOB})")
    return 0


def _run_put_secret(args) -> int:
    from dorylus_py.jobkey import put_secret

    version = put_secret(args.secret_id, args.region, args.profile)
    print(f"stored a new job key in {args.secret_id} (version {version}); processes read it when they start")
    return 0
