"""docs/aws.md is what a user types: its commands are the rehearsal's steps, in the same order, and the
ones run on a server use what the boot script installed."""

from __future__ import annotations

import re
from pathlib import Path

from dorylus_py.rehearsal.run import NOT_REHEARSED, STEPS, Rehearsal

DOCS = Path(__file__).resolve().parents[2] / "docs" / "aws.md"


def blocks_after(heading_text: str) -> list[list[str]]:
    """The ```bash blocks of docs/aws.md after the paragraph that holds ``heading_text``, each as lines."""
    text = DOCS.read_text()
    start = text.index(heading_text)
    return [b.splitlines() for b in re.findall(r"```bash\n(.*?)```", text[start:], re.S)]


def commands() -> list[str]:
    """Every command of docs/aws.md's bash blocks, in order: continuation lines joined, ``a && b`` split,
    comments dropped."""
    out = []
    for block in blocks_after("# Running on AWS"):
        for line in "\n".join(block).replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#[^'\"]*$", "", line).strip()
            out += [part.strip() for part in line.split(" && ") if part.strip()]
    return out


def test_the_docs_commands_are_the_rehearsals_steps_in_order():
    rehearsed = [c for c in commands() if not c.startswith(tuple(NOT_REHEARSED))]
    steps = [next((s for s in STEPS if c.startswith(s)), f"not rehearsed: {c}") for c in rehearsed]
    assert steps == list(STEPS)


def test_the_rehearsal_applies_with_the_docs_variables():
    apply = next(c for c in commands() if c.startswith("terraform apply"))
    destroy = next(c for c in commands() if c.startswith("terraform destroy"))
    assert set(re.findall(r"-var (\w+)=", apply)) == set(Rehearsal.VARIABLES)
    assert set(re.findall(r"-var (\w+)=", destroy)) <= set(Rehearsal.VARIABLES)


def test_commands_run_on_a_server_use_its_installed_dorylus():
    """On a server, dorylus is in the boot script's venv, /opt/dorylus/bin, which is not on PATH."""
    on_server = blocks_after("On graph server 0")[0]
    commands_there = [line for line in on_server if re.match(r"\s*\S*dorylus ", line)]
    assert len(commands_there) >= 2 and all(c.startswith("/opt/dorylus/bin/dorylus ") for c in commands_there)
