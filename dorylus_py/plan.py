"""The run plan: what a run's settings come to on its data, worked out once by one pure function.

:func:`plan` takes the settings (:class:`~dorylus_py.config.TrainConfig`) and what is known of the data
(the graph's counts, and each partition's vertex count once it is prepared) and resolves everything
derived: the model's layer widths, ``--chunks auto`` and each graph server's chunk count,
``--stream-rows auto``, ``--fuse auto``, async mode's ``--local-barrier``, ``--fresh-wait-ms`` and ``--stale-smoothing``, each graph
server's share of the Lambda pool, the server counts. The CLI (for the run record), the driver (for the
servers' ``start``), the cost estimator and the reports ask it; nothing else works these values out.
Only the standard library is imported here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dorylus_py.config import LAMBDA_BACKENDS, TrainConfig
from dorylus_py.errors import DataError
from dorylus_py.models.architectures import architecture
from dorylus_py.sections import (  # noqa: F401  (AUTO_CHUNK_ROWS: tests)
    ASYNC_CHUNKS, ASYNC_FRESH_WAIT_MS, ASYNC_SMOOTHING, AUTO_CHUNK_ROWS, STREAM_BLOCKS)
from dorylus_py.settings import AUTO

FUSE_WIDENING = 2.0  # --fuse auto fuses where the last layer's Gather gets at most this much wider


@dataclass(frozen=True)
class RunPlan:
    config: TrainConfig  # a distributed run's: --chunks and --stream-rows counts; fusion, the barrier, fresh wait and smoothing decided
    widths: list[int]  # layer widths: features, hidden..., classes
    graph_servers: int  # partitions (0: no graph servers: the reference trainer, the decentralised modes)
    weight_servers: int
    chunk_counts: list[int]  # each graph server's chunks
    lambda_share: tuple[int, int, int]  # a graph server's tensor workers: at the start, fewest, most

    @property
    def total_chunks(self) -> int:
        return sum(self.chunk_counts)


def plan(cfg: TrainConfig, features: int, classes: int, nodes: int, parts: list[int] | None = None,
         weight_servers: int | None = None) -> RunPlan:
    """The plan of ``cfg`` on a graph of ``nodes`` vertices, ``features`` and ``classes``; ``parts``: each
    partition's vertices once the data is prepared (else an even split of ``cfg.graph_servers``);
    ``weight_servers``: a cluster file's count (else ``cfg.weight_servers``)."""
    p = cfg.pipeline
    widths = cfg.gnn.widths(features, classes)
    if not p.distributed:
        return RunPlan(cfg, widths, 0, 0, [], (0, 0, 0))
    k = len(parts) if parts is not None else p.graph_servers
    if k < 1 or (parts is not None and min(parts) < 1):
        raise DataError(f"a distributed run needs partitions of at least one vertex each, got {parts or k}")
    share = lambda_share(cfg, k)
    chunks = p.chunks
    if chunks is AUTO:
        workers = share[0] if p.backend in LAMBDA_BACKENDS and cfg.pool.lambdas is not AUTO else None
        chunks = chunks_per_server(p.backend, p.mode, workers, -(-nodes // k))
    sizes = parts if parts is not None else [max(1, nodes // k)] * k
    counts = [max(1, min(chunks, s)) for s in sizes]
    stream = stream_rows(cfg, max(-(-s // c) for s, c in zip(sizes, counts)))
    resolved = replace(cfg, chunks=chunks, stream_rows=stream, fuse=fuse(cfg, widths), **async_defaults(cfg))
    return RunPlan(resolved, widths, k, weight_servers or p.weight_servers, counts, share)


def stream_rows(cfg: TrainConfig, chunk_rows: int) -> int:
    """``--stream-rows auto``: a chunk of ``chunk_rows`` (the largest) in :data:`STREAM_BLOCKS` blocks where
    every task's transfers sit on a capped link (``local`` with ``--lambda-bandwidth-mbps``, a fixed pool),
    else whole chunks (0). On such a link a whole-chunk task downloads, computes and uploads one after
    the other, and the epoch is a chain of such tasks: on the 200 k graph at 200 Mbps (``local`` K=2, 4
    Lambdas, async S=1, int8, medians of 3) streaming in 4 blocks with the fused last layer took the
    epoch from 1.31-1.39x the unlimited one to 1.00-1.04x (docs/performance.md). A pool that grows
    (``--lambdas auto``) hides the cap with more links instead, and there the blocks' messages cost
    more CPU than they save; on ``lambda`` the gain is unmeasured (no real link here)."""
    rows = cfg.pool.stream_rows
    if rows is not AUTO:
        return rows
    capped = (cfg.pipeline.backend == "local" and cfg.pool.lambda_bandwidth_mbps > 0 and cfg.pool.lambdas is not AUTO
              and architecture(cfg.gnn.model).streams)
    return -(-chunk_rows // STREAM_BLOCKS) if capped and chunk_rows > 1 else 0


def fuse(cfg: TrainConfig, widths: list[int]) -> str:
    """``--fuse auto``: ``on`` where a task saved is a round trip or bytes on a slow link saved (``lambda``,
    and ``local`` with ``--lambda-latency-ms`` or ``--lambda-bandwidth-mbps``) and the fused layer's Gather
    is at most :data:`FUSE_WIDENING` times as wide as the unfused one's; else ``off``. Fused, the last
    layer gathers its input (``hidden`` wide) instead of its output (``classes`` wide), and that Gather and
    its backward are graph-server work: with Dorylus's Reddit shape (128 hidden, 41 classes) fusing made
    a graph server's graph thread 1.5-1.7x busier per epoch (issue 53), where the 200 k graph's 16 and 10
    gained 0.83-0.88x epochs at 200 Mbps (docs/performance.md). ``on`` and ``off`` stay as given; models
    that cannot fuse are ``off``."""
    p = cfg.pipeline
    if not architecture(cfg.gnn.model).can_fuse(cfg.gnn.layers):
        return "off"
    if p.fuse != "auto":
        return p.fuse
    saves = p.backend == "lambda" or (p.backend == "local" and (cfg.pool.lambda_latency_ms > 0
                                                                 or cfg.pool.lambda_bandwidth_mbps > 0))
    return "on" if saves and widths[-2] <= FUSE_WIDENING * widths[-1] else "off"


def async_defaults(cfg: TrainConfig) -> dict:
    """``--local-barrier``, ``--fresh-wait-ms`` and ``--stale-smoothing`` ``auto``, in async mode: the
    barrier on and a wait of :data:`ASYNC_FRESH_WAIT_MS` for the peers' rows, which together bring async
    S=1 to sync's epochs on the benchmark graphs (docs/performance.md, issue 39's measurements); smoothing
    (PipeGCN's 0.95) only when the wait is 0, where it keeps stale rows from making S=1 diverge: its
    moving average lags rows that come in time. Smoothing also stays off with ``--switch-threshold`` (the
    sync epochs after the switch would read averages). Off elsewhere; values the user gave stay."""
    p, is_async = cfg.pipeline, cfg.pipeline.mode == "async"
    wait = (ASYNC_FRESH_WAIT_MS if is_async else 0.0) if p.fresh_wait_ms is AUTO else p.fresh_wait_ms
    smooth = ASYNC_SMOOTHING if is_async and not p.switch_threshold and not wait else 0.0
    return {"local_barrier": is_async if p.local_barrier is AUTO else p.local_barrier, "fresh_wait_ms": wait,
            "stale_smoothing": smooth if p.stale_smoothing is AUTO else p.stale_smoothing}


def lambda_share(cfg: TrainConfig, graph_servers: int) -> tuple[int, int, int]:
    """(start, fewest, most) tensor workers of one graph server: ``--lambdas`` (or, with ``auto``,
    ``--lambdas-min`` and ``--lambdas-max``) shared out among the graph servers, at least one each.
    An autotuned pool starts at its fewest and grows as its tasks wait."""
    def share(n: int) -> int:
        return max(1, n // graph_servers)

    pool = cfg.pool
    if pool.lambdas is AUTO:
        return share(pool.lambdas_min), share(pool.lambdas_min), share(pool.lambdas_max)
    return (share(pool.lambdas),) * 3


def lambdas_at_once(cfg: TrainConfig, graph_servers: int) -> int:
    """The emulated Lambdas a ``local`` job may run at once, all servers together (a scale model gives
    each a host of its own); 0 on other backends."""
    if cfg.pipeline.backend != "local":
        return 0
    return lambda_share(cfg, graph_servers)[2] * graph_servers


def chunks_per_server(backend: str, mode: str, workers: int | None, rows: int) -> int:
    """``--chunks auto``: how many chunks a graph server of ``rows`` vertices cuts its rows into.

    Sync mode waits for every chunk at every stage, so more chunks than tensor workers only add a
    second wave of tasks and their fixed costs (measured on the 200 k graph, ``local`` with 2 workers a
    server: 2 chunks 1.31x the reference's epoch, 4 chunks 1.58x): one chunk per worker of a fixed Lambda
    pool (``workers``), and one on ``cpu``/``gpu``, whose tasks torch already spreads over the server's
    cores (``cpu``: 1 chunk 1.39x, 4 chunks 1.64x). Async mode on a fixed pool too: its chunks run at
    different stages whatever their count, and a second wave costs it as much (200 k graph, ``local``
    K=2, 4 Lambdas, async S=1 against sync: 2 chunks 0.88-0.97x at 0 ms and 0.91-0.94x at 20 ms of
    latency, 4 chunks 1.06x and 1.14x, 3 chunks 1.37x and 1.13x); nor on links capped at 200 Mbit/s a
    Lambda, which carry an epoch's bytes in the same time whatever the chunks (2 chunks 1.68 s, 4 chunks
    1.70 s: more Lambdas are what helps there, docs/performance.md). A pool that resizes itself
    (``workers`` None) and async ``cpu``/``gpu`` keep ``ASYNC_CHUNKS``. Chunks have at most
    ``AUTO_CHUNK_ROWS`` rows of ``rows`` (an even split of the graph: partitions differ by a few per
    cent); the count then rounds up to whole waves."""
    if mode == "sync" and backend in ("cpu", "gpu"):
        wave = 1
    elif workers is not None and backend not in ("cpu", "gpu"):
        wave = workers
    else:
        wave = ASYNC_CHUNKS
    waves = -(-max(1, -(-rows // AUTO_CHUNK_ROWS)) // wave)
    return max(1, min(wave * waves, rows))
