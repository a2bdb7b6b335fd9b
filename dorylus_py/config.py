"""Typed configurations: a training run's (passed everywhere and saved as ``config.json``) and
`dorylus synth`'s. Only the standard library is imported here, so the CLI parses flags (and answers
``--help``) without loading numpy or torch."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from dorylus_py.errors import ConfigError

BACKENDS = ("reference", "local", "lambda", "cpu", "gpu")
MODES = ("sync", "async", "gossip", "allreduce")
DECENTRAL_MODES = ("gossip", "allreduce")  # data-parallel Cluster-GCN workers (dorylus_py/decentral)
FEATURE_NORMS = ("auto", "row", "none")
MODELS = ("gcn", "gat", "sage")  # dorylus_py/models/spec.py describes each
FUSE_CHOICES = ("auto", "on", "off")  # GCN's fused last layer; auto: where tensor tasks are Lambda invocations


def at_least(flag: str, value: float, low: float) -> None:
    if value < low:
        raise ConfigError(f"{flag} must be >= {low}, got {value}")


def above(flag: str, value: float, low: float) -> None:
    if value <= low:
        raise ConfigError(f"{flag} must be > {low}, got {value}")


@dataclass(frozen=True)
class TrainConfig:
    data: str | None = None  # dataset path; None = a generated graph (see `dorylus synth`)
    backend: str = "reference"  # where the work runs; `reference` is the single-process oracle
    model: str = "gcn"  # gcn (Kipf & Welling) | gat (Veličković et al.) | sage (GraphSAGE, mean aggregator)
    layers: int = 2  # layers (Gather + ApplyVertex each)
    hidden: int = 16  # width of every hidden layer (GAT: of each head)
    dropout: float = 0.5  # on each layer's input, as in Kipf & Welling
    heads: int = 8  # GAT: attention heads of the hidden layers (concatenated)
    out_heads: int = 1  # GAT: heads of the last layer (averaged)
    attn_dropout: float | None = None  # GAT: dropout on attention coefficients (None: the same as `dropout`)
    negative_slope: float = 0.2  # GAT: LeakyReLU slope of the attention scores
    weight_decay: float = 5e-4  # L2 on the first layer only (the paper's choice)
    lr: float = 0.01  # Adam learning rate
    epochs: int = 200
    seed: int = 0  # weights init and dropout
    feature_norm: str = "auto"  # `row`: rows scaled to sum 1 (bag-of-words practice); `auto`: row if all >= 0
    threads: int = 0  # torch intra-op threads; 0 = torch's default
    target_acc: float = 0.0  # stop once validation accuracy reaches this (0 = run all epochs)
    # --- distributed backends (local, cpu, gpu) ---
    graph_servers: int = 2  # K: partitions, one graph-server process each
    weight_servers: int = 1  # M: layer l lives on weight server l % M
    chunks: int | str = "auto"  # per graph server: vertex intervals that move through the pipeline independently;
    # auto: chunks_per_server's rule (one wave of tensor tasks in sync mode), resolved before the run starts
    mode: str = "sync"  # sync: barriers per layer, equals full-batch training; async: bounded staleness
    staleness: int = 1  # async: a chunk may run at most this many epochs ahead of the slowest
    switch_threshold: float = 0.0  # async: switch to sync once validation accuracy is within this of --target-acc
    async_update: str = "epoch"  # async: one Adam step per epoch's worth of chunk gradients, or per `chunk`
    fuse: str = "auto"  # gcn, 2+ layers: one task does the last layer's forward, loss and backward; auto: on Lambdas
    remat: bool = False  # sync: graph servers keep only what backward reads (graph_servers/graph_state.py)
    partitioner: str = "auto"  # how --data is split into K parts when it is not a store of K parts already
    lambdas: int | str = 4  # local/lambda: tensor workers at once in all, shared among graph servers; or "auto"
    lambdas_min: int = 2  # --lambdas auto: fewest and most tensor workers at once, in all
    lambdas_max: int = 32
    lambda_latency_ms: float = 0.0  # local: injected invoke latency per task
    lambda_bandwidth_mbps: float = 0.0  # local: each emulated Lambda's transfer rate, each way (0: unlimited)
    lambda_fail_rate: float = 0.0  # local: chance that an invocation fails (before or part-way)
    lambda_cold_start_ms: float = 0.0  # local: the first invocation on each emulated worker waits this long
    lambda_memory_mb: int = 3008  # billed memory per Lambda (AWS bills GB-seconds)
    lambda_timeout_s: float = 60.0  # a Lambda's own time limit
    row_cache_mb: int | None = None  # local/lambda: a warm worker keeps the feature rows it pulled, up to this
    # (None: a quarter of --lambda-memory-mb; 0: off); cpu/gpu never cache (the rows are in the same process)
    stream_rows: int = 0  # local/lambda: a row-wise task pulls, computes and pushes its chunk this many rows at a time
    lambda_function: str = ""  # lambda: the function's name or ARN (or the cluster file's "lambda_function")
    aws_region: str = ""  # lambda: region (default: the AWS chain's)
    aws_profile: str = ""  # lambda: credentials profile (default: the AWS chain's)
    lambda_endpoint: str = ""  # lambda: API endpoint instead of AWS's (moto, LocalStack)
    lambda_run_here: bool = False  # lambda: run each accepted invocation's handler here (endpoints that run no code)
    tensor_threads: int = 2  # cpu/gpu: threads running tensor tasks inside each graph server
    device: str = ""  # cpu/gpu: torch device; default cpu for `cpu`, cuda for `gpu`
    relaunch_min_s: float = 5.0  # relaunch a task after max(this, factor x its kind's average)
    relaunch_factor: float = 3.0
    wait_timeout_s: float = 300.0  # any single wait (a peer, a task, the driver) gives up after this
    hang_timeout_s: float = 60.0  # distributed: a server whose loop stands still (or whose send waits) this long is hung
    replace_timeout_s: float = 120.0  # --cluster: how long a restart waits for a lost server to come back
    checkpoint_every: int | None = None  # distributed: checkpoint every N epochs and at the end (None: 10; 0: never)
    checkpoint_dir: str = ""  # distributed: where checkpoints go, a folder or s3:// prefix ("": RUN_DIR/checkpoints)
    max_restarts: int = 3  # distributed: restart dead servers from the last checkpoint at most this often
    resume: bool = False  # distributed: this run continues a record's newest checkpoint (--resume RUN_DIR)
    # --- decentralised modes (gossip, allreduce) ---
    workers: int = 4  # data-parallel worker processes
    clusters: int = 40  # Cluster-GCN: METIS parts of the graph
    clusters_per_batch: int = 4  # Cluster-GCN: clusters joined into one batch
    diag_lambda: float = 1.0  # Cluster-GCN diagonal enhancement: Ã + λ diag(Ã)
    gossip_every: int = 1  # gossip: swap parameters and the latest gradient with a random peer every k steps
    straggler: str = ""  # RANK:FACTOR: that worker's compute takes FACTOR times as long (experiments)
    peer_timeout_s: float = 5.0  # gossip/allreduce: a peer silent this long to a request is dead
    average_every: int = 0  # gossip: every E epochs all workers adopt the recorder's average (0: never)

    def check(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        if self.model not in MODELS:
            raise ConfigError(f"unknown model {self.model!r}; choose one of {', '.join(MODELS)}")
        at_least("--layers", self.layers, 1)
        if self.layers > 255:
            raise ConfigError(f"--layers must be at most 255 (dropout keys), got {self.layers}")
        at_least("--hidden", self.hidden, 1)
        at_least("--heads", self.heads, 1)
        at_least("--out-heads", self.out_heads, 1)
        at_least("--negative-slope", self.negative_slope, 0)
        if not 0.0 <= self.attention_dropout() < 1.0:
            raise ConfigError(f"--attn-dropout must be in [0, 1), got {self.attention_dropout()}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"--dropout must be in [0, 1), got {self.dropout}")
        above("--lr", self.lr, 0)
        at_least("--weight-decay", self.weight_decay, 0)
        at_least("--epochs", self.epochs, 1)
        if self.feature_norm not in FEATURE_NORMS:
            raise ConfigError(f"--feature-norm must be one of {', '.join(FEATURE_NORMS)}, got {self.feature_norm!r}")
        if not 0.0 <= self.target_acc <= 1.0:
            raise ConfigError(f"--target-acc must be in [0, 1], got {self.target_acc}")
        if self.fuse not in FUSE_CHOICES:
            raise ConfigError(f"--fuse must be one of {', '.join(FUSE_CHOICES)}, got {self.fuse!r}")
        self.check_lambdas()  # every backend: `auto` is refused where there is no Lambda pool to size
        if self.chunks != "auto":  # every backend, as --lambdas: a bad count is an error even where unused
            if not isinstance(self.chunks, int) or isinstance(self.chunks, bool):
                raise ConfigError(f"--chunks must be a number or auto, got {self.chunks!r}")
            at_least("--chunks", self.chunks, 1)
        if self.mode in DECENTRAL_MODES:
            self.check_decentral()
        elif self.backend != "reference":
            self.check_distributed()
        if self.remat and (self.backend == "reference" or self.mode != "sync"):
            raise ConfigError("--remat is for --mode sync on the distributed backends (local, lambda, cpu, gpu): "
                              "asynchronous chunks read each other's rows at different stages, so no buffer is free")
        if (self.resume or self.checkpoint_every) and (self.backend == "reference" or self.mode in DECENTRAL_MODES):
            raise ConfigError("--checkpoint-every and --resume are for the distributed backends (local, lambda, cpu, gpu)")
        at_least("--threads", self.threads, 0)

    def check_distributed(self) -> None:
        at_least("--graph-servers", self.graph_servers, 1)
        at_least("--weight-servers", self.weight_servers, 1)  # more than the layers is fine: weights go by row block
        if self.mode not in MODES:
            raise ConfigError(f"--mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.switch_threshold:
            if not 0 < self.switch_threshold < 1:
                raise ConfigError(f"--switch-threshold must be in (0, 1), got {self.switch_threshold}")
            if self.mode != "async" or not self.target_acc:
                raise ConfigError("--switch-threshold needs --mode async and --target-acc")
            if self.async_update != "epoch":
                raise ConfigError("--switch-threshold needs --async-update epoch (weight versions then count epochs)")
        if self.async_update not in ("epoch", "chunk"):
            raise ConfigError(f"--async-update must be epoch or chunk, got {self.async_update!r}")
        at_least("--staleness", self.staleness, 0)
        at_least("--tensor-threads", self.tensor_threads, 1)
        if not 0.0 <= self.lambda_fail_rate < 1.0:
            raise ConfigError(f"--lambda-fail-rate must be in [0, 1), got {self.lambda_fail_rate}")
        at_least("--lambda-latency-ms", self.lambda_latency_ms, 0)
        at_least("--lambda-bandwidth-mbps", self.lambda_bandwidth_mbps, 0)
        if self.lambda_bandwidth_mbps and self.backend != "local":
            raise ConfigError(f"--lambda-bandwidth-mbps caps the links of emulated Lambdas (--backend local), not "
                              f"--backend {self.backend}")
        at_least("--lambda-memory-mb", self.lambda_memory_mb, 128)
        above("--lambda-timeout-s", self.lambda_timeout_s, 0)
        if self.row_cache_mb is not None:
            at_least("--row-cache-mb", self.row_cache_mb, 0)
            if self.row_cache_mb and self.backend not in ("local", "lambda"):
                raise ConfigError(f"--row-cache-mb is for Lambda containers (--backend local or lambda); --backend "
                                  f"{self.backend} runs tensor tasks inside the graph server, which has the rows")
            if self.row_cache_mb >= self.lambda_memory_mb:
                raise ConfigError(f"--row-cache-mb {self.row_cache_mb} leaves no room in a Lambda of "
                                  f"--lambda-memory-mb {self.lambda_memory_mb}")
        at_least("--stream-rows", self.stream_rows, 0)
        if self.stream_rows and self.backend not in ("local", "lambda"):
            raise ConfigError(f"--stream-rows streams a Lambda's transfers (--backend local or lambda); --backend "
                              f"{self.backend} runs tensor tasks inside the graph server, which transfers nothing")
        if self.stream_rows and self.model == "gat":
            raise ConfigError("--stream-rows streams GCN and GraphSAGE tasks; GAT's vertex forward returns its bias "
                              "row with the rows, which no block owns")
        if self.backend in ("cpu", "gpu"):
            self.check_device()
        if self.backend == "lambda" and not self.lambda_function:
            raise ConfigError("--backend lambda needs --lambda-function NAME (or \"lambda_function\" in the cluster file)")
        if self.checkpoint_every is not None:
            at_least("--checkpoint-every", self.checkpoint_every, 0)
        at_least("--max-restarts", self.max_restarts, 0)
        at_least("--lambda-cold-start-ms", self.lambda_cold_start_ms, 0)
        above("--relaunch-min-s", self.relaunch_min_s, 0)
        at_least("--relaunch-factor", self.relaunch_factor, 1)
        above("--wait-timeout-s", self.wait_timeout_s, 0)
        above("--hang-timeout-s", self.hang_timeout_s, 0)
        above("--replace-timeout-s", self.replace_timeout_s, 0)

    def check_lambdas(self) -> None:
        if self.lambdas != "auto":
            if not isinstance(self.lambdas, int) or isinstance(self.lambdas, bool):
                raise ConfigError(f"--lambdas must be a number or auto, got {self.lambdas!r}")
            at_least("--lambdas", self.lambdas, 1)
            return
        if self.backend not in ("local", "lambda"):
            raise ConfigError(f"--lambdas auto sizes Lambda pools (--backend local or lambda); --backend {self.backend} "
                              "has none")
        at_least("--lambdas-min", self.lambdas_min, 1)
        if self.lambdas_max < self.lambdas_min:
            raise ConfigError(f"--lambdas-max ({self.lambdas_max}) is below --lambdas-min ({self.lambdas_min})")

    def lambdas_per_server(self, graph_servers: int) -> tuple[int, int, int]:
        """(start, fewest, most) tensor workers of one graph server: ``--lambdas`` (or, with ``auto``,
        ``--lambdas-min`` and ``--lambdas-max``) shared out among the graph servers, at least one each.
        An autotuned pool starts at its fewest and grows as its tasks wait."""
        def share(n: int) -> int:
            return max(1, n // graph_servers)

        if self.lambdas == "auto":
            return share(self.lambdas_min), share(self.lambdas_min), share(self.lambdas_max)
        return (share(self.lambdas),) * 3

    def widths(self, features: int, classes: int) -> list[int]:
        """The model's layer widths, input to output, for a graph of ``features`` and ``classes``."""
        return [features] + [self.hidden] * (self.layers - 1) + [classes]

    def resolved_chunks(self, nodes: int) -> int:
        """``--chunks``, with ``auto`` worked out for a graph of ``nodes`` vertices (see :func:`chunks_per_server`)."""
        if self.chunks != "auto":
            return self.chunks
        fixed_pool = self.backend in ("local", "lambda") and self.lambdas != "auto"
        workers = self.lambdas_per_server(self.graph_servers)[0] if fixed_pool else None
        return chunks_per_server(self.backend, self.mode, workers, -(-nodes // self.graph_servers))

    def check_decentral(self) -> None:
        if self.backend != "reference":
            raise ConfigError(f"--mode {self.mode} starts its own workers (--workers, --device); drop --backend {self.backend}")
        at_least("--workers", self.workers, 1)
        at_least("--gossip-every", self.gossip_every, 1)
        if not 1 <= self.clusters_per_batch <= self.clusters:
            raise ConfigError(f"need 1 <= --clusters-per-batch ({self.clusters_per_batch}) <= --clusters ({self.clusters})")
        at_least("--diag-lambda", self.diag_lambda, 0)
        if self.straggler:
            rank, _, factor = self.straggler.partition(":")
            try:
                ok = 0 <= int(rank) < self.workers and float(factor) >= 1.0
            except ValueError:
                ok = False
            if not ok:
                raise ConfigError(f"--straggler wants RANK:FACTOR with 0 <= RANK < --workers and FACTOR >= 1, got {self.straggler!r}")
        above("--wait-timeout-s", self.wait_timeout_s, 0)
        above("--peer-timeout-s", self.peer_timeout_s, 0)
        at_least("--average-every", self.average_every, 0)
        if self.average_every and self.mode != "gossip":
            raise ConfigError(f"--average-every is for --mode gossip (all-reduce workers always hold one model), "
                              f"got {self.average_every} with --mode {self.mode}")
        self.check_device()

    def check_device(self) -> None:
        """A CUDA device that is not there is a configuration error, not a silent CPU fallback."""
        import torch

        device = self.resolved_device()
        if device.startswith("cuda") and not torch.cuda.is_available():
            who = f"--mode {self.mode}" if self.mode in DECENTRAL_MODES else f"--backend {self.backend}"
            raise ConfigError(f"{who} wants device {device}, but torch sees no CUDA device "
                              "(use --device cpu, or --backend cpu)")

    def attention_dropout(self) -> float:
        """GAT's dropout on attention coefficients: ``attn_dropout``, or ``dropout`` when unset."""
        return self.dropout if self.attn_dropout is None else self.attn_dropout

    def checkpoint_interval(self) -> int:
        """Epochs between checkpoints (0: none): every 10 for distributed runs unless set."""
        if self.backend == "reference" or self.mode in DECENTRAL_MODES:
            return 0
        return 10 if self.checkpoint_every is None else self.checkpoint_every

    def resolved_row_cache_mb(self) -> int:
        return row_cache_mb(self.backend, self.lambda_memory_mb, self.row_cache_mb)

    def resolved_device(self) -> str:
        return self.device or ("cuda" if self.backend == "gpu" else "cpu")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class SynthConfig:
    """A generated graph (``data/synth.py``)."""

    nodes: int = 10_000
    edges: int = 200_000  # directed edges; every undirected edge appears in both directions
    features: int = 128
    classes: int = 10
    homophily: float = 0.4  # chance that an edge stays inside its block
    degree_exponent: float = 2.5  # Pareto tail of the degree distribution (> 1; smaller = heavier tail)
    feature_signal: float = 0.1  # centroid scale against unit noise: how much features alone reveal
    train_frac: float = 0.1
    val_frac: float = 0.1
    seed: int = 0

    def check(self) -> None:
        at_least("--nodes", self.nodes, 2)
        at_least("--classes", self.classes, 2)
        at_least("--features", self.features, 1)
        if self.classes > self.nodes:
            raise ConfigError(f"--classes ({self.classes}) cannot exceed --nodes ({self.nodes})")
        if self.nodes >= 2**31:
            raise ConfigError(f"--nodes {self.nodes} is above the supported 2^31 - 1")
        if not 0 <= self.edges <= self.nodes * (self.nodes - 1) // 2:
            raise ConfigError(f"--edges {self.edges} is impossible for {self.nodes} vertices without duplicates")
        if not 0.0 <= self.homophily <= 1.0:
            raise ConfigError(f"--homophily must be in [0, 1], got {self.homophily}")
        if self.degree_exponent <= 1.0:
            raise ConfigError(f"--degree-exponent must be > 1, got {self.degree_exponent}")


AUTO_CHUNK_ROWS = 150_000  # --chunks auto: at most this many rows a chunk (a tensor task's memory grows with them)
ASYNC_CHUNKS = 4  # --chunks auto in async mode, or on an autotuned pool: chunks a server pipelines at least


def chunks_per_server(backend: str, mode: str, workers: int | None, rows: int) -> int:
    """``--chunks auto``: how many chunks a graph server of ``rows`` vertices cuts its rows into.

    Sync mode waits for every chunk at every stage, so more chunks than tensor workers only add a
    second wave of tasks and their fixed costs (measured on the 200 k graph, ``local`` with 2 workers a
    server: 2 chunks 1.31x the reference's epoch, 4 chunks 1.58x): one chunk per worker of a fixed Lambda
    pool (``workers``), and one on ``cpu``/``gpu``, whose tasks torch already spreads over the server's
    cores (``cpu``: 1 chunk 1.39x, 4 chunks 1.64x). Async mode, and a pool that resizes itself (``workers``
    None), keep ``ASYNC_CHUNKS`` so chunks can be at different stages. Chunks have at most
    ``AUTO_CHUNK_ROWS`` rows of ``rows`` (an even split of the graph: partitions differ by a few per
    cent); the count then rounds up to whole waves."""
    if mode == "sync" and backend in ("cpu", "gpu"):
        wave = 1
    elif mode == "sync" and workers is not None:
        wave = workers
    else:
        wave = ASYNC_CHUNKS
    waves = -(-max(1, -(-rows // AUTO_CHUNK_ROWS)) // wave)
    return max(1, min(wave * waves, rows))


def row_cache_mb(backend: str, lambda_memory_mb: int, asked: int | None) -> int:
    """What each tensor worker may keep of the static rows it pulled (0: no cache): only Lambda
    containers (local, lambda) cache; by default (``asked`` None) a quarter of their memory."""
    if backend not in ("local", "lambda"):
        return 0
    return lambda_memory_mb // 4 if asked is None else asked
