"""docs/aws.md's commands as a user types them: read from its ```bash blocks (continuation lines joined,
comments dropped, ``a && b`` split), and run as written, each in ``bash`` with the shell variables it
uses set as the guide set them before it (their lines run first: ``REGION=...``, ``ACCOUNT=$(aws sts
...)``). The rehearsal runs sections 1 and 5 this way; tests/aws/test_docs.py holds every command to a
rehearsal step or a reason it is not one.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from dorylus_py import children
from dorylus_py.errors import DorylusError

DOCS = Path(__file__).resolve().parents[2] / "docs" / "aws.md"
ASSIGNMENT = re.compile(r"^([A-Z][A-Z0-9_]*)=(\S.*)$")

JOBS = 2  # two jobs on the same servers: each unit restarts its server after a job (Restart=always)
# docs/aws.md's commands, in its order: the rehearsal runs each (and checks it ran them in this order);
# tests/aws/test_docs.py holds the docs to this list. Steps of its own are named "(rehearsal) ...".
STEPS = ("dorylus aws build-context", "pip wheel --no-deps -w dist .", "terraform init", "terraform apply",
         "terraform output -json > tf.json", "dorylus aws cluster-file", "dorylus aws put-secret", "dorylus prepare",
         *("sudo systemd-run", "/opt/dorylus/bin/dorylus report") * JOBS,
         "terraform -chdir=infra apply -target=aws_s3_bucket.data", "terraform -chdir=infra destroy")
# docs/aws.md's commands it does not run, and why.
NOT_REHEARSED = {
    "REGION=": "a shell variable", "ACCOUNT=": "a shell variable (set, where a command uses it)",
    "REPO=": "a shell variable", "ARN=": "a shell variable", "ID=": "a shell variable", "IP=": "a shell variable",
    "cd ": "a folder change", "dorylus aws rehearse": "the rehearsal itself",
    "aws ecr": "no ECR here: the image is not built (no container engine); its packages are tested in "
               "tests/aws/test_lambda_image.py", "docker": "no container engine here",
    "scp ": "the rehearsal writes the cluster file onto graph server 0's folder",
    "aws iam": "the rehearsal makes the operator's managed policy and attaches it, as these commands do",
    "aws ec2-instance-connect": "no instance to log in to: the driver runs in graph server 0's folder",
    "ssh ": "the same", "sudo journalctl": "no journal here: the job's output goes to its log file",
    "aws lambda": "a quota, AWS's only", "aws service-quotas": "a quota, AWS's only",
    "aws freetier": "an account's plan, AWS's only", "aws budgets": "an account's budget, made before a deployment",
    "terraform -chdir=infra output -json servers": "restarting every server over SSH (no SSH here); the output "
                                                   "itself is checked by the rehearsal", "done": "the same loop",
    "aws s3api create-bucket": "remote state, optional: tests/aws/test_rehearsal.py runs these four commands",
    "aws s3api put-bucket-versioning": "the same", "cp infra/backend-s3.tf.example": "the same",
    "terraform -chdir=infra init": "the same",
}
# What a guide command must print, where the guide promises it.
PROMISED = {"terraform -chdir=infra apply -target=aws_s3_bucket.data": "Resources: 0 added, 1 changed, 0 destroyed."}


def blocks(after: str = "# Running on AWS", docs: Path = DOCS) -> list[str]:
    """The ```bash blocks of docs/aws.md after the first line that holds ``after``, in order."""
    text = docs.read_text()
    return re.findall(r"```bash\n(.*?)```", text[text.index(after):], re.S)


def commands(block: str) -> list[str]:
    """A block's commands: continuation lines joined, comments dropped, ``a && b`` split."""
    out = []
    for line in block.replace("\\\n", " ").splitlines():
        line = re.sub(r"\s+#[^'\"]*$", "", line).strip()
        out += [part.strip() for part in line.split(" && ") if part.strip() and not part.startswith("#")]
    return out


def every_command(docs: Path = DOCS) -> list[str]:
    return [c for b in blocks(docs=docs) for c in commands(b)]


def prelude(command: str, before: list[str]) -> list[str]:
    """The assignments among ``before`` (the guide's commands up to ``command``) that ``command`` needs,
    directly or through another assignment, in the guide's order (the last of each name)."""
    assignments = {}
    for c in before:
        found = ASSIGNMENT.match(c)
        if found:
            assignments[found.group(1)] = c
    needed, todo = set(), [command]
    while todo:
        for name in re.findall(r"\$\{?([A-Z][A-Z0-9_]*)", todo.pop()):
            if name in assignments and name not in needed:
                needed.add(name)
                todo.append(assignments[name])
    return [c for c in before if ASSIGNMENT.match(c) and ASSIGNMENT.match(c).group(1) in needed
            and assignments[ASSIGNMENT.match(c).group(1)] == c]


def section(heading: str, docs: Path = DOCS) -> tuple[list[str], list[str]]:
    """(the guide's commands before the section ``heading``, the section's own commands)."""
    text = docs.read_text()
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    before = [c for b in re.findall(r"```bash\n(.*?)```", text[:start], re.S) for c in commands(b)]
    own = [c for b in re.findall(r"```bash\n(.*?)```", text[start:end if end > 0 else len(text)], re.S)
           for c in commands(b)]
    return before, own


def run(command: str, before: list[str], cwd: Path, env: dict[str, str], log: Path, timeout_s: float = 900) -> str:
    """``command`` in bash, after the assignments it needs; "yes" on its input (Terraform's confirmation);
    the Pythons it starts (``dorylus``, ``aws``) keep the working folder off their path (``children.env``);
    its output goes to ``log`` and is returned. A non-zero exit is an error naming the log."""
    script = "\n".join(["set -euo pipefail", *prelude(command, before), command])
    with open(log, "a") as out:
        out.write(f"\n$ {command}\n")
        out.flush()
        try:
            proc = subprocess.run(["bash", "-c", script], cwd=cwd, env=children.env(env), input="yes\n",
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout_s,
                                  check=False)
        except subprocess.TimeoutExpired:
            raise DorylusError(f"{command[:60]}: still running after {timeout_s:.0f} s; see {log}") from None
        out.write(proc.stdout)
    if proc.returncode:
        raise DorylusError(f"docs/aws.md's `{command[:70]}` failed (exit {proc.returncode}); see {log}")
    return proc.stdout
