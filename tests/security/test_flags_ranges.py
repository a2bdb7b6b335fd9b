"""Every flag is checked before anything is created: a number out of range, NaN, a name the OS cannot
take or an s3:// address with '..' is one line and exit 2, and no run folder is left behind."""

from __future__ import annotations

import dataclasses
import math

import pytest

from dorylus_py.config import SECTIONS, SynthConfig, TrainConfig
from dorylus_py.errors import ConfigError
from tests.security.cli import dorylus, refused

LONG = "n" * 300  # one name over NAME_MAX (255 bytes)


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    path = tmp_path_factory.mktemp("g") / "g.npz"
    assert dorylus("synth", "--out", path, "--nodes", 300, "--edges", 2000, "--features", 8, "--classes", 3).returncode == 0
    return path


@pytest.mark.parametrize("flags, words", [
    (["--hidden", 4_000_000_000], "--hidden must be <= 65,536"),
    (["--hidden", "4e9"], "--hidden"),
    (["--epochs", 10**23], "--epochs must be <= 1,000,000"),
    (["--epochs", "1e23"], "--epochs"),
    (["--lr", "nan"], "--lr: expected a finite number"),
    (["--wait-timeout-s", "1e300", "--backend", "cpu"], "--wait-timeout-s must be <="),
    (["--seed", 2**64], "--seed must be <="),
    (["--backend", "cpu", "--checkpoint-dir", "s3://bkt/a/../b"], "'..' segments"),
    (["--backend", "cpu", "--checkpoint-dir", f"ck/{LONG}"], "a name of 300 bytes"),
    (["--split-seed", -1], "--split-seed"),
    (["--train-frac", "inf"], "--train-frac"),
])
def test_train_refuses_before_creating_anything(graph, tmp_path, flags, words):
    out = tmp_path / "run"
    refused(dorylus("train", "--data", graph, "--quiet", "--out", out, *flags), words)
    assert not out.exists() and not (tmp_path / "ck").exists()


def test_a_bad_message_cap_in_the_environment_is_refused_before_anything_is_created(graph, tmp_path, monkeypatch):
    monkeypatch.setenv("DORYLUS_MAX_MESSAGE_MB", "4096")
    refused(dorylus("train", "--data", graph, "--backend", "cpu", "--quiet", "--out", tmp_path / "run"),
            "DORYLUS_MAX_MESSAGE_MB")
    assert list(tmp_path.iterdir()) == []


def test_a_name_over_255_bytes_is_one_line(graph, tmp_path):
    refused(dorylus("train", "--data", graph, "--quiet", "--out", tmp_path / LONG), "--out", "300 bytes")
    refused(dorylus("prepare", graph, "-k", 2, "--out", tmp_path / LONG / "p"), "--out", "300 bytes")
    refused(dorylus("synth", "--out", tmp_path / f"{LONG}.npz"), "--out", "304 bytes")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, words", [
    (["synth", "--nodes", 2**40], "--nodes must be <="),
    (["synth", "--edges", 10**14], "--edges must be <="),
    (["synth", "--features", 10**8], "--features must be <="),
    (["synth", "--homophily", "nan"], "--homophily"),
    (["synth", "--seed", -1], "--seed"),
    (["prepare", "-k", 10**8], "--partitions must be <= 4096"),
    (["prepare", "-k", 2, "--memory-budget", "inf"], "--memory-budget"),
    (["prepare", "-k", 2, "--seed", 2**40], "--seed"),
])
def test_synth_and_prepare_numbers_are_bounded(graph, tmp_path, argv, words):
    out = tmp_path / ("g.npz" if argv[0] == "synth" else "p")
    argv = [argv[0], *([graph] if argv[0] == "prepare" else []), "--out", out, *argv[1:]]
    refused(dorylus(*argv), words)
    assert not out.exists()


def numeric_settings():
    for section in SECTIONS.values():
        for f in dataclasses.fields(section):
            if f.metadata.get("most") is not None:
                yield f.name, f.metadata["most"], "float" in str(f.type)


@pytest.mark.parametrize("name, most, is_float", list(numeric_settings()))
def test_every_bounded_setting_refuses_past_its_bound_and_nan(name, most, is_float):
    """The sweep: each numeric setting with a bound, one past it (and NaN for floats), through the one
    typed config's check (what the CLI and the Python API both run; a Python caller reads the setting's name)."""
    past = most * 2 if is_float else int(most) + 1
    with pytest.raises(ConfigError, match=f"^{name} must be <= "):
        TrainConfig(**{name: past})
    if is_float:
        with pytest.raises(ConfigError, match=f"^{name} must be a finite number"):
            TrainConfig(**{name: math.nan})


def test_the_bounds_leave_the_defaults_valid():
    TrainConfig().check()
    SynthConfig().check()
    assert len(list(numeric_settings())) >= 30  # the sweep covers the numeric flags
