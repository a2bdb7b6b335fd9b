"""Run records and price tables are input like any other (issue 52, item 7): whoever wrote them (a shared
folder, a colleague's run, a downloaded price list) must not make `report`, `cost estimate`, `predict`,
`export` or `--resume` crash, hang or take the machine. Each hostile file is one line naming the file and
the field, exit 2, with nothing printed or written before it."""

from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path

import pytest

from dorylus_py.cli import main
from tests.cluster.fuzz_corpus import hypothesis_values
from tests.security.cli import dorylus, refused
from tests.security.records import FILES, Raw, deep, dumps, edit_json, replace_with, write_record

REPORT = ["report", "{r}"]
SERVERS = ["report", "{r}", "--servers"]
PLOTS = ["report", "{r}", "--plots", "{r}/plots"]
CALIBRATE = ["cost", "estimate", "--calibration", "{r}", "--nodes", 1000, "--edges", 8000, "--features", 16,
             "--classes", 4]
PRICED = [["report", "{r}", "--prices", "{p}"], ["cost", "estimate", "--prices", "{p}", "--nodes", 1000, "--edges",
                                                  8000, "--features", 16, "--classes", 4]]


def fields(**values):
    return lambda path: edit_json(path, lambda v: v | values)


def without(name):
    return lambda path: edit_json(path, lambda v: {k: x for k, x in v.items() if k != name})


def whole(value):
    return lambda path: edit_json(path, lambda v: value)


# (file, change, words the error line holds beside the file's name, commands that must refuse it)
RECORD_CASES = {
    "config a folder": ("config.json", "folder", "is a folder", [REPORT, CALIBRATE]),
    "config a list": ("config.json", whole([1, 2]), "is a list, not a JSON object", [REPORT, CALIBRATE]),
    "config nested 100k deep": ("config.json", fields(graph=deep()), "nested 100001 deep", [REPORT, CALIBRATE]),
    "config a 5,000-digit int": ("config.json", fields(graph_servers=Raw("9" * 5000)), "out of range", [REPORT]),
    "config servers a string": ("config.json", fields(graph_servers="two"), "graph_servers", [REPORT, CALIBRATE]),
    "config no servers": ("config.json", fields(weight_servers=0), "--weight-servers", [REPORT, CALIBRATE]),
    "config model a list": ("config.json", fields(model=["gcn"]), "model must be a string", [REPORT]),
    "config dilation NaN": ("config.json", fields(dilation=Raw("NaN")), "dilation", [REPORT, CALIBRATE]),
    "config graph counts": ("config.json", fields(graph={"nodes": -5}), "graph.nodes", [REPORT, CALIBRATE]),
    "config sources": ("config.json", fields(sources="x"), "sources", [REPORT]),
    "config a FIFO": ("config.json", "fifo", "is a FIFO", [REPORT, CALIBRATE]),
    "config not UTF-8": ("config.json", b"\xff\xfe\xfa{", "not valid JSON", [REPORT]),
    "config empty": ("config.json", b"", "not valid JSON", [REPORT]),
    "config 17 MiB": ("config.json", lambda p: p.write_bytes(b" " * (17 * 2**20)), "bytes, more than", [REPORT]),
    "metrics a bare number": ("metrics.jsonl", whole(5), ":2: is a number, not a JSON object", [REPORT, CALIBRATE]),
    "metrics a list": ("metrics.jsonl", whole([1]), ":2: is a list", [REPORT]),
    "metrics lacks keys": ("metrics.jsonl", whole({"epoch": 2}), ":2: no loss", [REPORT, CALIBRATE]),
    "metrics string accuracy": ("metrics.jsonl", fields(val_acc="0.5"), ":2: val_acc", [REPORT]),
    "metrics accuracy 7": ("metrics.jsonl", fields(val_acc=7), "val_acc must be in [0, 1]", [REPORT]),
    "metrics bool epoch": ("metrics.jsonl", fields(epoch=True), ":2: epoch is True", [REPORT]),
    "metrics 5,000 digits": ("metrics.jsonl", fields(epoch=Raw("9" * 5000)), ":2: number 9999", [REPORT]),
    "metrics nested deep": ("metrics.jsonl", fields(servers=deep()), ":2: nested", [REPORT]),
    "metrics negative wall": ("metrics.jsonl", fields(wall_s=-1), "wall_s must be in [0, 1e+12], got -1", [REPORT]),
    "metrics server bytes": ("metrics.jsonl", fields(servers=[{"bytes": "x"}]), "servers[0].bytes", [CALIBRATE]),
    "metrics /dev/zero": ("metrics.jsonl", "device", "is a device", [REPORT]),
    "metrics a 2 MiB line": ("metrics.jsonl", lambda p: p.write_bytes(b"[" + b"0," * 2**20), ":1: a line longer",
                             [REPORT]),
    "summary a list": ("summary.json", whole([]), "is a list", [REPORT, CALIBRATE]),
    "summary status a number": ("summary.json", fields(status=5), "status is 5, not str", [REPORT]),
    "summary accuracy a string": ("summary.json", fields(best_val_acc="high"), "best_val_acc", [REPORT]),
    "summary wall Infinity": ("summary.json", fields(wall_s=Raw("Infinity")), "wall_s must be a finite", [REPORT]),
    "summary a folder": ("summary.json", "folder", "is a folder", [REPORT]),
    "tasks a bare number": ("tasks.jsonl", whole(7), ":2: is a number", [REPORT, CALIBRATE]),
    "tasks no kind": ("tasks.jsonl", without("kind"), ":2: no kind", [REPORT]),
    "tasks kind a list": ("tasks.jsonl", fields(kind=["fwd"]), ":2: kind", [REPORT]),
    "tasks start a string": ("tasks.jsonl", fields(start="0"), ":2: start", [REPORT]),
    "tasks Lambda unbilled": ("tasks.jsonl", without("billed_ms"), ":2: no billed_ms", [REPORT]),
    "tasks billed NaN": ("tasks.jsonl", fields(billed_ms=Raw("NaN")), "billed_ms must be a finite", [REPORT]),
    "tasks train a string": ("tasks.jsonl", fields(train="yes"), ":2: train", [REPORT]),
    "tasks chunk negative": ("tasks.jsonl", fields(chunk=-1), ":2: chunk", [REPORT]),
    "tasks no epoch": ("tasks.jsonl", without("epoch"), ":2: no epoch (the timeline", [PLOTS]),
    "tasks layer 99": ("tasks.jsonl", fields(layer=99), "a task of layer 99", [CALIBRATE]),
    "log bytes a string": ("logs/graph-server-0.log",
                           lambda p: p.write_text(p.read_text().replace('"bytes_sent": 17615716', '"bytes_sent": "x"')),
                           ":3: bytes_sent", [SERVERS]),
    "log start nested": ("logs/graph-server-0.log", fields(peers=deep()), ":1: nested", [SERVERS]),
    "log vertices a string": ("logs/graph-server-0.log", fields(vertices="many"), ":1: vertices", [SERVERS]),
    "log a FIFO": ("logs/graph-server-0.log", "fifo", "is a FIFO", [SERVERS]),
}

PRICES_JSON = (Path(__file__).parents[2] / "dorylus_py" / "cost" / "prices.json").read_bytes()
PRICES = json.loads(PRICES_JSON)
EAST = PRICES["regions"]["us-east-1"]


def region(**values):
    return PRICES | {"regions": {"us-east-1": EAST | values}}


PRICE_CASES = {
    "a list": ([PRICES], "is a list, not a JSON object"),
    "regions a list": (PRICES | {"regions": ["us-east-1"]}, "regions is"),
    "region a number": (PRICES | {"regions": {"us-east-1": 1}}, "regions.us-east-1 is 1, not object"),
    "no Lambda prices": (PRICES | {"regions": {"us-east-1": {"ec2_hourly": EAST["ec2_hourly"]}}},
                         "no regions.us-east-1.lambda"),
    "EC2 prices a list": (region(ec2_hourly=[0.34]), "ec2_hourly is"),
    "a price a string": (region(ec2_hourly={"c5.2xlarge": "0.34"}), "ec2_hourly.c5.2xlarge is '0.34'"),
    "GB-second a string": (region(**{"lambda": EAST["lambda"] | {"x86_gb_second": "abc"}}), "x86_gb_second"),
    "negative request price": (region(**{"lambda": EAST["lambda"] | {"per_request": -1}}), "per_request must be"),
    "a NaN price": (region(ec2_hourly={"c5.2xlarge": Raw("NaN")}), "must be a finite number"),
    "a 5,000-digit price": (region(ec2_hourly={"c5.2xlarge": Raw("9" * 5000)}), "out of range"),
    "nested deep": (PRICES | {"source": deep()}, "nested 100001 deep"),
    "a folder": ("folder", "is a folder"),
    "a FIFO": ("fifo", "is a FIFO"),
}


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    return write_record(tmp_path_factory.mktemp("records") / "run")


@pytest.fixture()
def record(template, tmp_path) -> Path:
    return Path(shutil.copytree(template, tmp_path / "run", symlinks=True))


def cli(capsys, command, r: Path, p: Path | None = None) -> tuple[int, str, str]:
    code = main([str(a).format(r=r, p=p) for a in command])
    out, err = capsys.readouterr()
    return code, out, err


def refused_here(result, name: str, *words: str) -> str:
    """In-process: exit 2, nothing on stdout, one error line naming ``name`` and holding ``words``."""
    code, out, err = result
    line = err.strip()
    assert code == 2 and out == "", (code, out[-500:], err[-500:])
    assert line.startswith("error: ") and "\n" not in line and "Traceback" not in line, line
    assert name in line and all(w in line for w in words), (name, words, line)
    return line


def break_file(path: Path, change) -> None:
    if callable(change):
        change(path)
    else:
        replace_with(path, change)


def test_the_valid_record_reads_everywhere(record, capsys):
    """The record the cases break is whole: every command that reads it succeeds."""
    for command in (REPORT, SERVERS, CALIBRATE):
        code, out, err = cli(capsys, command, record)
        assert code == 0, err
    assert "72" in cli(capsys, REPORT, record)[1]  # its Lambda calls (the resize row is no call)


@pytest.mark.parametrize("name, change", [
    ("summary.json", fields(wall_s=5e-324)),  # an hour of it underflows to 0: the value is NaN, not a crash
    ("summary.json", fields(wall_s=1e12, status="failed: " + "x" * 9000)),
    ("metrics.jsonl", fields(loss=Raw("NaN"), val_acc=Raw("NaN"))),  # a diverged run, a split of no vertices
    ("tasks.jsonl", fields(billed_ms=1e15, memory_mb=2**30)),
    ("config.json", fields(graph_servers=64, future_setting={"a": [1]})),  # a newer version's field: read past
])
def test_extreme_but_valid_values_still_report(record, capsys, name, change):
    change(record / name)
    for command in (REPORT, CALIBRATE):
        code, out, err = cli(capsys, command, record)
        assert code == 0 and err == "", err


@pytest.mark.parametrize("case", RECORD_CASES)
def test_a_hostile_record_file_is_one_line(record, capsys, case):
    name, change, words, commands = RECORD_CASES[case]
    break_file(record / name, change)
    t0 = time.perf_counter()
    for command in commands:
        refused_here(cli(capsys, command, record), Path(name).name, words)
    assert time.perf_counter() - t0 < 30  # no hang, no quadratic read (a FIFO, /dev/zero, 100k brackets)
    assert not (record / "plots").exists()


@pytest.mark.parametrize("case", PRICE_CASES)
def test_a_hostile_price_file_is_one_line(record, tmp_path, capsys, case):
    table, words = PRICE_CASES[case]
    prices = tmp_path / "prices.json"
    replace_with(prices, table if isinstance(table, str) else dumps(table))
    for command in PRICED:
        refused_here(cli(capsys, command, record, prices), "prices.json", words)


def test_predict_export_and_resume_refuse_a_hostile_config(record, tmp_path, capsys):
    """Deep JSON broke predict and export too; --resume reads the same file."""
    edit_json(record / "config.json", lambda v: v | {"graph": deep()})
    refused_here(cli(capsys, ["predict", "{r}", "--out", tmp_path / "p.npy"], record), "config.json", "nested")
    refused_here(cli(capsys, ["export", "{r}", tmp_path / "m.pt", "--to", "torch"], record), "config.json", "nested")
    replace_with(record / "config.json", b"[]")
    refused_here(cli(capsys, ["train", "--resume", "{r}"], record), "config.json", "is a list")
    assert not (tmp_path / "p.npy").exists() and not (tmp_path / "m.pt").exists()


def test_the_real_cli_refuses_a_fifo(record):
    """As a user runs it: a FIFO for config.json (nothing writes to it) does not hang `dorylus report`."""
    replace_with(record / "config.json", "fifo")
    refused(dorylus("report", record, timeout=60), "config.json: is a FIFO, not a regular file")


# --- seeded fuzz --------------------------------------------------------------------------------------

# what JSON cannot say by accident: edges of the number line, long text, deep nesting; and hypothesis's values
HOSTILE = [None, True, False, 0, -1, 1, 2**63 + 1, 1e308, -1e308, 5e-324, "", "x" * 20_000, "fwd", [], {}, [1, "a"],
           {"a": {"b": []}}, Raw("NaN"), Raw("-Infinity"), Raw("9" * 5000), Raw("1e400"), deep(40), deep(20_000)]


def mutate(rng: random.Random, path: Path) -> str:
    """One random change to ``path``: a value somewhere in its JSON replaced or dropped, the text cut or a
    byte changed, or the file made something else. Returns what it did."""
    roll = rng.random()
    if roll < 0.05:
        kind = rng.choice(["folder", "fifo", "device", b"", b"\x00" * 64])
        replace_with(path, kind)
        return f"replaced by {kind!r:.20}"
    if roll < 0.2:
        data = bytearray(path.read_bytes())
        at = rng.randrange(len(data))
        if rng.random() < 0.5:
            del data[at:]
        else:
            data[at] = rng.choice(b'{}[]",:0-9eE\n\\')
        path.write_bytes(bytes(data))
        return f"byte {at} changed or cut"
    value, how = rng.choice(HOSTILE if rng.random() < 0.6 else hypothesis_values(200, 52)), rng.random()

    def edit(v, depth=0):
        if isinstance(v, dict) and v and (depth == 0 or rng.random() < 0.6):
            key = rng.choice(sorted(v))
            if how < 0.15:
                return {k: x for k, x in v.items() if k != key}
            return v | {key: edit(v[key], depth + 1)}
        if isinstance(v, list) and v and rng.random() < 0.6:
            i = rng.randrange(len(v))
            return v[:i] + [edit(v[i], depth + 1)] + v[i + 1:]
        return value

    edit_json(path, edit)
    return f"a value set to {str(getattr(value, 'text', value))[:20]!r} or dropped"


def test_seeded_fuzz_over_records_and_prices(template, tmp_path, capsys):
    """Random single changes to one file of a valid record or price table: every command that reads it
    either reads it (exit 0) or says in one line which file is wrong (exit 2); nothing else, ever."""
    rng = random.Random(52)
    r = Path(shutil.copytree(template, tmp_path / "run", symlinks=True))
    p = tmp_path / "prices.json"
    outcomes = {0: 0, 2: 0}
    for i in range(100):
        target = rng.choice([*FILES, "prices.json"])
        path = p if target == "prices.json" else r / target
        replace_with(path, PRICES_JSON if target == "prices.json" else (template / target).read_bytes())
        what = mutate(rng, path)
        commands = ([PRICED[i % 2]] if target == "prices.json" else [SERVERS] if target.startswith("logs")
                    else [REPORT, CALIBRATE] if i % 3 == 0 else [REPORT])
        for command in commands:
            code, out, err = cli(capsys, command, r, p)
            assert code in (0, 2), (target, what, err[-2000:])
            if code == 2:
                refused_here((code, out, err), path.name)
            outcomes[code] += 1
        replace_with(path, PRICES_JSON if target == "prices.json" else (template / target).read_bytes())
    assert outcomes[2] > 40 and outcomes[0] > 20, outcomes  # the fuzz reaches both: broken and still readable
