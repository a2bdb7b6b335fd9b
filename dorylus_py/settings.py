"""How a setting is declared once: its default, its help, and what its flag takes, in the field's metadata.

A section of a configuration is a frozen dataclass whose fields are made with :func:`setting`; the
``dorylus`` CLI generates each field's flag from it (``--field-name``: no flag is named differently from
its field), with the help text and the default written there, so a setting is described in one place.
``auto`` values are :data:`AUTO`, a type of their own, not a string (``--chunks auto``, ``--lambdas auto``).
A number's upper bound is declared with it too (``most``), and :meth:`Section.check_limits` refuses any
number above it, and any NaN or infinity, in one line: a count that would overflow an allocation, a
timeout that would overflow a poll, before anything is created. Paths are checked by :func:`check_path`.
Only the standard library is imported: ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import MISSING, Field, field

from dorylus_py.errors import ConfigError

NAME_MAX, PATH_MAX = 255, 4096  # bytes of one path component, of a whole path (Linux)
MAX_SEED = 2**32 - 1  # the seeds numpy and torch take, whatever the platform


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

    def check_limits(self) -> None:
        """Every number finite and at most its field's ``most``: what no section's own check has to repeat."""
        for f in dataclasses.fields(self):
            check_number(flag_of(f.name), getattr(self, f.name), f.metadata.get("most"))


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
            short: str | None = None, show_default: bool = True, most: float | None = None) -> Field:
    """A field of a settings section: ``default``, and its flag's ``help`` (the default is appended unless
    ``show_default`` is false or the help names it), ``choices``, ``metavar`` and ``short`` option, and
    ``most``, the largest value it takes (lower bounds, which often relate fields, are the section's check)."""
    return field(default=default, metadata={"help": help, "choices": choices, "metavar": metavar, "short": short,
                                            "show_default": show_default, "most": most})


def check_number(flag: str, value, most: float | None = None) -> None:
    """A number setting is finite and at most ``most``; anything else (None, AUTO, a string) passes."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{flag} must be a finite number, got {value}")
    if most is not None and value > most:
        shown = f"{value:,}" if isinstance(value, int) and value < 10**15 else f"{value:.6g}"
        raise ConfigError(f"{flag} must be <= {_shown(most)}, got {shown}")


def check_split(train_frac: float, val_frac: float, seed: int, seed_flag: str = "--split-seed") -> None:
    """A random split's settings: fractions (NaN fails every comparison) and a seed numpy takes."""
    if not (0 < train_frac < 1 and 0 <= val_frac < 1 and train_frac + val_frac <= 1):
        raise ConfigError(
            f"split fractions must satisfy 0 < train ({train_frac}) and train + val ({val_frac}) <= 1"
        )
    check_seed(seed_flag, seed)


def check_seed(flag: str, seed: int) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"{flag} must be an integer in [0, {MAX_SEED}], got {seed!r}")


def path_problem(value: str) -> str | None:
    """What keeps the OS from taking the path ``value`` (a NUL byte, a name over NAME_MAX bytes, the whole
    over PATH_MAX), or what is wrong with an ``s3://`` address (``s3.split``); None when nothing is."""
    if value.startswith("s3://"):
        from dorylus_py import s3
        from dorylus_py.errors import DorylusError

        try:
            s3.split(value)
        except DorylusError as e:
            return str(e)
        return None
    raw = value.encode("utf-8", "surrogateescape")
    long = next((name for name in raw.split(b"/") if len(name) > NAME_MAX), None)
    if b"\0" in raw:
        return "the path holds a NUL byte"
    if long is not None:
        return f"the path has a name of {len(long)} bytes (at most {NAME_MAX}): {long[:40].decode(errors='replace')}..."
    if len(raw) > PATH_MAX:
        return f"the path is {len(raw)} bytes long (at most {PATH_MAX})"
    return None


def check_path(flag: str, value: str) -> None:
    """:func:`path_problem`, as a ConfigError naming ``flag``: checked before anything is created."""
    problem = path_problem(value)
    if problem:
        raise ConfigError(f"{flag}: {problem}")


def path_arg(value: str) -> str:
    """An argparse ``type`` for a path flag: :func:`path_problem` as it is parsed."""
    problem = path_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return value


def finite_float(value: str) -> float:
    """An argparse ``type`` for a float flag: NaN and infinities are no setting."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {value!r}")
    return number


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


def number_or_auto(value: str) -> float | Auto:
    """``--stale-smoothing``, ``--fresh-wait-ms``: a number, or ``auto`` (the run plan's choice)."""
    return AUTO if value == "auto" else finite_float(value)


def switch_or_auto(value: str) -> bool | Auto:
    """``--local-barrier [on|off|auto]``: the bare flag is on; ``auto`` is the run plan's choice."""
    options = {"on": True, "off": False, "auto": AUTO}
    if value not in options:
        raise argparse.ArgumentTypeError(f"expected on, off or auto, got {value!r}")
    return options[value]


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
        if kind == "bool | Auto":  # a switch the plan may choose: the bare flag turns it on
            options.update(nargs="?", const=True, metavar=meta["metavar"] or "on|off|auto")
        if meta["choices"]:
            options["choices"] = meta["choices"]
        group.add_argument(*names, type=_parser_of(kind), **options)


def _parser_of(kind: str):
    """The argparse ``type`` for a field annotated ``kind`` (its text)."""
    options = [o for o in kind.replace(" ", "").split("|") if o != "None"]
    if "Auto" in options:
        return {"bool": switch_or_auto, "float": number_or_auto}.get(options[0], count_or_auto)
    return {"int": int, "float": finite_float}.get(options[0], str)


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
