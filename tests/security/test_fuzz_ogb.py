"""Seeded fuzz over OGB folders: a small valid folder, spoiled in one to three ways at a time (truncated or
corrupted gzip, junk bytes, long lines, huge, negative or mismatched counts, bad values, missing files or
files that are folders or FIFOs). `check` and `prepare` must either read it or refuse it in one line
(a DorylusError, exit 2): any other exception is a bug, and none may take long."""

from __future__ import annotations

import gzip
import os
import shutil
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from dorylus_py.cli import main
from dorylus_py.data import load_graph
from dorylus_py.errors import DorylusError
from dorylus_py.partition.source import ogb_source
from tests.data.test_ogb import write_random_ogb

SEED = 52
CASES = 100
CLI_EVERY = 10  # `dorylus check` and `prepare` whole (the parser alone is 0.1 s) for every 10th case; their
# reading (load_graph, and prepare's streamed source) for every case
CASE_CPU_SECONDS = 1.0  # the most CPU a case may take (a long line is read up to its 1 MiB cap; most take
# ~20 ms): CPU, not wall time, which a loaded machine stretches 10-fold. A hang (a FIFO read) meets the timeout.
NODES, EDGES = 40, 120

COUNTS = ["0", "-1", "1", "39", "41", "119", "121", str(2**31), str(2**40), str(4 * 10**18), str(10**30), "1e5",
          "nan", "", "3\n4", " 40 ", "0x28"]
VALUES = ["1e18", "-5", "2.5", "inf", "-inf", "nan", "", "65536", "3e38", "1e39", "x", "1,2", "-", "1 2", "0x1",
          "99999999999999999999", "\x00", "\xff\xfe", "1-2", "+3", "1e", ".", "--1", "40", "4" * 400]
JUNK = [b"\x00", b"\xff", b",", b"\n", b"\n\n", b"-", b"nan", b"1e999", b"#", b" ", b"\r\n", b",,", b"9" * 30,
        b"\x1f\x8b"]


def csv_files(folder: Path) -> list[Path]:
    """The csv files left to spoil (not those already made folders, FIFOs or nothing)."""
    return sorted(p for p in folder.rglob("*.csv.gz") if p.is_file() and p.stat().st_size) or [
        folder / "raw" / "edge.csv.gz"]


def text_of(path: Path) -> bytes:
    try:
        with gzip.open(path, "rb") as f:
            return f.read()
    except (OSError, EOFError, zlib.error):  # spoiled already
        return b""


def write(path: Path, data: bytes) -> None:
    path.write_bytes(gzip.compress(data, compresslevel=1))


def truncate(rng, folder):
    path = rng.choice(csv_files(folder))
    data = path.read_bytes() if path.is_file() else b""
    path.write_bytes(data[: int(rng.integers(0, len(data) + 1))])
    return f"truncate {path.name}"


def corrupt(rng, folder):
    path = rng.choice(csv_files(folder))
    data = bytearray(path.read_bytes() if path.is_file() else b"")
    for i in rng.integers(0, len(data), int(rng.integers(1, 4))) if data else []:
        data[i] = int(rng.integers(0, 256))
    path.write_bytes(bytes(data))
    return f"corrupt {path.name}"


def junk(rng, folder):
    path = rng.choice(csv_files(folder))
    data = text_of(path)
    at = int(rng.integers(0, len(data) + 1))
    write(path, data[:at] + JUNK[int(rng.integers(len(JUNK)))] + data[at:])
    return f"junk in {path.name}"


def long_line(rng, folder):
    path = rng.choice(csv_files(folder))
    lines = text_of(path).split(b"\n")
    line = (b"1," if rng.random() < 0.5 else b"7") * int(rng.integers(1 << 19, 1 << 20))
    lines.insert(int(rng.integers(0, len(lines) + 1)), line)
    write(path, b"\n".join(lines))
    return f"long line in {path.name}"


def count(rng, folder):
    name = "num-node-list" if rng.random() < 0.5 else "num-edge-list"
    write(folder / "raw" / f"{name}.csv.gz", (COUNTS[int(rng.integers(len(COUNTS)))] + "\n").encode())
    return f"count in {name}"


def value(rng, folder):
    path = rng.choice(csv_files(folder))
    lines = text_of(path).decode().split("\n")
    i = int(rng.integers(0, max(1, len(lines) - 1)))
    fields = lines[i].split(",")
    fields[int(rng.integers(len(fields)))] = VALUES[int(rng.integers(len(VALUES)))]
    lines[i] = ",".join(fields)
    write(path, "\n".join(lines).encode("utf-8", "surrogateescape"))
    return f"value in {path.name}"


def lines_changed(rng, folder):
    path = rng.choice(csv_files(folder))
    lines = text_of(path).split(b"\n")
    i = int(rng.integers(0, len(lines)))
    lines = lines[:i] + lines[i + 1 :] if rng.random() < 0.5 else lines[:i] + [lines[i]] * 3 + lines[i + 1 :]
    write(path, b"\n".join(lines))
    return f"lines dropped or repeated in {path.name}"


def replaced(rng, folder):
    path = rng.choice(csv_files(folder))
    how = int(rng.integers(5))
    path.unlink(missing_ok=True)
    if how == 1:
        path.write_bytes(b"")
    elif how == 2:
        write(path, b"")
    elif how == 3:
        path.mkdir()
    elif how == 4:
        os.mkfifo(path)
    return f"{path.name}: {['missing', 'zero bytes', 'empty gzip', 'a folder', 'a FIFO'][how]}"


def extra_split(rng, folder):
    shutil.copytree(folder / "split" / "random", folder / "split" / "other", dirs_exist_ok=True)
    return "two splits"


SPOILERS = [truncate, corrupt, junk, long_line, count, value, value, lines_changed, replaced, extra_split]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return write_random_ogb(tmp_path_factory.mktemp("fuzz") / "pristine", NODES, EDGES, seed=1)


def read_streamed(folder: Path) -> None:
    """What `prepare` reads: the counts and per-vertex arrays, then every edge and feature block."""
    source = ogb_source(folder)
    for _ in source.edge_blocks(64):
        pass
    for _ in source.feature_blocks(16):
        pass


def one_line(err: str, what: str) -> None:
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, (what, err)
    assert all(line.startswith(("error: ", "warning: ")) for line in err.splitlines()), (what, err)


@pytest.mark.timeout(180)
def test_every_spoiled_folder_is_read_or_refused_in_one_line(pristine, tmp_path, capsys):
    rng = np.random.default_rng(SEED)
    outcomes = {"read": 0, "refused": 0}
    for case in range(CASES):
        folder = tmp_path / f"case{case}"
        shutil.copytree(pristine, folder)
        what = "; ".join(SPOILERS[int(i)](rng, folder) for i in rng.integers(0, len(SPOILERS), rng.integers(1, 4)))
        what = f"case {case} (seed {SEED}): {what}"
        start = time.process_time()
        codes = [read(lambda: load_graph(folder), what), read(lambda: read_streamed(folder), what)]
        if case % CLI_EVERY == 0:  # the commands themselves: exit 2 and one line, or a store
            out = tmp_path / f"store{case}"
            for argv in (["check", folder], ["prepare", folder, "-k", 2, "--out", out]):
                codes.append(main(argv))
                if codes[-1] == 2:
                    one_line(capsys.readouterr().err, what)
            assert out.exists() == (codes[-1] == 0), what
        assert len(set(codes)) == 1, (what, codes)  # check and prepare read the same folder alike
        assert time.process_time() - start < CASE_CPU_SECONDS, what
        outcomes["read" if codes[0] == 0 else "refused"] += 1
        shutil.rmtree(folder, ignore_errors=True)
    assert outcomes["refused"] > CASES // 2 and outcomes["read"] > 0, outcomes  # the spoilers do spoil, not all


def read(how, what: str) -> int:
    """0 if ``how()`` read the folder, 2 if it refused it with a one-line DorylusError; anything else raised
    is a bug and fails the test."""
    try:
        how()
        return 0
    except DorylusError as e:
        assert "\n" not in str(e) and str(e), (what, str(e))
        return 2
