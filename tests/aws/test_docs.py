"""docs/aws.md is what a user types: its commands are checked against what the servers have."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs" / "aws.md"


def blocks_after(heading_text: str) -> list[list[str]]:
    """The ```bash blocks of docs/aws.md after the paragraph that holds ``heading_text``, each as lines."""
    text = DOCS.read_text()
    start = text.index(heading_text)
    return [b.splitlines() for b in re.findall(r"```bash\n(.*?)```", text[start:], re.S)]


def test_commands_run_on_a_server_use_its_installed_dorylus():
    """On a server, dorylus is in the boot script's venv, /opt/dorylus/bin, which is not on PATH."""
    on_server = blocks_after("On graph server 0")[0]
    commands = [line for line in on_server if re.match(r"\s*\S*dorylus ", line)]
    assert len(commands) >= 2 and all(c.startswith("/opt/dorylus/bin/dorylus ") for c in commands), commands
