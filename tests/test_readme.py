"""The README's tour, run from the README itself so that the two cannot drift (issue 56): every `$ dorylus
...` command of its console blocks and every `>>>` line of its Python sessions, in order, in an empty folder
(a fresh clone has nothing beside it), each output compared with what the README prints: the same lines
in the same shape (the words between the numbers) and the same counts (vertices, edges, classes,
partitions, layers, epochs); measurements (times, accuracies, costs) may differ.

The default suite runs the steps that train in one process, each train for 2 epochs (about 15 s); `--long`
runs every step as written (200 epochs; the local runs the report reads too)."""

from __future__ import annotations

import contextlib
import doctest
import io
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?")
# The counts a line states, which no timing moves: "2,708 vertices", "7 class probabilities", "16-wide", "4 partitions"
COUNT = re.compile(r"(?<![\d.])(\d[\d,]*)(?:-wide| (vertices|edges|classes|class|partitions|GCNConv|epochs)\b)")
FAST_EPOCHS = 2


@dataclass
class Step:
    source: str  # a command line after `$ `, or the Python of one `>>>` example
    expected: list[str] = field(default_factory=list)  # the lines the README prints after it
    python: bool = False

    @property
    def trains(self) -> bool:
        return self.python and "train(" in self.source or self.source.startswith("dorylus train ")

    @property
    def in_one_process(self) -> bool:
        """Runs without server processes: what the default suite runs (the report reads the local runs)."""
        return "--backend" not in self.source and not self.source.startswith("dorylus report")


def tour() -> list[Step]:
    """The README's `$ ` commands (console blocks) with their printed lines, and its `>>>` examples, in order."""
    steps: list[Step] = []
    for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", README.read_text(), re.S | re.M):
        if lang == "pycon":
            steps += [Step(e.source.strip(), e.want.splitlines(), python=True)
                      for e in doctest.DocTestParser().get_examples(body)]
        elif lang == "" and body.startswith("$ "):
            for line in body.splitlines():
                if line.startswith("$ "):
                    steps.append(Step(line[2:]))
                else:
                    steps[-1].expected.append(line)
    return steps


def shorter(step: Step) -> str:
    """The step trained for FAST_EPOCHS epochs instead of its 200."""
    if step.python:
        return re.sub(r"TrainConfig\(([^)]*)\)", rf"TrainConfig(\1, epochs={FAST_EPOCHS})", step.source)
    return f"{step.source} --epochs {FAST_EPOCHS}"


def run(step: Step, source: str, namespace: dict) -> list[str]:
    """What ``source`` prints, as a terminal shows it (stdout and stderr, in the order written)."""
    if step.python:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(source, "<README.md>", "single"), namespace)  # shows an expression's value, as >>> does
        return out.getvalue().splitlines()
    argv = shlex.split(source)
    assert argv[0] == "dorylus", source
    proc = subprocess.run([sys.executable, "-m", "dorylus_py", *argv[1:]], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=900)
    assert proc.returncode == 0, f"$ {source}\n{proc.stdout[-3000:]}"
    return proc.stdout.splitlines()


def mismatch(expected: list[str], got: list[str], as_written: bool) -> str | None:
    """Why ``got`` is not what the README prints (None: it is): another line count, another shape, or
    another count; the number of epochs counts only when the step ran as written."""
    if len(got) != len(expected):
        return f"{len(got)} lines, the README shows {len(expected)}"
    for want, line in zip(expected, got):
        if " ".join(NUMBER.sub("#", want).split()) != " ".join(NUMBER.sub("#", line).split()):
            return f"{line!r} is not shaped as the README's {want!r}"
        counts = [(m.group(0)) for m in COUNT.finditer(want) if as_written or m.group(2) != "epochs"]
        found = [(m.group(0)) for m in COUNT.finditer(line) if as_written or m.group(2) != "epochs"]
        if counts != found:
            return f"{line!r} states {found}, the README {counts}"
    return None


def follow(steps: list[Step], folder: Path, as_written: bool, monkeypatch) -> None:
    monkeypatch.chdir(folder)
    namespace: dict = {}
    for step in steps:
        source = step.source if as_written or not step.trains else shorter(step)
        got = run(step, source, namespace)
        why = mismatch(step.expected, got, as_written)
        assert why is None, f"README step `{step.source}`: {why}\n" + "\n".join(got)


def test_the_tour_makes_what_it_reads_and_checks_every_output():
    """Read only: every run a later command reads was made by an earlier one, in the README itself (step 3
    once read two runs no command made), and every command shows what it prints."""
    steps = tour()
    commands = [s.source for s in steps if not s.python]
    assert any(c.startswith("dorylus prepare cora ") for c in commands) and any(s.python for s in steps)
    made: set[str] = set()
    for step in steps:
        argv = shlex.split(step.source) if not step.python else []
        used = [a for a in argv[2:] if a.startswith("runs/") and argv[1] in ("predict", "export", "report")]
        used += [b for a, b in zip(argv, argv[1:]) if a == "--data"]
        assert all(u in made for u in used), f"`{step.source}` reads {used}, but the tour made only {sorted(made)}"
        made |= {b for a, b in zip(argv, argv[1:]) if a == "--out"} | {"cora"}
        made |= set(re.findall(r'out="([^"]+)"', step.source))
        assert step.expected or step.python, f"the README shows no output of `{step.source}`"


def test_the_tours_one_process_steps_run_as_the_readme_shows(tmp_path, monkeypatch):
    follow([s for s in tour() if s.in_one_process], tmp_path, as_written=False, monkeypatch=monkeypatch)


@pytest.mark.long
@pytest.mark.timeout(1800)
def test_the_whole_tour_runs_as_written(tmp_path, monkeypatch):
    follow(tour(), tmp_path, as_written=True, monkeypatch=monkeypatch)
