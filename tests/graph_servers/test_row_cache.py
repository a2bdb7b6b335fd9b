"""The graph server's side of the static-row cache: a pull that names the server's own token for the
chunk's input features gets them no more (and the server's byte counters say so); a wrong, forged or
other chunk's token gets the rows; a malformed ``have`` is refused with an error and the server keeps
serving. The worker's side is in ``tests/worker/test_row_cache.py``."""

import numpy as np
import pytest

from dorylus_py.pipeline.events import TaskKey
from dorylus_py.protocol import ProtocolError
from graph_servers.task_io import has_static
from graph_servers.wire import MAX_HELD, held_tokens
from tests.clients import driver  # noqa: F401  (a fixture)
from tests.cluster.fuzz_corpus import hypothesis_values
from tests.graph_servers import TASK, pull, served  # noqa: F401  (a fixture)


def test_a_held_token_skips_the_features_and_a_wrong_one_gets_them(served):
    gs, client = served()
    assert [e.row_cache_mb for e in gs.platform.events] == [752, 752]  # a quarter of 3008 MB
    first = pull(gs, client)
    token = first["static"]["P"]
    features = np.array(first.tensors["P"])
    np.testing.assert_array_equal(features, gs.state.input_rows(0, int(gs.state.bounds[1])))
    other_chunk = pull(gs, client, dict(TASK, chunk=1))["static"]["P"]
    assert other_chunk != token and len(token) == 32

    before = gs.usage.totals["bytes_sent"]
    hit = pull(gs, client, have=[token])
    assert "P" not in hit.tensors and hit["static"] == {"P": token}
    assert gs.usage.totals["bytes_sent"] == before  # a fwd of layer 0 pulls nothing else
    for wrong in (["f" * 32], [other_chunk], ["forged", token[:-1] + "0"], []):
        got = pull(gs, client, have=wrong)
        np.testing.assert_array_equal(got.tensors["P"], features)
        assert got["static"] == {"P": token}
    assert gs.usage.totals["bytes_sent"] == before + 4 * features.nbytes


def test_only_layer_0_inputs_are_static_and_cpu_backends_name_none(served):
    static = [k for k in ("fwd", "bwd", "edge_fwd", "loss", "fused", "eval") for layer in (0, 1)
              if has_static(TaskKey(k, True, 1, layer, 0))]
    assert static == ["fwd", "bwd"]
    gs_cpu, cpu = served("cpu")
    assert all(e.row_cache_mb == 0 for e in gs_cpu.platform.events)
    got = pull(gs_cpu, cpu, have=["f" * 32])
    assert got.op == "rows" and "static" not in got.fields and got.tensors["P"].shape[1] == 16


@pytest.mark.parametrize("have", ["x", 5, {"a": 1}, [1], [None], [""], ["a" * 65], ["t"] * (MAX_HELD + 1), [["t"]]])
def test_a_malformed_have_is_refused_and_the_server_keeps_serving(served, have):
    gs, client = served()
    refused = pull(gs, client, have=have, req="bad")
    assert refused.op == "error" and refused["req"] == "bad" and "have" in refused["reason"]
    assert pull(gs, client).tensors["P"].shape[1] == 16


def test_any_json_as_have_is_a_token_set_or_a_protocol_error():
    for value in hypothesis_values(300) + [None, [], ["t"] * MAX_HELD]:
        try:
            tokens = held_tokens(value)
        except ProtocolError:
            continue
        assert isinstance(tokens, frozenset) and all(isinstance(t, str) for t in tokens)
