"""How a setting is declared once: its default, its help, and what its flag takes, in the field's metadata.

A section of a configuration is a frozen dataclass whose fields are made with :func:`setting`; the
``dorylus`` CLI generates each field's flag from it (``--field-name``: no flag is named differently from
its field), with the help text and the default written there, so a setting is described in one place.
``auto`` values are :data:`AUTO`, a type of their own, not a string (``--chunks auto``, ``--lambdas auto``).
Only the standard library is imported: ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import MISSING, Field, field


class Section:
    """What every settings section shares: equality, a hash and a repr over its fields (written once, not
    generated per class: the CLI imports these for --help, and each generated method costs an exec)."""

    def _values(self) -> tuple:
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self))

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other._values() == self._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{f.name}={getattr(self, f.name)!r}' for f in dataclasses.fields(self))})"


def section(cls):
    """A settings section: a frozen dataclass with :class:`Section`'s equality and repr."""
    return dataclasses.dataclass(frozen=True, eq=False, repr=False)(cls)


class Auto:
    """A value the run plan works out (``--chunks auto``, ``--lambdas auto``); one instance, :data:`AUTO`."""

    _instance: "Auto | None" = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "auto"

    def __reduce__(self):
        return (Auto, ())


AUTO = Auto()


def setting(default, help: str, *, choices: tuple | None = None, metavar: str | None = None,
            short: str | None = None, show_default: bool = True) -> Field:
    """A field of a settings section: ``default``, and its flag's ``help`` (the default is appended unless
    ``show_default`` is false or the help names it), ``choices``, ``metavar`` and ``short`` option."""
    return field(default=default, metadata={"help": help, "choices": choices, "metavar": metavar, "short": short,
                                            "show_default": show_default})


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def count_or_auto(value: str) -> int | Auto:
    """``--lambdas``, ``--chunks``: a count, or ``auto``."""
    if value == "auto":
        return AUTO
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or auto, got {value!r}") from None


def add_flags(group, section: type, defaults=None) -> None:
    """Add a flag for every field of ``section`` (a settings dataclass) to ``group``; ``defaults``: an
    instance whose values are the flags' defaults (the class's own otherwise)."""
    for f in dataclasses.fields(section):
        meta = f.metadata
        if "help" not in meta:
            continue
        default = getattr(defaults, f.name) if defaults is not None else (f.default if f.default is not MISSING else None)
        names = [flag_of(f.name)] + ([meta["short"]] if meta["short"] else [])
        kind = str(f.type)  # the annotation's text (``from __future__ import annotations``): "int | Auto"
        help_text = meta["help"]
        if meta["show_default"] and "(default" not in help_text:
            help_text += f" (default {_shown(default)})"
        help_text = help_text.replace("%", "%%")
        if kind == "bool":
            group.add_argument(*names, action="store_true", help=help_text)
            continue
        options = {"default": default, "help": help_text, "metavar": meta["metavar"]}
        if meta["choices"]:
            options["choices"] = meta["choices"]
        group.add_argument(*names, type=_parser_of(kind), **options)


def _parser_of(kind: str):
    """The argparse ``type`` for a field annotated ``kind`` (its text)."""
    options = [o for o in kind.replace(" ", "").split("|") if o != "None"]
    if "Auto" in options:
        return count_or_auto
    return {"int": int, "float": float}.get(options[0], str)


def _shown(value) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) >= 10:
        return f"{value:.0f}"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10_000:
        return f"{value:,}"
    return "none" if value is None else str(value)


def fits(annotation, value) -> bool:
    """Whether ``value`` (as JSON gives it) fits a field annotated ``annotation`` (its string form, e.g.
    ``int | Auto``, ``list[int]``, ``float | None``); ``auto`` fits :class:`Auto`."""
    for option in str(annotation).replace(" ", "").split("|"):
        if option == "None" and value is None:
            return True
        if option == "bool" and isinstance(value, bool):
            return True
        if option == "int" and isinstance(value, int) and not isinstance(value, bool):
            return True
        if option == "float" and isinstance(value, (int, float)) and not isinstance(value, bool):
            return True
        if option == "str" and isinstance(value, str):
            return True
        if option == "Auto" and (value == "auto" or value is AUTO):
            return True
        if option.startswith("list[") and isinstance(value, list):
            inner = option[5:-1]
            return all(fits(inner, v) for v in value)
    return False
