"""Terraform for the rehearsal: ``infra/`` as it is, copied into a work folder with one file added,
``rehearsal_override.tf``, which gives the provider the operator's keys and points every endpoint at
the moto server. Terraform merges an ``*_override.tf`` file into the configuration; nothing in infra/
changes, and the override never lands there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from dorylus_py.errors import ConfigError

INFRA = Path(__file__).resolve().parents[2] / "infra"
SERVICES = ("ec2", "iam", "lambda", "s3", "secretsmanager", "kms", "sts", "cloudwatchlogs", "ecr", "ssm")
PROVIDER = Path("registry.terraform.io") / "hashicorp" / "aws"
MIRRORS = ("/opt/tf-plugins", "/usr/local/share/terraform/plugins", "/usr/share/terraform/plugins")


def override(url: str, access_key: str, secret_key: str, ca_bundle: str = "") -> str:
    endpoints = "\n".join(f'    {s} = "{url}"' for s in SERVICES)
    trust = f'\n  custom_ca_bundle            = "{ca_bundle}"' if ca_bundle else ""
    return f"""provider "aws" {{
  access_key                  = "{access_key}"
  secret_key                  = "{secret_key}"{trust}
  skip_credentials_validation = true
  skip_requesting_account_id  = true
  skip_metadata_api_check     = true
  s3_use_path_style           = true
  endpoints {{
{endpoints}
  }}
}}
"""


def find_tools(plugin_dir: str = "") -> tuple[str, Path]:
    """terraform's path and a folder holding ``registry.terraform.io/hashicorp/aws`` (a provider
    mirror, unpacked or as ``terraform providers mirror`` packs it: ``plugin_dir``,
    ``$DORYLUS_TF_PLUGIN_DIR`` or a usual place); a one-line error naming what is missing otherwise."""
    terraform = os.environ.get("TERRAFORM") or shutil.which("terraform")
    if not terraform:
        raise ConfigError("the rehearsal needs terraform on PATH (or TERRAFORM=path): not found")
    candidates = [plugin_dir] if plugin_dir else [os.environ.get("DORYLUS_TF_PLUGIN_DIR", ""), *MIRRORS,
                                                  str(Path.home() / ".terraform.d" / "plugins")]
    for folder in filter(None, candidates):
        provider = Path(folder) / PROVIDER
        if any(provider.glob("*/*/terraform-provider-aws*")) or any(provider.glob("terraform-provider-aws_*.zip")):
            return terraform, Path(folder)
    raise ConfigError(f"the rehearsal needs the hashicorp/aws provider for offline use ({PROVIDER} in a folder: "
                      "`terraform -chdir=infra providers mirror ~/.terraform.d/plugins` where the registry can be "
                      f"reached), in --plugin-dir or DORYLUS_TF_PLUGIN_DIR; none in {', '.join(filter(None, candidates))}")


def find_aws_cli() -> str:
    """The AWS CLI, which the rehearsal runs docs/aws.md's ``aws`` commands with."""
    found = shutil.which("aws")
    if not found:
        raise ConfigError("the rehearsal needs the AWS CLI (`aws`) on PATH, as docs/aws.md does: not found")
    return found


class Terraform:
    """``infra/`` copied into the folder ``checkout`` (a checkout's layout: docs/aws.md's ``terraform
    -chdir=infra`` runs there), with the override; every command's output goes to ``log``. ``env``: what
    Terraform runs with (also for the guide's own ``terraform`` commands)."""

    def __init__(self, terraform: str, checkout: Path, url: str, keys: tuple[str, str], ca_bundle: str, log: Path):
        self.terraform, self.dir, self.log = terraform, checkout / "infra", log
        shutil.copytree(INFRA, self.dir, ignore=shutil.ignore_patterns(".terraform*", "*.tfstate*", "*.tfvars",
                                                                       "backend.tf", "tf.json"))
        (self.dir / "rehearsal_override.tf").write_text(override(url, *keys, ca_bundle))
        rc = log.parent / "terraformrc"
        rc.write_text("")  # no user CLI configuration, no credentials helper
        self.env = {**os.environ, "TF_CLI_CONFIG_FILE": str(rc), "TF_IN_AUTOMATION": "1", "CHECKPOINT_DISABLE": "1",
                    "PATH": f"{Path(terraform).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        for name in ("AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
            self.env.pop(name, None)  # only the override's keys: the operator's

    def run(self, *args: str, timeout_s: float = 300, stdin: str | None = None) -> str:
        with open(self.log, "a") as log:
            log.write(f"\n$ terraform {' '.join(args)}\n")
            log.flush()
            proc = subprocess.run([self.terraform, *args], cwd=self.dir, env=self.env | {"TF_INPUT": "0"}, stdout=subprocess.PIPE,
                                  stderr=log, text=True, timeout=timeout_s, check=False, input=stdin)
            log.write(proc.stdout)
        if proc.returncode:
            raise ConfigError(f"terraform {args[0]} failed (exit {proc.returncode}); see {self.log}")
        return proc.stdout

    def init(self, plugin_dir: Path) -> None:
        self.run("init", "-backend=false", f"-plugin-dir={plugin_dir}", "-no-color")

    def apply(self, variables: dict[str, str]) -> None:
        self.run("apply", "-auto-approve", "-no-color", *_vars(variables))

    def plan(self, variables: dict[str, str]) -> dict:
        """``terraform plan`` of ``variables``, as ``terraform show -json`` gives it (what apply would make)."""
        self.run("plan", "-no-color", "-out=rehearsal.tfplan", *_vars(variables))
        return json.loads(self.run("show", "-json", "-no-color", "rehearsal.tfplan"))

    def evaluate(self, expression: str, variables: dict[str, str]) -> object:
        """An expression over the configuration's variables and locals (``terraform console``, no state)."""
        return json.loads(json.loads(self.run("console", *_vars(variables), stdin=f"jsonencode({expression})\n")))

    def output(self) -> dict:
        return json.loads(self.run("output", "-json", "-no-color"))


def _vars(variables: dict[str, str]) -> list[str]:
    return [f"-var={k}={v}" for k, v in variables.items()]
