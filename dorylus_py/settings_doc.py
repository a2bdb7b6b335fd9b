"""TrainConfig's settings described to a reader of Python: the text of ``help(TrainConfig)`` and its
signature, and ``docs/settings.md``, all made from the declarations the CLI's flags are made from
(each section's fields, ``settings.setting``), in a caller's words (``spelling.py``), so none can drift.

``python -m dorylus_py.settings_doc > docs/settings.md`` writes the page (a test checks it is current).
Only the standard library is imported.
"""

from __future__ import annotations

import inspect
import textwrap
from dataclasses import MISSING, Field, fields

from dorylus_py.sections import SECTIONS
from dorylus_py.settings import AUTO
from dorylus_py.spelling import in_python

INTRO = ("A training run's settings: the flags of `dorylus train`, each with _ for - (`--attn-dropout` is "
         "`attn_dropout`). Made flat by name, `TrainConfig(data=\"cora\", model=\"gat\", epochs=100)`, or with "
         "whole sections by section name (`run=RunSettings(...)`); read flat (`cfg.hidden`) or by section "
         "(`cfg.gnn.hidden`); written flat by `to_dict()`. Each value's type and range is checked when the config is "
         "made: a `ConfigError` naming the setting (and the nearest one to a misspelt name). What relates settings "
         "to each other (a mode and a backend, a setting that is for one backend) is checked by `check()`, which "
         "`train()` runs.")


def documented(section: type) -> list[Field]:
    """The fields of ``section`` a user sets (each declared with :func:`~dorylus_py.settings.setting`)."""
    return [f for f in fields(section) if "help" in f.metadata]


def default_of(f: Field):
    """The default as a caller passes it (``auto`` as the string)."""
    return "auto" if f.default is AUTO else f.default if f.default is not MISSING else None


def meaning(f: Field) -> str:
    """The field's help in a caller's words, and its choices."""
    choices = f.metadata["choices"]
    return in_python(f.metadata["help"]) + (f" (one of {', '.join(map(repr, choices))})" if choices else "")


def docstring() -> str:
    """``help(TrainConfig)``: every setting with its type, default and meaning, by section."""
    lines = [*textwrap.wrap(INTRO, 100), ""]
    for name, section in SECTIONS.items():
        lines.append(f"{section.__doc__} (cfg.{name}, {section.__name__}):")
        for f in documented(section):
            lines.append(f"    {f.name}: {f.type} = {default_of(f)!r}")
            lines += textwrap.wrap(meaning(f), 96, initial_indent="        ", subsequent_indent="        ")
        lines.append("")
    return "\n".join(lines)


def signature() -> inspect.Signature:
    """``TrainConfig(*, data=None, epochs=200, ...)``: every setting a keyword with its default."""
    return inspect.Signature([inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default_of(f))
                              for section in SECTIONS.values() for f in documented(section)])


def markdown() -> str:
    """``docs/settings.md``: the same, as tables."""
    out = ["# Settings of a training run", "",
           "<!-- Made by `python -m dorylus_py.settings_doc > docs/settings.md` from the declarations in",
           "     dorylus_py/sections.py; tests/test_api.py checks it is current. Do not edit by hand. -->", "",
           *textwrap.wrap(INTRO, 100), "",
           "The same text is `help(TrainConfig)`; `dorylus train --help` gives each as a flag.", ""]
    for name, section in SECTIONS.items():
        out += [f"## {section.__doc__[0].upper()}{section.__doc__[1:]}", "",
                f"`cfg.{name}`, a `{section.__name__}`.", "", "| setting | type | default | meaning |",
                "| --- | --- | --- | --- |"]
        out += [f"| `{f.name}` | `{_cell(str(f.type))}` | `{default_of(f)!r}` | {_cell(meaning(f))} |"
                for f in documented(section)]
        out.append("")
    return "\n".join(out)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


if __name__ == "__main__":
    print(markdown(), end="")
