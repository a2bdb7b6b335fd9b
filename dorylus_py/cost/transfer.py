"""What moving a run's bytes costs on AWS, which the servers' hours and the Lambdas' GB-seconds leave out.

In infra/'s deployment everything is in one region and one VPC: traffic between the servers, and
between the servers and the Lambdas in their zone, is free; traffic that crosses zones pays
0.01 USD per GB each way (out of one zone, into the other). The Lambdas run in ``lambda_zones`` zones
(infra's ``lambda_zone_count``: 1, the servers' zone, by default; 2 adds another), spread evenly by
Lambda, so a share ``(zones - 1) / zones`` of their traffic crosses.

Their traffic is what the graph servers' sockets carried for them: from a run's record, every byte the
graph servers counted (an overcount, by what the servers exchanged with each other in their zone; a
run without Lambdas has none); from the cost model, the rows its tasks pull and push
(``Workload.bytes_per_server`` with the tasks less without them).
"""

from __future__ import annotations

from dorylus_py.config import DECENTRAL_MODES

CROSS_ZONE_USD_PER_GB = 0.01  # each way: the sending zone's out and the receiving zone's in
LAMBDA_BACKENDS = ("lambda", "local")  # a local run's emulated Lambdas are priced as AWS's


def crossing_share(lambda_zones: int) -> float:
    """The share of the Lambdas' traffic that crosses zones, with the Lambdas spread over ``lambda_zones``
    zones, one of them the servers'."""
    if lambda_zones not in (1, 2):
        raise ValueError(f"lambda zones: 1 or 2 (infra's lambda_zone_count), not {lambda_zones}")
    return (lambda_zones - 1) / lambda_zones


def transfer_usd(lambda_bytes: float, lambda_zones: int) -> float:
    """What ``lambda_bytes`` between the Lambdas and the servers cost, both ways billed."""
    return lambda_bytes / 1e9 * crossing_share(lambda_zones) * 2 * CROSS_ZONE_USD_PER_GB


def recorded_lambda_bytes(config: dict, metrics: list[dict]) -> float:
    """The bytes a run's graph servers counted through their sockets, every epoch and server; none for a
    run whose tensor work did not go to Lambdas."""
    if config.get("backend") not in LAMBDA_BACKENDS or config.get("mode") in DECENTRAL_MODES:
        return 0.0
    return float(sum(s.get("bytes", 0) for m in metrics for s in m.get("servers", [])))


def predicted_lambda_bytes(work, setup) -> float:
    """What the cost model (``estimate.Workload``, ``estimate.Setup``) predicts the Lambdas pull and push
    over the whole run."""
    if setup.backend not in LAMBDA_BACKENDS:
        return 0.0
    servers_only = work.bytes_per_server(setup.graph_servers, setup.chunks, in_process=True, wire=setup.wire_dtype)
    return (setup.bytes_per_server(work) - servers_only) * setup.graph_servers * setup.epochs
