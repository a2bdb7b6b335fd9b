"""``--offload auto``: a local job sends its wide layer's ApplyVertex to Lambdas and runs the tasks that move
more bytes than they compute on (the narrow layer, the loss, evaluation) in a thread of each graph server,
with the same losses as ``--offload all``; which tasks go where follows the model's FLOPs a byte."""

import json
from collections import Counter

import numpy as np

from dorylus_py.config import TrainConfig
from dorylus_py.data import SynthConfig, generate
from dorylus_py.models import spec_of
from dorylus_py.pipeline.stages import vertex_stages
from dorylus_py.sections import OFFLOAD_FLOPS_PER_BYTE
from graph_servers.workers import tasks_here
from tests.cluster.test_fused import losses, run


def test_the_wide_layer_goes_to_lambdas_and_the_rest_stays_on_dorylus_reddit_shape():
    cfg = TrainConfig(backend="local", offload="auto", hidden=128, fuse="off")
    model = spec_of(cfg, (602, 128, 41))
    assert model.link_intensity("fwd", 0) > 4 * OFFLOAD_FLOPS_PER_BYTE  # 301 FLOPs a byte: a Lambda's
    assert model.link_intensity("fwd", 1) < OFFLOAD_FLOPS_PER_BYTE / 2  # about 16
    here = tasks_here(model, vertex_stages(2), cfg)
    assert ("fwd", 0) not in here and ("bwd", 0) not in here
    assert {("fwd", 1), ("bwd", 1), ("loss", 1), ("eval", 1)} <= here
    assert tasks_here(model, vertex_stages(2), TrainConfig(backend="local", hidden=128)) == frozenset()  # all
    assert ("fwd", 0) in tasks_here(model, vertex_stages(2), TrainConfig(backend="cpu", hidden=128))  # every one


def test_a_job_with_offload_auto_splits_its_tasks_and_learns_the_same(tmp_path):
    """256 features (128 FLOPs a byte at layer 0) and 4 classes: layer 0's tasks go, layer 1's stay."""
    graph = generate(SynthConfig(nodes=600, edges=6_000, features=256, classes=4, seed=3))
    auto = run(graph, tmp_path, "auto", backend="local", offload="auto", fuse="off")
    every = run(graph, tmp_path, "all", backend="local", offload="all", fuse="off")
    np.testing.assert_allclose(losses(auto), losses(every), rtol=1e-5)
    rows = [json.loads(line) for line in (tmp_path / "auto" / "tasks.jsonl").read_text().splitlines()]
    where = Counter((r["kind"], r["layer"], r["where"]) for r in rows if "lease" in r and r["ok"])
    model = spec_of(TrainConfig(), (256, TrainConfig().hidden, 4))
    for (kind, layer, at), n in where.items():
        lambda_task = model.link_intensity(kind, layer) >= OFFLOAD_FLOPS_PER_BYTE
        assert at == ("local-lambda" if lambda_task else "inproc-cpu"), (kind, layer, at, n)
    assert {(kind, layer) for kind, layer, at in where if at == "local-lambda"} == {("fwd", 0), ("bwd", 0)}
    assert all(r["where"] == "local-lambda" for r in (tmp_path / "auto" / "leases.jsonl").read_text().splitlines()
               for r in [json.loads(r)])
