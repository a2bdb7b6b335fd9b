"""The graph server's side of the static-row cache: a lease that names the server's own token for a
chunk's input features is sent them no more (and the server's byte counters say so); a wrong, forged or
other chunk's token gets the rows; a malformed ``have`` is refused with an error and the server keeps
serving. The worker's side is in ``tests/worker/test_row_cache.py``."""

import numpy as np
import pytest

from dorylus_py.pipeline.events import TaskKey
from dorylus_py.protocol import ProtocolError
from graph_servers.task_io import has_static
from graph_servers.wire import MAX_HELD, held_tokens
from tests.clients import Client, driver  # noqa: F401  (a fixture)
from tests.cluster.fuzz_corpus import hypothesis_values
from tests.graph_servers import hello, leave, pump, served  # noqa: F401  (a fixture)


def test_a_held_token_skips_the_features_and_a_wrong_one_gets_them(served):
    gs, client = served()
    first, second = gs.platform.events
    assert first.row_cache_mb == 752  # a quarter of 3008 MB
    sent = hello(gs, client, first.lease, want=2)
    token, other_chunk = (t["static"]["P"] for t in sent)
    assert other_chunk != token and len(token) == 32
    features = np.array(sent[0].tensors["P"])
    np.testing.assert_array_equal(features, gs.state.input_rows(0, int(gs.state.bounds[1])))
    assert leave(gs, client, first.lease)[0].op == "release"  # both tasks back in the queue, for the next lease

    before = gs.usage.totals["bytes_sent"]
    holder = Client(gs.node)
    hit = hello(gs, holder, second.lease, want=2, have=[token])
    assert "P" not in hit[0].tensors and hit[0]["static"] == {"P": token}
    assert "P" in hit[1].tensors  # chunk 1's token was not named
    assert gs.usage.totals["bytes_sent"] - before < features.nbytes * 1.5  # chunk 0's features never went
    holder.close()


def test_only_layer_0_inputs_are_static_and_cpu_backends_name_none(served):
    static = [k for k in ("fwd", "bwd", "edge_fwd", "loss", "fused", "eval") for layer in (0, 1)
              if has_static(TaskKey(k, True, 1, layer, 0))]
    assert static == ["fwd", "bwd"]
    gs_cpu, _ = served("cpu")
    assert gs_cpu.static_tokens is None  # its threads have the rows: nothing is cached, nothing named


@pytest.mark.parametrize("have", ["x", 5, {"a": 1}, [1], [None], [""], ["a" * 65], ["t"] * (MAX_HELD + 1), [["t"]]])
def test_a_malformed_have_is_refused_and_the_server_keeps_serving(served, have):
    gs, client = served()
    refused = hello(gs, client, gs.platform.events[0].lease, have=have)
    assert refused[0].op == "error" and "have" in refused[0]["reason"]
    assert hello(gs, client, gs.platform.events[0].lease, want=2)[0].tensors["P"].shape[1] == 16


def test_any_json_as_have_is_a_token_set_or_a_protocol_error():
    for value in hypothesis_values(300) + [None, [], ["t"] * MAX_HELD]:
        try:
            tokens = held_tokens(value)
        except ProtocolError:
            continue
        assert isinstance(tokens, frozenset) and all(isinstance(t, str) for t in tokens)
