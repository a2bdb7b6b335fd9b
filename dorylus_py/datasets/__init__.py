"""The reference graphs shipped with the package, Cora and Citeseer with the public Planetoid split
(``README.md`` here: layout, source, licence), reachable by name wherever a dataset path is taken.

The rule, one place for every command: a path that exists is read as it is; only where nothing of that
name exists does a bundled name (``cora``, ``citeseer``) stand for its file here. So a user's own file or
folder called ``cora`` is never shadowed, and a name means the same in ``check``, ``prepare``, ``train``,
``predict`` and ``cost estimate``. Only the standard library is imported (the CLI's help names them).
"""

from __future__ import annotations

import os
from pathlib import Path

FOLDER = Path(__file__).resolve().parent
NAMES = ("cora", "citeseer")
RULE = f"a bundled reference graph by name ({', '.join(NAMES)}) where no file or folder of that name exists"


def resolve(path: str | os.PathLike) -> str | os.PathLike:
    """``path`` itself when something exists there (or it is an ``s3://`` address), else the bundled
    file a name stands for; an unknown name is left for the readers to report as missing."""
    text = str(path)
    if text in NAMES and not os.path.lexists(text):
        return str(FOLDER / f"{text}.npz")
    return path
