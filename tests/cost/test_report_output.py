"""What `dorylus report` writes, as a reader meets it (issue 56): one number format per column whatever the
values span, plots and report files that replace only an earlier report's (never a user's file, never without
--overwrite, no earlier timeline left behind), a price note about the prices, the work named in Dorylus's
words with a legend of the terms, and epochs marked on a timeline."""

import json
import os
import re

import pytest

from dorylus_py.cli import main
from dorylus_py.cost.report import significant
from dorylus_py.cost.task_names import NAMES
from tests.cost.test_cost import make_record


@pytest.mark.parametrize("value, text", [
    (9350, "9,350"), (51966.3, "51,970"), (1447.2, "1,447"), (0.02183, "0.02183"), (0.0026499, "0.002650"),
    (9999.7, "10,000"), (0.99996, "1.000"), (1234567, "1,235,000"), (0, "0"), (3.0, "3.000"), (1e-7, "0.0000001000"),
])
def test_significant_digits_never_an_exponent(value, text):
    assert significant(4)(value) == text


def _record(tmp_path, name, wall_s, gb_ms=2000):
    """A local run whose wall time and Lambda bill differ from the others' by orders of magnitude."""
    d = make_record(tmp_path / name)
    rows = [json.loads(line) | {"wall_s": wall_s * e / 2} for e, line in
            enumerate((d / "metrics.jsonl").read_text().splitlines(), 1)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = [json.loads(line) | {"billed_ms": gb_ms} for line in (d / "tasks.jsonl").read_text().splitlines()]
    (d / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return d


def test_each_column_has_one_format_for_values_orders_of_magnitude_apart(tmp_path, capsys):
    """The issue's table showed `9350` above `5.197e+04` in one column: runs of 2 s and of 3 days side by side."""
    runs = [_record(tmp_path, "short", 2.0, 20), _record(tmp_path, "day", 3600.0), _record(tmp_path, "long", 259_200.0)]
    assert main(["report", *map(str, runs), "--target-acc", "0.3"]) == 0
    head, *rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    columns = {name: [r[i] for r in rows] for i, name in enumerate(
        ["run", "backend", "mode", "status", "epochs", "best", "test", "model", "wall", "epoch", "target", "calls",
         "gbs", "relaunches", "servers", "lambda", "transfer", "total", "value"])}
    assert not any(re.search(r"\de[-+]?\d", c) for r in rows for c in r), rows  # no exponent anywhere
    assert columns["wall"] == ["2.0", "3,600.0", "259,200.0"] and columns["target"] == ["2.0", "3,600.0", "259,200.0"]
    sig4 = re.compile(r"^(0|0\.0*[1-9]\d{3}|[1-9](\d|,)*(\.\d+)?)$")  # four significant digits, thousands separated
    for name in ("servers", "lambda", "transfer", "total", "value"):
        for text in columns[name]:
            assert sig4.match(text) and len(re.sub(r"^0\.0*|[.,]", "", text).rstrip("0") or "0") <= 4, (name, text)
    assert float(columns["value"][0].replace(",", "")) > 1e6 > 1 > float(columns["value"][2].replace(",", ""))


def _plots(tmp_path, *runs, more=()):
    return main(["report", *map(str, runs), "--plots", str(tmp_path / "plots"), *more])


def test_plots_and_report_files_are_not_written_over_without_overwrite(tmp_path, capsys):
    a = _timelined(tmp_path, "a")
    html, md = tmp_path / "r.html", tmp_path / "r.md"
    assert _plots(tmp_path, a, more=["--html", str(html), "--markdown", str(md)]) == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "plots").iterdir()} | {"html": html.read_bytes()}
    capsys.readouterr()
    for more in (["--plots", str(tmp_path / "plots")], ["--html", str(html)], ["--markdown", str(md)]):
        assert main(["report", str(a), *more]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and "pass --overwrite to replace" in err, err
    assert {p.name: p.read_bytes() for p in (tmp_path / "plots").iterdir()} | {"html": html.read_bytes()} == before
    assert main(["report", str(a), "--plots", str(tmp_path / "empty")]) == 0  # a new folder, or an empty one
    (tmp_path / "empty2").mkdir()
    assert main(["report", str(a), "--plots", str(tmp_path / "empty2")]) == 0


def _timelined(tmp_path, name):
    d = make_record(tmp_path / name)
    rows = [json.loads(line) for line in (d / "tasks.jsonl").read_text().splitlines()]
    for r, (server, chunk, epoch) in zip(rows, [(0, 0, 1), (0, 1, 1), (0, None, 2)]):
        r.update(server=server, chunk=chunk, epoch=epoch, layer=0)
    (d / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def test_overwrite_replaces_only_the_plots_it_wrote_and_leaves_no_earlier_timeline(tmp_path, capsys):
    a, b = _timelined(tmp_path, "a"), _timelined(tmp_path, "b")
    plots = tmp_path / "plots"
    html = plots / "report.html"  # a report kept beside its plots is one of them
    assert _plots(tmp_path, a, b, more=["--html", str(html)]) == 0
    assert sorted(p.name for p in plots.iterdir()) == ["accuracy_vs_cost.png", "accuracy_vs_time.png", "report.html",
                                                       "timeline_a.png", "timeline_b.png"]
    assert oct(plots.stat().st_mode & 0o777) == oct(0o777 & ~_umask())  # an ordinary folder, not mkdtemp's 0700
    assert _plots(tmp_path, a, more=["--html", str(html), "--overwrite"]) == 0
    assert sorted(p.name for p in plots.iterdir()) == ["accuracy_vs_cost.png", "accuracy_vs_time.png", "report.html",
                                                       "timeline_a.png"]  # b's timeline went with the rest
    capsys.readouterr()
    assert _plots(tmp_path, a, more=["--overwrite"]) == 2  # the report beside them, unless it is rewritten too
    assert "holds 1 file(s) that are not a report's plots (report.html)" in capsys.readouterr().err
    (plots / "notes.txt").write_text("mine")
    before = sorted(p.name for p in plots.iterdir())
    assert _plots(tmp_path, a, more=["--html", str(html), "--overwrite"]) == 2  # a file it did not write: refused whole
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds 1 file(s) that are not a report's plots (notes.txt)" in err, err
    assert sorted(p.name for p in plots.iterdir()) == before and (plots / "notes.txt").read_text() == "mine"
    (plots / "notes.txt").unlink()
    (plots / "link.png").symlink_to(plots / "timeline_a.png")
    assert _plots(tmp_path, a, more=["--overwrite"]) == 2 and "link.png" in capsys.readouterr().err


def test_overwrite_replaces_a_report_file_only_if_it_is_a_report(tmp_path, capsys):
    a = _timelined(tmp_path, "a")
    for flag, name in (("--html", "r.html"), ("--markdown", "r.md")):
        path = tmp_path / name
        path.write_text("<html>my own page</html>\n")
        assert main(["report", str(a), flag, str(path), "--overwrite"]) == 2
        assert "exists and is not" in capsys.readouterr().err and path.read_text() == "<html>my own page</html>\n"
        path.unlink()
        assert main(["report", str(a), flag, str(path)]) == 0
        assert main(["report", str(a), flag, str(path), "--overwrite"]) == 0  # its own: replaced
    assert main(["report", str(a), "--html", str(tmp_path / "no" / "r.html")]) == 2
    assert "no such folder" in capsys.readouterr().err


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_no_internal_wording_in_the_report_and_the_price_note_is_about_the_prices(tmp_path, capsys):
    """Every kind of work a record can hold is named in Dorylus's words, with the terms it uses explained."""
    d = make_record(tmp_path / "every")
    rows = [{"kind": kind, "train": train, "where": "graph-server", "billed_ms": 0, "memory_mb": 0, "start": i,
             "end": i + 0.5} for i, (kind, train) in enumerate(NAMES)]
    (d / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = tmp_path / "r.md"
    assert main(["report", str(d), "--markdown", str(md)]) == 0
    text = md.read_text()
    internal = {kind for kind, _ in NAMES} - {"loss"}  # "loss" is the user's word too
    cells = {c.strip() for line in text.splitlines() if line.startswith("|") for c in line.split("|")}
    assert not cells & internal, cells & internal
    assert not re.search(r"\b[a-z]+_[a-z]+\b", text.replace("Value = ", "")), re.findall(r"\b[a-z]+_[a-z]+\b", text)
    for term in ("| Gather | a graph server sums", "| ApplyVertex | a chunk's rows times",
                 "| Scatter | a server sends"):
        assert term in text
    note = text.splitlines()[2]
    assert note.startswith("Runs priced as if on AWS, at the prices for us-east-1 from AWS's public on-demand price "
                           "lists (EC2 Linux instances, AWS Lambda), as of 2025-06")
    assert "$0.0000166667 per GB-second and $0.20 per million requests" in note and "session" not in note


def test_a_timeline_marks_each_epoch_and_names_its_lanes(tmp_path):
    from dorylus_py.cost.plots import timeline_figure

    tasks = [{"kind": "fwd", "train": True, "where": "local-lambda", "server": 0, "chunk": 0, "epoch": e,
              "start": 10.0 + 3 * e, "end": 11.0 + 3 * e} for e in (1, 2, 3)]
    tasks += [{"kind": "gather", "train": True, "where": "graph-server", "server": 1, "chunk": None, "epoch": 2,
               "start": 16.5, "end": 17.0}]
    fig = timeline_figure("r", tasks)
    fig.canvas.draw()
    ax = fig.axes[0]
    (top,) = ax.child_axes  # the epochs' axis above the bars
    assert [t.get_text() for t in top.get_xticklabels()] == ["epoch 1", "epoch 2", "epoch 3"]
    assert list(top.get_xticks()) == [0.0, 3.0, 6.0]  # each epoch's first task, from the first task
    assert [round(line.get_xdata()[0], 6) for line in ax.get_lines()] == [0.0, 3.0, 6.0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["server 0, chunk 0", "server 1, graph"]
    worker = timeline_figure("g", [{"kind": "batch", "train": True, "where": "worker", "server": 3, "chunk": None,
                                    "epoch": 1, "start": 0.0, "end": 1.0}])
    assert [t.get_text() for t in worker.axes[0].get_yticklabels()] == ["worker 3"]
    assert [t.get_text() for t in worker.legends[0].get_texts()] == ["mini-batch"]
