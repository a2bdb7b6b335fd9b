"""Every relative link in the README, docs/*.md and the component READMEs points at a file that exists,
and every ``#anchor`` at a heading of its target, as GitHub names headings: pages move often (the
README's sections went to docs/ once), and a link that silently leads nowhere is how docs stop being true.
Links inside code blocks and code spans are text, not links; ``http(s)://`` and ``mailto:`` are not
checked (no network here)."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md"), *REPO.glob("*/README.md")])
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def unfenced(text: str) -> list[str]:
    """The lines of ``text``, those of fenced code blocks (fences included) blanked out."""
    lines, fenced = [], False
    for line in text.splitlines():
        fence = FENCE.match(line)
        fenced ^= bool(fence)
        lines.append("" if fence or fenced else line)
    return lines


def prose(text: str) -> list[str]:
    """The lines of ``text`` outside fenced code blocks, with inline code spans blanked out."""
    return [re.sub(r"(`+)(?:(?!\1).)+\1", "``", line) for line in unfenced(text)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: links become their text, then lower case, punctuation
    dropped (letters, digits, ``_``, ``-`` and spaces kept), spaces turned into hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(page: Path) -> set[str]:
    """Every heading's anchor in ``page``, repeats numbered ``-1``, ``-2`` ... as GitHub numbers them."""
    seen: dict[str, int] = {}
    out = set()
    for line in unfenced(page.read_text()):
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            out.add(base if base not in seen else f"{base}-{seen[base]}")
            seen[base] = seen.get(base, 0) + 1
    return out


def links(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of every relative link in ``page``."""
    return [(n, target) for n, line in enumerate(prose(page.read_text()), 1) for target in LINK.findall(line)
            if not re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE)]


def broken(page: Path, root: Path = REPO) -> list[str]:
    """One line per link of ``page`` that leads nowhere, paths relative to ``root``."""
    out = []
    for n, target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(root)}:{n}: {target}"
        if not dest.exists():
            out.append(f"{where}: no such file")
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
            out.append(f"{where}: no heading #{anchor} in {dest.relative_to(root)}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(page):
    assert broken(page) == []


SAMPLE = """# Run

See [the other page](docs/b.md#a-link-here), [this one](#run-1), ![a figure](docs/img.png) and
[a site](https://example.com/x.md#y).

```
[not a link](missing-in-code.md)
```

## Run

`[not a link either](missing-in-span.md)`, but [this is](missing.md), [so is this](#nowhere) and
[this](docs/b.md#no-such-section).
"""


def test_the_checker_finds_what_leads_nowhere_and_only_that(tmp_path):
    """GitHub's anchors (repeats numbered), images, links in code ignored, each broken link found."""
    assert slug("Streaming inside a task (`--stream-rows`)") == "streaming-inside-a-task---stream-rows"
    assert slug("Costs to expect (us-east-1, 2025: check them)") == "costs-to-expect-us-east-1-2025-check-them"
    assert slug("The `graph_servers` [folder](x.md)") == "the-graph_servers-folder"
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "img.png").write_bytes(b"")
    (tmp_path / "docs" / "b.md").write_text("# Back\n\n### A link, here!\n\n[back](../README.md#run)\n")
    (tmp_path / "README.md").write_text(SAMPLE)
    assert anchors(tmp_path / "README.md") == {"run", "run-1"}
    assert broken(tmp_path / "docs" / "b.md", tmp_path) == []
    assert broken(tmp_path / "README.md", tmp_path) == [
        "README.md:12: missing.md: no such file",
        "README.md:12: #nowhere: no heading #nowhere in README.md",
        "README.md:13: docs/b.md#no-such-section: no heading #no-such-section in docs/b.md"]
