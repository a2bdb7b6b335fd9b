"""Reading a ``.pt`` file without running it: the only way this package reads one that arrived.

A ``.pt`` file is a pickle, and a pickle can call anything. ``torch.load(weights_only=True)`` unpickles
with an allowlist (tensors, plain containers, and whatever was registered with
``add_safe_globals``), but that list is process-wide and grows behind our back: importing
torch_geometric registers some 20 classes, and the restricted unpickler calls an allowed class with
arguments the file chooses (``REDUCE``). One of them, ``ClusterData``, given a ``save_dir`` holding
``part_2/metis.pt``, loads that file through PyG's own loader, which falls back to unrestricted
unpickling when the restricted one refuses: a "safe" load that runs any code
(``tests/security/test_shared_records.py`` shows it). So a load here sees exactly the classes its
format needs, and the process's list is put back afterwards (a lock keeps our loads from overlapping;
another thread's ``torch.load`` at that moment would see the narrow list).

Before the unpickler runs, the file must be a regular file in torch's zip format whose members are
stored as they are (``torch.save`` never compresses): members claiming more bytes than the file holds,
a zip bomb, are refused unread.
"""

from __future__ import annotations

import os
import re
import threading
import zipfile

from dorylus_py.errors import DataError
from dorylus_py.regular_file import open_regular

_ALLOWLIST = threading.Lock()  # the process-wide allowlist is swapped for the length of one load


def load_pt(path: str | os.PathLike, allowed: list, what: str = "torch file"):
    """The object saved in ``path``, unpickled with only torch's own tensor types and ``allowed`` (classes)
    callable; a DataError line naming ``path`` for anything else, a file that is not ``what`` included."""
    import torch
    from torch.serialization import add_safe_globals, clear_safe_globals, get_safe_globals

    try:
        f = open_regular(path, symlinks=True)
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    with f:
        _check_zip(f, path, what)
        f.seek(0)
        with _ALLOWLIST:
            registered = get_safe_globals()
            clear_safe_globals()
            add_safe_globals(list(allowed))
            try:
                return torch.load(f, weights_only=True, map_location="cpu")
            except Exception as e:  # noqa: BLE001  (the unpickler refusing a global, a bad storage, ...: a bad file)
                raise DataError(f"{path}: not a {what} this package reads without running code ({_reason(e)})") from None
            finally:
                clear_safe_globals()
                add_safe_globals(registered)


def _check_zip(f, path: str | os.PathLike, what: str) -> None:
    size = os.fstat(f.fileno()).st_size
    try:
        with zipfile.ZipFile(f) as z:
            claimed = sum(m.file_size for m in z.infolist())
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError):
        raise DataError(f"{path}: not a {what} in torch's zip format (what torch.save writes since torch 1.6)") from None
    if claimed > size:
        raise DataError(f"{path}: its members claim {claimed:,} bytes, more than the file's {size:,} (torch.save "
                        f"stores them uncompressed): not a {what}")


def _reason(e: BaseException) -> str:
    """Why torch refused: the global the pickle names, if that was it, else the message's first line."""
    refused = re.search(r"GLOBAL ([\w.]+)", str(e))
    if refused:
        return f"it calls or builds {refused.group(1)[:120]}, which is not allowed"
    line = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {line[:160]}" if line else type(e).__name__
