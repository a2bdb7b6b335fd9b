"""Which words an error speaks: a flag's (``--attn-dropout``) on the command line, a setting's
(``attn_dropout``) to a Python caller.

Every check is written once, naming flags. The ``dorylus`` command runs under :func:`speaking_flags`;
the Python entry points (``TrainConfig(...)``, ``train``, ``predict``) run under :func:`python_words`,
which rewrites the message of a :class:`~dorylus_py.errors.DorylusError` passing out of them, outside
the command, into what a caller writes: ``--overwrite`` as ``overwrite=True``, ``--mode gossip`` as
``mode="gossip"``, ``--epochs`` as ``epochs`` (text in backticks, a command to type, stays). Also the
nearest name to a misspelt one (:func:`nearest`). Only the standard library is imported at load.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from contextvars import ContextVar

from dorylus_py.errors import DorylusError

_FLAGS = ContextVar("dorylus_speaks_flags", default=False)

# The flags of `dorylus train` and `predict` that are keywords of the Python `train()` and `predict()`, by flag: the
# keyword, its type and choices, and how the call writes it ("{}": the keyword with its value); the rest are settings.
_SOURCES = ("features", "labels", "masks", "train-frac", "val-frac", "split-seed")
API_KEYWORDS = {"out": ("out", "str", ()), "resume": ("resume", "str", ()), "cluster": ("cluster", "str", ()),
                "overwrite": ("overwrite", "bool", ()), "no-data-copy": ("no_data_copy", "bool", ()),
                "embeddings": ("embeddings", "bool", ()), "weights": ("weights", "str", ("best", "final")),
                **{flag: (flag.replace("-", "_"), "str", (), "Sources({})") for flag in _SOURCES}}
_WRITTEN = {"quiet": "progress=False", "no-fuse": 'fuse="off"'}
_FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9-]*[a-z0-9])(?: ([^\s,;:()\[\]]+))?")
_NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?")
_PLACEHOLDER = re.compile(r"[A-Z][A-Z_]*(\.[a-z]+)?")  # RUN_DIR, PATH, FILE.npy: what the caller fills in
_PATH = re.compile(r".*(/|\.[A-Za-z]+$).*")  # runs/cora, g.npz: a value, not the next word of a sentence


@contextmanager
def speaking_flags():
    """What runs inside speaks flags: the ``dorylus`` command."""
    token = _FLAGS.set(True)
    try:
        yield
    finally:
        _FLAGS.reset(token)


@contextmanager
def python_words():
    """A DorylusError passing out, outside the command, speaks Python (:func:`in_python`)."""
    try:
        yield
    except DorylusError as e:
        if not _FLAGS.get() and e.args and isinstance(e.args[0], str):
            e.args = (in_python(e.args[0]), *e.args[1:])
        raise


def in_python(message: str) -> str:
    """``message`` with each flag of `dorylus train` written as a Python caller passes it."""
    parts = message.split("`")
    parts[::2] = [_FLAG.sub(_python_word, part) for part in parts[::2]]  # odd parts are in backticks
    return "`".join(parts)


def _python_word(match: re.Match) -> str:
    from dorylus_py.sections import FIELDS

    flag, value = match.group(1), match.group(2)
    if flag in _WRITTEN:
        return _WRITTEN[flag] + ("" if value is None else f" {value}")
    if flag in API_KEYWORDS:
        name, kind, choices, *form = API_KEYWORDS[flag]
    elif (field := FIELDS.get(flag.replace("-", "_"))) is not None:
        name, kind, choices, form = field.name, str(field.type).replace(" ", ""), field.metadata["choices"] or (), ()
    else:
        return match.group(0)
    spelt, took = _with_value(name, kind, choices, value)
    if form and not took:
        spelt = f"{name}=..."
    return (form[0] if form else "{}").format(spelt) + ("" if took or value is None else f" {value}")


def _with_value(name: str, kind: str, choices: tuple, value: str | None) -> tuple[str, bool]:
    """``name`` as a caller writes it, with ``value`` when the word after the flag is its value (True if so)."""
    if kind == "bool":
        return f"{name}=True", False
    if value is None:
        return name, False
    if _PLACEHOLDER.fullmatch(value):
        return f"{name}={value}", True
    if value in choices or (value == "auto" and "Auto" in kind):
        return f'{name}="{value}"', True
    if _NUMBER.fullmatch(value) and kind.split("|")[0] in ("int", "float"):
        return f"{name}={value}", True
    if kind.startswith("str") and _PATH.fullmatch(value):
        return f'{name}="{value}"', True
    return name, False


def nearest(name: str, names) -> str | None:
    """The one of ``names`` a misspelt ``name`` most likely meant, if any is close."""
    import difflib

    close = difflib.get_close_matches(name, list(names), n=1, cutoff=0.6)
    return close[0] if close else None
