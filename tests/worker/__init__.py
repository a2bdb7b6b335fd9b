from dorylus_py.worker.event import LeaseEvent


def event_for(graph_server: str = "tcp://gs", row_cache_mb: int = 0, **fields) -> LeaseEvent:
    """A worker's lease event for ``graph_server`` (``fields``: those that matter to the test)."""
    return LeaseEvent(**{"job": "00", "curve_public_key": None, "graph_server": graph_server, "server": 0, "lease": "l1",
                         "weight_servers": (), "model": "gcn", "dropout": 0.0, "attn_dropout": 0.0, "negative_slope": 0.2,
                         "seed": 0, "num_train": 1, "row_cache_mb": row_cache_mb, "idle_ms": 1000} | fields)
