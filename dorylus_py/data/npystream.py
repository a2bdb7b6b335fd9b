"""``.npy`` arrays written and read block by block, alone or as members of an ``.npz``.

A graph of 200 M edges does not fit in memory several times over, so its arrays are streamed: the
header (shape and dtype, known up front) goes first, then rows in blocks, each hashed as it is
written (SHA-256, for the manifest) so the file is never read back just to be checked. Readers parse
the header of a file or of an ``.npz`` member (stored or deflated) and yield rows in blocks.
"""

from __future__ import annotations

import hashlib
import io
import math
import zipfile
import zlib
from pathlib import Path

import numpy as np

from dorylus_py.data.textblocks import DEFLATE_MAX_RATIO
from dorylus_py.errors import DataError

MAX_MEMBERS = 1024


class NpyWriter:
    """Write one C-order ``.npy`` array of a known ``shape`` through ``write(block)`` calls."""

    def __init__(self, f, dtype, shape: tuple[int, ...], name: str = "array"):
        self.f, self.dtype, self.shape, self.name = f, np.dtype(dtype), tuple(int(s) for s in shape), name
        self.rows = 0
        self.sha = hashlib.sha256()
        header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": self.shape}
        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(buf, header)
        self._emit(buf.getvalue())

    def write(self, block) -> None:
        """Append rows (``block.shape[1:]`` must match the announced shape)."""
        block = np.ascontiguousarray(block, dtype=self.dtype)
        if self.shape and block.shape[1:] != self.shape[1:]:
            raise ValueError(f"{self.name}: block of shape {block.shape} for an array of shape {self.shape}")
        if self.rows + len(block) > self._total():
            raise ValueError(f"{self.name}: more than the {self._total()} rows announced")
        self.rows += len(block)
        self._emit(memoryview(block.reshape(-1)).cast("B"))

    def _emit(self, data) -> None:
        self.sha.update(data)
        self.f.write(data)

    def _total(self) -> int:
        return self.shape[0] if self.shape else 1  # a 0-d array is one item

    def finish(self) -> str:
        """Check that every announced row came; return the SHA-256 of the whole file."""
        if self.rows != self._total():
            raise ValueError(f"{self.name}: {self.rows} rows written, {self._total()} announced")
        return self.sha.hexdigest()


def write_npy(path: Path, dtype, shape: tuple[int, ...], blocks) -> dict:
    """Write ``blocks`` (an iterable of row blocks) as ``path``; return ``{"bytes", "sha256"}``."""
    with open(path, "wb") as f:
        w = NpyWriter(f, dtype, shape, path.name)
        for block in blocks:
            w.write(block)
        sha = w.finish()
    return {"bytes": path.stat().st_size, "sha256": sha}


def save_npy(path: Path, array: np.ndarray) -> dict:
    """Write a whole in-memory array (C order) as ``path``; return ``{"bytes", "sha256"}``."""
    return write_npy(path, array.dtype, array.shape, [array])


class NpzWriter:
    """An uncompressed ``.npz`` whose members are streamed one after the other (zip64, any size)."""

    def __init__(self, path: Path):
        self.zip = zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED, allowZip64=True)

    def member(self, name: str, dtype, shape: tuple[int, ...], blocks) -> None:
        with self.zip.open(f"{name}.npy", "w", force_zip64=True) as f:
            w = NpyWriter(f, dtype, shape, name)
            for block in blocks:
                w.write(block)
            w.finish()

    def close(self) -> None:
        self.zip.close()


class NpyMember:
    """One array of an ``.npz`` (or one ``.npy`` file) read in row blocks without loading it whole. With
    ``size`` (its bytes, from the zip's directory or the file system) the header must account for exactly
    those bytes, so that no shape it claims is believed beyond what is there."""

    def __init__(self, opener, where: str, size: int | None = None):
        self.opener, self.where = opener, where
        with self.opener() as f:
            self.shape, self.dtype = _read_header(f, where)
            header = f.tell()
        if size is not None:
            data = math.prod(self.shape) * self.dtype.itemsize
            if header + data != size:
                raise DataError(f"{where}: truncated or corrupt: its header claims shape {self.shape[:4]} of "
                                f"{self.dtype} ({data:,} bytes), but it holds {size - header:,}")

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 1

    def blocks(self, rows: int):
        """Yield consecutive blocks of at most ``rows`` rows, as arrays of the stored dtype."""
        row_items = int(np.prod(self.shape[1:], dtype=np.int64))
        row_bytes = row_items * self.dtype.itemsize
        with self.opener() as f:
            _read_header(f, self.where)
            done = 0
            while done < len(self):
                take = min(rows, len(self) - done)
                raw = f.read(take * row_bytes)
                if len(raw) != take * row_bytes:
                    raise DataError(f"{self.where}: truncated after {done + len(raw) // max(row_bytes, 1)} of {len(self)} rows")
                yield np.frombuffer(raw, dtype=self.dtype).reshape((take, *self.shape[1:]))
                done += take

    def row_blocks(self, row: int, items: int):
        """Row ``row`` of a 2-D array, in consecutive blocks of at most ``items`` values: one row of a (2, E)
        ``edge_index`` read beside the other through a stream of its own, the rows before it skipped, not held."""
        width, itemsize = self.shape[1], self.dtype.itemsize
        with self.opener() as f:
            _read_header(f, self.where)
            skip = row * width * itemsize  # a deflated member cannot seek: the rows before are read past
            while skip:
                got = len(f.read(min(skip, 1 << 20)))
                if not got:
                    raise DataError(f"{self.where}: truncated before its row {row}")
                skip -= got
            done = 0
            while done < width:
                take = min(items, width - done)
                raw = f.read(take * itemsize)
                if len(raw) != take * itemsize:
                    raise DataError(f"{self.where}: truncated after {done + len(raw) // itemsize} of the {width} "
                                    f"values of its row {row}")
                yield np.frombuffer(raw, dtype=self.dtype)
                done += take

    def read(self) -> np.ndarray:
        """The whole array (for the small per-vertex arrays: labels, masks)."""
        parts = list(self.blocks(max(len(self), 1)))
        return parts[0].reshape(self.shape) if parts else np.zeros(self.shape, self.dtype)


def npz_members(path: Path, wanted=None) -> dict[str, NpyMember]:
    """The arrays of an ``.npz`` (those ``wanted``, by default all), by name (``features`` for
    ``features.npy``), readable in blocks; each member's header checked against its size in the zip, and that
    size against what its compressed bytes can hold."""
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise DataError(f"{path}: not a readable .npz file ({e})") from None
    if len(infos) > MAX_MEMBERS:
        raise DataError(f"{path}: {len(infos):,} members; a dataset has a few arrays (at most {MAX_MEMBERS})")
    infos = {i.filename: i for i in infos if i.filename.endswith(".npy")
             and (wanted is None or i.filename[: -len(".npy")] in wanted)}
    for i in infos.values():
        if i.file_size > max(i.compress_size, 1) * DEFLATE_MAX_RATIO:
            raise DataError(f"{path}:{i.filename}: claims {i.file_size:,} bytes from {i.compress_size:,} compressed, "
                            "more than deflate makes")

    def opener(member: str):
        def open_member():
            z = zipfile.ZipFile(path)
            try:
                return _Closing(z.open(member), z, f"{path}:{member}")
            except (zipfile.BadZipFile, OSError, ValueError) as e:
                z.close()
                raise DataError(f"{path}:{member}: not readable ({e})") from None
        return open_member

    return {name[: -len(".npy")]: NpyMember(opener(name), f"{path}:{name}", info.file_size)
            for name, info in infos.items()}


class _Closing:
    """A zip member stream that also closes its archive; a member whose compressed bytes are corrupt (a bad
    deflate stream, a CRC that does not match) is one line naming it."""

    def __init__(self, f, z, where: str):
        self.f, self.z, self.where = f, z, where

    def read(self, n: int = -1) -> bytes:
        try:
            return self.f.read(n)
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as e:
            raise DataError(f"{self.where}: corrupt compressed data ({e})") from None

    def tell(self) -> int:
        return self.f.tell()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()
        self.z.close()


def _read_header(f, where: str):
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    except (ValueError, OSError, EOFError) as e:
        raise DataError(f"{where}: not a readable .npy array ({e})") from None
    if fortran and len(shape) > 1:
        raise DataError(f"{where}: Fortran-order arrays are not supported; save it in C order")
    if dtype.hasobject:
        raise DataError(f"{where}: holds Python objects; only numeric arrays are read")
    return shape, dtype
