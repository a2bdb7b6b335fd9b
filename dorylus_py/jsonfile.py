"""Read a JSON file a user handed us, with a one-line error naming the file when it is missing or broken."""

from __future__ import annotations

import json
from pathlib import Path

from dorylus_py.errors import DataError, DorylusError


def read_json(path: str | Path, error: type[DorylusError] = DataError, missing: str = "not found"):
    """Parsed contents of ``path``; ``error(f"{path}: {missing}")`` if absent, or a bad-JSON error."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise error(f"{path}: {missing}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{path}: not valid JSON ({getattr(e, 'msg', e)})") from None
