"""The Python API: `from dorylus_py import train, predict, TrainConfig` runs what `dorylus train` runs and
returns what its record holds; a user's mistake raises the typed error whose message the CLI prints, in a
Python caller's words; `help(TrainConfig)` and docs/settings.md describe every setting."""

import dataclasses
import inspect
import json
import pydoc
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dorylus_py import ConfigError, DataError, DorylusError, TrainConfig, predict, train
from dorylus_py import settings_doc
from dorylus_py.cli import main
from dorylus_py.sections import SECTIONS
from dorylus_py.spelling import in_python
from dorylus_py.training.record import read_lines

DOCS = Path(__file__).resolve().parents[1] / "docs"

TIMINGS = ("wall_s", "median_epoch_s", "job_s")


def test_a_3_epoch_job_returns_the_numbers_of_the_clis_summary(graph_npz, tmp_path, capsys):
    run = train(TrainConfig(data=str(graph_npz), epochs=3, model="sage"), out=tmp_path / "api", hidden=8)
    assert run.summary == json.loads((tmp_path / "api" / "summary.json").read_text())
    assert run.metrics == read_lines(tmp_path / "api" / "metrics.jsonl") and len(run.metrics) == 3
    assert run.best_epoch == max(run.metrics, key=lambda r: (r["val_acc"], -r["epoch"]))["epoch"]
    assert run.test_acc == run.metrics[run.best_epoch - 1]["test_acc"]
    assert main(["train", "--data", str(graph_npz), "--epochs", "3", "--model", "sage", "--hidden", "8", "--quiet",
                 "--out", str(tmp_path / "cli")]) == 0
    cli = json.loads((tmp_path / "cli" / "summary.json").read_text())
    assert {k: v for k, v in run.summary.items() if k not in TIMINGS} == {k: v for k, v in cli.items()
                                                                           if k not in TIMINGS}
    assert f"at epoch {cli['best_epoch']}" in capsys.readouterr().out
    config = json.loads((tmp_path / "api" / "config.json").read_text())
    assert config["model"] == "sage" and config["hidden"] == 8 and config["epochs"] == 3
    assert run.predict().accuracy("test") == run.test_acc
    n_test = int(run.predict().graph.mask("test").sum())  # an exact ratio, as the record prints it (not float32's)
    assert run.test_acc == round(run.test_acc * n_test) / n_test and len(repr(run.test_acc)) <= 8
    np.testing.assert_array_equal(predict(run.run_dir, weights="final").logits, run.predict(weights="final").logits)


def test_a_distributed_job_runs_through_the_api(graph_npz, tmp_path):
    run = train(data=str(graph_npz), epochs=2, backend="cpu", graph_servers=2, out=tmp_path / "run")
    assert run.summary["status"] == "completed" and run.summary["backend"] == "cpu" and len(run.metrics) == 2
    assert (tmp_path / "run" / "partitions" / "manifest.json").exists()


@pytest.mark.parametrize("settings,error,python,cli", [
    ({"epochs": 0}, ConfigError, "epochs must be >= 1, got 0", "--epochs must be >= 1, got 0"),
    ({"dropout": 1.5}, ConfigError, "dropout must be in [0, 1), got 1.5", "--dropout must be in [0, 1), got 1.5"),
    ({"backend": "cpu", "graph_servers": 2, "remat": True, "mode": "async"}, ConfigError,
     'remat=True is for mode="sync" on the distributed backends', "--remat is for --mode sync on the distributed"),
    ({"data": "missing.npz"}, DataError, "missing.npz", "missing.npz"),
])
def test_a_mistake_raises_the_typed_error_with_the_clis_line_in_python_words(graph_npz, tmp_path, capsys, settings,
                                                                             error, python, cli):
    settings = {"data": str(graph_npz), "epochs": 2} | settings
    with pytest.raises(error) as raised:
        train(TrainConfig(**settings), out=tmp_path / "api")
    flags = [f"--{k.replace('_', '-')}" + ("" if v is True else f"={v}") for k, v in settings.items()]
    assert main(["train", *flags, "--quiet", "--out", str(tmp_path / "cli")]) == 2
    line = capsys.readouterr().err.removeprefix("error: ").removesuffix("\n")
    assert cli in line and python in str(raised.value) and str(raised.value) == in_python(line)
    assert "--" not in str(raised.value) and isinstance(raised.value, DorylusError)
    assert not (tmp_path / "api").exists() and not (tmp_path / "cli").exists()


@pytest.mark.parametrize("values,message", [
    ({"epochs": "abc"}, "epochs must be an integer, got 'abc'"),
    ({"epochs": 5.5}, "epochs must be an integer, got 5.5"),
    ({"lr": "fast"}, "lr must be a number, got 'fast'"),
    ({"chunks": 2.0}, "chunks must be an integer or 'auto', got 2.0"),
    ({"remat": 1}, "remat must be True or False, got 1"),
    ({"data": 7}, "data must be a string or None, got 7"),
    ({"lambdas": 0}, "lambdas must be >= 1, got 0"),
    ({"dropout": 1.5}, "dropout must be in [0, 1), got 1.5"),  # a GCN's: not attn_dropout's
    ({"model": "gat", "attn_dropout": 1.0}, "attn_dropout must be in [0, 1), got 1.0"),
    ({"epoch": 3}, "TrainConfig has no setting 'epoch' (did you mean epochs?)"),
    ({"hiden": 3}, "TrainConfig has no setting 'hiden' (did you mean hidden?)"),
    ({"zzz": 3}, "TrainConfig has no setting 'zzz' (help(TrainConfig) lists them)"),
    ({"overwrite": True}, "overwrite is a keyword of train(), not a setting: train(config, overwrite=...)"),
])
def test_a_config_checks_names_types_and_ranges_when_made(values, message):
    with pytest.raises(ConfigError) as raised:
        TrainConfig(**values)
    assert str(raised.value) == message


def test_a_config_takes_numpy_numbers_paths_and_auto_as_python_values(tmp_path):
    cfg = TrainConfig(epochs=np.int64(3), lr=np.float32(0.5), chunks="auto", lambdas=np.int32(2), data=tmp_path / "g")
    assert type(cfg.epochs) is int and type(cfg.lr) is float and cfg.lambdas == 2 and cfg.to_dict()["chunks"] == "auto"
    assert cfg.data == str(tmp_path / "g")
    json.dumps(cfg.to_dict())  # what the run record writes
    assert dataclasses.replace(cfg, epochs=4).epochs == 4


@pytest.mark.parametrize("call,message", [
    (lambda: train(data="g.npz", overwite=True), "train() has no keyword or setting 'overwite' (did you mean "
                                                 "overwrite, a keyword of train()?)"),
    (lambda: train(data="g.npz", epoch=3), "train() has no keyword or setting 'epoch' (did you mean the setting "
                                           "epochs?)"),
    (lambda: train({"epochs": 3}), "config must be a TrainConfig, got dict"),
])
def test_a_misspelt_keyword_of_train_is_named_as_one(call, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        call()


def test_help_and_the_settings_page_give_every_setting_its_default_and_meaning():
    text = pydoc.render_doc(TrainConfig, renderer=pydoc.plaintext)
    page = (DOCS / "settings.md").read_text()
    names = [f.name for section in SECTIONS.values() for f in settings_doc.documented(section)]
    assert list(inspect.signature(TrainConfig).parameters) == names and len(names) > 60
    assert inspect.signature(TrainConfig).parameters["chunks"].default == "auto"
    for section in SECTIONS.values():
        assert f"{section.__doc__} (cfg." in text
        for f in settings_doc.documented(section):
            default = settings_doc.default_of(f)
            assert f"{f.name}: {f.type} = {default!r}" in text, f.name
            assert f"| `{f.name}` |" in page and f"`{default!r}`" in page
            first_words = " ".join(settings_doc.meaning(f).split()[:4])
            assert first_words in " ".join(text.replace("|", " ").split()), (f.name, first_words)
    assert "epochs: int = 200" in text and "dropout on each layer's input" in text
    assert "attn_dropout: float | None = None" in text and "the same as dropout" in text  # a caller's words
    assert page == settings_doc.markdown(), "docs/settings.md is stale: python -m dorylus_py.settings_doc > docs/settings.md"


def test_a_run_that_fails_ends_its_record_as_the_cli_does(graph_npz, tmp_path, monkeypatch, capsys):
    from dorylus_py.models.gcn import GCN

    forward, calls = GCN.forward, []

    def failing_forward(self, *args, **kwargs):  # the fourth forward (epoch 2's evaluation) meets bad data
        calls.append(1)
        if len(calls) == 4:
            raise DataError("features.npy: row 17 is not finite")
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(GCN, "forward", failing_forward)
    with pytest.raises(DataError, match="row 17"):
        train(data=str(graph_npz), epochs=3, out=tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed: features.npy: row 17 is not finite" and summary["epochs"] == 1
    with pytest.raises(ConfigError, match=r"run folder exists and is not empty \(pass overwrite=True to replace it"):
        train(data=str(graph_npz), epochs=1, out=tmp_path / "run")
    assert main(["train", "--data", str(graph_npz), "--epochs", "1", "--out", str(tmp_path / "run")]) == 2
    assert "(pass --overwrite to replace it" in capsys.readouterr().err  # the command keeps its flags
    with pytest.raises(ConfigError, match="did you mean the setting epochs"):
        train(data=str(graph_npz), epoch=1, out=tmp_path / "other")
    assert not (tmp_path / "other").exists()


def test_importing_the_package_loads_neither_numpy_nor_torch():
    code = "import sys, dorylus_py; dorylus_py.TrainConfig; print('numpy' in sys.modules, 'torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.split() == ["False", "False"]
