"""A message's header frame: its op, its tensors' specs and its fields, in MessagePack, checked against
a schema (msgspec) as it is decoded, in C, before any of it is used.

The frame is ``[op, [[name, dtype, shape(, wire)], ...], {field: value}]``. The schema bounds all of it:
the op is one of :data:`~dorylus_py.protocol.messages.OPS`; a tensor spec is a name of 1 to 64
characters, one of the dtypes a tensor may have, at most 4 dimensions each in [0, 2**31), and a wire
form of :data:`~dorylus_py.protocol.quantize.WIRE_DTYPES`; a field is named by 1 to 64 characters and
holds what JSON could (None, a bool, an integer or a finite float within 2**53 in magnitude, a string,
a list, a map with string keys), nested at most :data:`MAX_DEPTH` deep (the messages sent nest 4 at
most). Which fields an op has, and their types, are its handler's to check. msgspec refuses truncated
input, any length longer than the bytes left (before it allocates) and strings that are not UTF-8.
A sender decodes the header it wrote with the same decoder, so it finds its own bad field in one line
instead of a peer refusing it. Against the JSON headers this replaced: ``benchmarks/bench_header.py``
(docs/performance.md, "Tenth").
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

import msgspec
import numpy as np
from msgspec import Meta, Struct

from dorylus_py.protocol.messages import DTYPES, MAX_INT, OPS, ProtocolError
from dorylus_py.protocol.quantize import WIRE_DTYPES

MAX_HEADER_BYTES = 64 * 1024
MAX_DEPTH = 8  # a field value's nesting; building the type below costs 2-3x more a level (8 ms at 8, 5 s at 16)
MAX_TENSORS = 4096  # specs in one header; a session's own limit (``Limits.max_tensors``) is lower

Name = Annotated[str, Meta(min_length=1, max_length=64)]
Dim = Annotated[int, Meta(ge=0, lt=2**31)]
_SCALAR = Union[None, bool, Annotated[int, Meta(ge=-MAX_INT, le=MAX_INT)],
                Annotated[float, Meta(ge=-MAX_INT, le=MAX_INT)], str]  # NaN fails both bounds
Value = _SCALAR
for _ in range(MAX_DEPTH):  # msgspec has no recursive alias before Python 3.12: one level at a time
    Value = Union[_SCALAR, list[Value], dict[str, Value]]  # type: ignore[valid-type]


class TensorSpec(Struct, array_like=True, forbid_unknown_fields=True, omit_defaults=True, frozen=True):
    name: Name
    dtype: Literal[tuple(DTYPES)]  # type: ignore[valid-type]
    shape: Annotated[list[Dim], Meta(max_length=4)]
    wire: Literal[("float32", *WIRE_DTYPES)] = "float32"  # type: ignore[valid-type]


class Header(Struct, array_like=True, forbid_unknown_fields=True, frozen=True):
    op: Literal[tuple(sorted(OPS))]  # type: ignore[valid-type]
    tensors: Annotated[list[TensorSpec], Meta(max_length=MAX_TENSORS)]
    fields: dict[Name, Value]  # type: ignore[valid-type]


def _plain(value):
    """A numpy scalar as the Python number it holds (``json.dumps`` took ``np.float64``, a float)."""
    if isinstance(value, np.generic):
        return value.item()
    raise NotImplementedError(f"Encoding objects of type {type(value).__name__} is unsupported")


_ENCODER = msgspec.msgpack.Encoder(enc_hook=_plain)
_DECODER = msgspec.msgpack.Decoder(Header)
_PLACES = {"$[0]": "the op", "$[1]": "the tensor list", "$[2]": "the fields"}
_TOO_DEEP = "Expected `bool | int | float | str | null`, got `"  # a container where only a scalar may be


def encode_header(op: str, tensors: list[TensorSpec], fields: dict) -> bytes:
    """The header frame of a message, decoded once as a receiver would; :class:`ProtocolError` names
    the field no receiver would accept (a type MessagePack cannot hold stays a ``TypeError``: a bug,
    not a value)."""
    return _encoded(op, tensors, fields)[0]


def carried_fields(op: str, fields: dict) -> dict:
    """``fields`` as a receiver gets them, for a message that travels in-process (a graph server's own
    tensor threads): refused as a sender would refuse them, with JSON's kinds of values coming out."""
    return _encoded(op, [], fields)[1].fields


def _encoded(op: str, tensors: list[TensorSpec], fields: dict) -> tuple[bytes, Header]:
    try:
        raw = _ENCODER.encode(Header(op, tensors, fields))
        return raw, decode_header(raw, f"op {op}")
    except (ProtocolError, OverflowError) as e:  # OverflowError: an integer past 2**64
        bad = _first_bad_field(op, fields)
        raise (ProtocolError(f"op {op}: {bad}") if bad else e if isinstance(e, ProtocolError)
               else ProtocolError(f"op {op}: an integer out of range")) from None


def _first_bad_field(op: str, fields: dict) -> str | None:
    """What is wrong with the first field a header would be refused for alone (msgspec's path names
    no map key), or None."""
    for name, value in fields.items():
        try:
            decode_header(_ENCODER.encode(Header(op, [], {name: value})))
        except ProtocolError as e:
            return f"field {str(name)[:64]!r}: {str(e).split(': ', 2)[-1]}"
        except OverflowError:
            return f"field {str(name)[:64]!r}: an integer out of range (|x| <= 2**53)"
    return None


def decode_header(raw: bytes, what: str = "header") -> Header:
    """The header in ``raw`` (at most :data:`MAX_HEADER_BYTES`), or :class:`ProtocolError` naming what
    is wrong with it."""
    if len(raw) > MAX_HEADER_BYTES:
        raise ProtocolError(f"{what}: {len(raw)} bytes exceed {MAX_HEADER_BYTES}")
    try:
        return _DECODER.decode(raw)
    except msgspec.ValidationError as e:
        raise ProtocolError(f"{what}: {_placed(str(e))}") from None
    except (msgspec.DecodeError, RecursionError, ValueError) as e:  # ValueError: a string not UTF-8
        raise ProtocolError(f"{what}: not a valid header ({str(e)[:60]})") from None


def header_prefix(op: str) -> bytes:
    """How the header of an ``op`` message begins (the op comes first): what a receiver may match
    before it decodes anything."""
    return _ENCODER.encode(Header(op, [], {}))[: 1 + len(_ENCODER.encode(op))]


def _placed(error: str) -> str:
    """msgspec's ``... - at `$[1][0][2]``` with the place in words."""
    text, _, path = error.partition(" - at `")
    path = path.rstrip("`")
    if text.startswith(_TOO_DEEP) and text.endswith(("`array`", "`object`")):
        text = f"nested more than {MAX_DEPTH} deep"
    elif text.startswith(("Expected `float` >=", "Expected `float` <=")):
        text = "not a finite number within 2**53"
    elif text.startswith(("Expected `int` >= -", "Expected `int` <= 9")):
        text = "an integer out of range (|x| <= 2**53)"
    text = text if len(text) <= 160 else text[:160] + "..."  # msgspec repeats a bad value whole
    key = path.startswith("key` in `")  # a map's key, not a value
    path = path.removeprefix("key` in `")
    for prefix, words in _PLACES.items():
        if path.startswith(prefix):
            rest = path[len(prefix):]
            if prefix == "$[1]" and rest.startswith("["):
                index, _, rest = rest[1:].partition("]")
                words = f"tensor spec {index}"
            return f"{'a key of ' if key else ''}{words}{' ' + rest if rest else ''}: {text}"
    return text if not path else f"{path}: {text}"
