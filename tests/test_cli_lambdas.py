"""The Lambda pool flags (``--lambdas N|auto``, ``--lambdas-min``, ``--lambdas-max``,
``--lambda-bandwidth-mbps``, ``--row-cache-mb``): parsed into the typed
config, kept typed across processes (the job spec), shared out among graph servers, and every mistake one
line with exit code 2."""

import pytest

from dorylus_py.cli import build_parser, main
from dorylus_py.config import SECTION_OF, TrainConfig
from dorylus_py.plan import lambda_share, plan
from dorylus_py.protocol import ProtocolError
from dorylus_py.serving.job import JobSpec
from dorylus_py.settings import AUTO


def config_of(*argv) -> TrainConfig:
    args = build_parser().parse_args(["train", *argv])
    return TrainConfig(**{k: v for k, v in vars(args).items() if k in SECTION_OF})


def chunks_of(cfg: TrainConfig, nodes: int) -> int:
    """The run plan's chunk count for a graph of ``nodes`` vertices (an even split)."""
    return plan(cfg, 1, 1, nodes).config.chunks


def test_auto_and_its_bounds_parse_into_the_config_and_survive_the_wire():
    cfg = config_of("--backend", "local", "--lambdas", "auto", "--lambdas-min", "4", "--lambdas-max", "12")
    cfg.check()
    assert (cfg.lambdas, cfg.lambdas_min, cfg.lambdas_max) == (AUTO, 4, 12)
    spec = JobSpec(cfg, "parts", "none", [16, 4], [0, 10], [1, 1], graph_servers=["a", "b"])
    again = JobSpec.from_wire(spec.to_wire())
    assert again.config == cfg and lambda_share(again.config, 2) == (2, 2, 6)  # starts at its fewest
    assert lambda_share(config_of("--lambdas", "6"), 4) == (1, 1, 1)  # at least one each
    assert lambda_share(config_of("--lambdas", "6"), 2) == (3, 3, 3)
    with pytest.raises(ProtocolError, match="lambdas"):
        JobSpec.from_wire(spec.to_wire() | {"config": cfg.to_dict() | {"lambdas": [4]}})


@pytest.mark.parametrize("argv, message", [
    (["--lambdas", "many"], "argument --lambdas: expected a number or auto, got 'many'"),
    (["--backend", "local", "--lambdas", "0"], "--lambdas must be >= 1, got 0"),
    (["--backend", "local", "--lambdas", "auto", "--lambdas-min", "0"], "--lambdas-min must be >= 1, got 0"),
    (["--backend", "local", "--lambdas", "auto", "--lambdas-min", "8", "--lambdas-max", "4"],
     "--lambdas-max (4) is below --lambdas-min (8)"),
    (["--backend", "cpu", "--lambdas", "auto"], "--lambdas auto sizes Lambda pools (--backend local or lambda)"),
    (["--lambdas", "auto"], "--lambdas auto sizes Lambda pools (--backend local or lambda); --backend reference has none"),
    (["--mode", "gossip", "--lambdas", "auto"], "--lambdas auto sizes Lambda pools"),
    (["--backend", "local", "--lambda-bandwidth-mbps", "-5"], "--lambda-bandwidth-mbps must be >= 0, got -5.0"),
    (["--backend", "cpu", "--lambda-bandwidth-mbps", "200"], "--lambda-bandwidth-mbps caps the links of emulated Lambdas"),
    (["--backend", "local", "--row-cache-mb", "-1"], "--row-cache-mb must be >= 0, got -1"),
    (["--backend", "gpu", "--row-cache-mb", "100"], "--row-cache-mb is for Lambda containers"),
    (["--backend", "local", "--row-cache-mb", "512", "--lambda-memory-mb", "512"], "leaves no room in a Lambda"),
    (["--row-cache-mb", "1.5"], "argument --row-cache-mb: invalid int value"),
])
def test_pool_flag_mistakes_are_one_line_exit_2(tmp_path, capsys, argv, message):
    code = main(["train", "--out", str(tmp_path / "run"), "--epochs", "1", *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()


def test_help_lists_the_pool_flags(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert "Lambda pool" in out and "--lambdas N|auto" in out and "--lambdas-max N" in out
    assert "--lambda-bandwidth-mbps MBPS" in out and "--row-cache-mb MB" in out


def test_the_row_cache_is_on_for_lambda_containers_only_and_survives_the_wire():
    assert config_of("--backend", "local").resolved_row_cache_mb() == 3008 // 4
    assert config_of("--backend", "lambda", "--lambda-memory-mb", "1024").resolved_row_cache_mb() == 256
    assert config_of("--backend", "local", "--row-cache-mb", "0").resolved_row_cache_mb() == 0
    assert config_of("--backend", "cpu").resolved_row_cache_mb() == 0
    assert config_of("--backend", "cpu", "--row-cache-mb", "0").resolved_row_cache_mb() == 0  # off is fine anywhere
    cfg = config_of("--backend", "local", "--row-cache-mb", "64")
    cfg.check()
    spec = JobSpec(cfg, "parts", "none", [16, 4], [0, 10], [1, 1])
    assert JobSpec.from_wire(spec.to_wire()).config.row_cache_mb == 64
    with pytest.raises(ProtocolError, match="row_cache_mb"):
        JobSpec.from_wire(spec.to_wire() | {"config": cfg.to_dict() | {"row_cache_mb": "64"}})


def test_chunks_auto_is_one_wave_of_tasks_in_sync_mode_and_a_pipeline_in_async():
    from dorylus_py.plan import AUTO_CHUNK_ROWS, chunks_per_server

    assert config_of().chunks is AUTO
    assert chunks_of(config_of("--backend", "local"), 200_000) == 2  # 4 Lambdas over 2 servers
    assert chunks_of(config_of("--backend", "lambda", "--lambdas", "32"), 200_000) == 16
    assert chunks_of(config_of("--backend", "cpu"), 200_000) == 1  # torch spreads one task over the cores
    assert chunks_of(config_of("--backend", "local", "--mode", "async"), 200_000) == 2  # as sync: one per Lambda
    assert chunks_of(config_of("--backend", "cpu", "--mode", "async"), 200_000) == 4
    assert chunks_of(config_of("--backend", "local", "--lambdas", "auto"), 200_000) == 4  # the pool resizes
    assert chunks_of(config_of("--backend", "local", "--chunks", "3"), 200_000) == 3
    # rows cap, rounded up to whole waves; never more chunks than rows
    assert chunks_per_server("local", "sync", 2, 5_000_000) == 34
    assert chunks_per_server("local", "sync", 4, 5_000_000) == 36
    assert chunks_per_server("cpu", "sync", None, AUTO_CHUNK_ROWS + 1) == 2
    assert chunks_per_server("local", "sync", 8, 3) == 3
    assert chunks_of(config_of("--backend", "local", "-k", "4"), 10) == 1  # 4 Lambdas over 4 servers


def test_chunks_auto_is_resolved_into_the_record(graph_npz, tmp_path):
    run = tmp_path / "run"
    assert main(["train", "--backend", "local", "--data", str(graph_npz), "-k", "2", "--lambdas", "6", "--epochs", "1",
                 "--out", str(run)]) == 0
    import json

    assert json.loads((run / "config.json").read_text())["chunks"] == 3
    chunks = {(t["server"], t["chunk"]) for t in map(json.loads, (run / "tasks.jsonl").read_text().splitlines())
              if t["kind"] == "fwd"}
    assert chunks == {(s, c) for s in (0, 1) for c in range(3)}


@pytest.mark.parametrize("argv, message", [
    (["--chunks", "some"], "argument --chunks: expected a number or auto, got 'some'"),
    (["--backend", "local", "--chunks", "-1"], "--chunks must be >= 1, got -1"),
    (["--chunks", "0"], "--chunks must be >= 1, got 0"),  # the reference backend has no chunks, but 0 is wrong anywhere
])
def test_chunks_mistakes_are_one_line_exit_2(tmp_path, capsys, argv, message):
    code = main(["train", "--out", str(tmp_path / "run"), "--epochs", "1", *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and message in err and err.count("\n") == 1, err
