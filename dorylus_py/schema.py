"""Typed checks of what a JSON file gave us: each kind of file declares its fields once (type, range,
nested objects), and a value that does not fit is one line naming the file and the field.

Types are spelled as the settings spell them (``int``, ``float``, ``str``, ``bool``, ``int | None``,
``list[int]``), with ``object`` and ``list`` for JSON's own: a bool is no number, an int is a float. Numbers must be finite unless a field says NaN and the infinities are values (a
diverged run's loss), and within ``[low, high]``; strings at most ``MAX_TEXT`` characters. Fields not declared pass unchecked, so a file
written by a newer version still reads; a reader uses only fields declared here.
"""

from __future__ import annotations

import math
import reprlib
from dataclasses import dataclass

from dorylus_py.errors import DataError, DorylusError

# the exact Python types a JSON value of each spelling has (an int is a float; a bool is neither)
_TYPES = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,), "None": (type(None),), "object": (dict,),
          "list": (list,)}
MAX_TEXT = 10_000  # characters of any string field: a path, a status line with its error
_ABSENT = object()
_SHOWN = reprlib.Repr()  # a value in a message: short whatever it holds
_SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlist, _SHOWN.maxdict, _SHOWN.maxlevel = 40, 40, 3, 3, 2


@dataclass(frozen=True)
class Field:
    type: str  # as settings.fits takes it
    low: float = -math.inf  # numbers only: inclusive bounds
    high: float = math.inf
    required: bool = False
    nan: bool = False  # NaN and the infinities are values
    fields: dict[str, "Field"] | None = None  # an object: its fields
    items: dict[str, "Field"] | None = None  # a list of objects: each one's fields
    each: "Field | None" = None  # an object used as a map (instance type -> price): every value's field
    max_items: int = 100_000  # a list's length

    def __post_init__(self):  # worked out once (a record has many rows): the Python types that fit
        options = self.type.replace(" ", "").split("|")
        object.__setattr__(self, "_types", frozenset(t for o in options for t in _TYPES[o.partition("[")[0]]))
        inner = next((o[5:-1] for o in options if o.startswith("list[")), None)  # list[int]: each item's type
        object.__setattr__(self, "_item", inner and Field(inner, self.low, self.high, nan=self.nan))

    def problem(self, value) -> str | None:
        """What is wrong with ``value`` for this field, or None."""
        kind = type(value)
        if kind not in self._types:
            return f"is {_SHOWN.repr(value)}, not {self.type}"
        if kind is float or kind is int:
            if kind is float and not math.isfinite(value):
                return None if self.nan else f"must be a finite number, got {value}"
            if not self.low <= value <= self.high:
                bound = (f">= {self.low:g}" if self.high == math.inf else f"<= {self.high:g}" if self.low == -math.inf
                         else f"in [{self.low:g}, {self.high:g}]")
                return f"must be {bound}, got {_SHOWN.repr(value)}"
        elif kind is str and len(value) > MAX_TEXT:
            return f"is a string of {len(value):,} characters (at most {MAX_TEXT:,})"
        elif kind is list:
            if len(value) > self.max_items:
                return f"has {len(value):,} items (at most {self.max_items:,})"
            if self._item is not None:
                return next((f"item {i} {p}" for i, v in enumerate(value) if (p := self._item.problem(v))), None)
        return None


def check_object(value, fields: dict[str, Field], where: str, error: type[DorylusError] = DataError,
                 prefix: str = "") -> dict:
    """``value``, if it is a JSON object whose ``fields`` fit (nested objects and lists of objects too);
    else ``error`` naming ``where`` and the field (``graph.nodes``, ``servers[1].bytes``)."""
    if not isinstance(value, dict):
        raise error(f"{where}: {prefix.rstrip('.') + ' ' if prefix else ''}is {_kind(value)}, not a JSON object")
    for name, f in fields.items():
        v = value.get(name, _ABSENT)
        if v is _ABSENT:
            if f.required:
                raise error(f"{where}: no {prefix}{name} (required)")
            continue
        problem = f.problem(v)
        if problem:
            raise error(f"{where}: {prefix}{_short(name)} {problem}")
        if f.fields is not None and v is not None:
            check_object(v, f.fields, where, error, f"{prefix}{_short(name)}.")
        if f.items is not None:
            for i, item in enumerate(v):
                check_object(item, f.items, where, error, f"{prefix}{_short(name)}[{i}].")
        if f.each is not None and v is not None:
            check_object(v, {key: f.each for key in v}, where, error, f"{prefix}{_short(name)}.")
    return value


def _short(name: str) -> str:
    return name if len(name) <= 40 else name[:40] + "..."


def _kind(value) -> str:
    """A JSON value's kind, as a user would name it."""
    for t, name in ((bool, "a boolean"), (int, "a number"), (float, "a number"), (str, "a string"),
                    (list, "a list"), (type(None), "null")):
        if isinstance(value, t):
            return name
    return type(value).__name__
