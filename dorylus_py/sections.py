"""The settings of a training run, by section, each field declared once with its default, its flag's
help and its check (``settings.py``); :class:`~dorylus_py.config.TrainConfig` composes them. Only the
standard library and ``models/architectures.py`` are imported: ``--help`` stays fast."""

from __future__ import annotations

from dataclasses import fields

from dorylus_py.devices import device_list
from dorylus_py.errors import ConfigError
from dorylus_py.wire_forms import WIRE_DTYPES
from dorylus_py.settings import AUTO, MAX_SEED, Auto, Section, check_path, section, setting

BACKENDS = ("reference", "local", "lambda", "cpu", "gpu")
MODES = ("sync", "async", "gossip", "allreduce")
DECENTRAL_MODES = ("gossip", "allreduce")  # data-parallel Cluster-GCN workers (dorylus_py/decentral)
FEATURE_NORMS = ("auto", "row", "none")
MODELS = ("gcn", "gat", "sage")  # dorylus_py/models/spec.py describes each
FUSE_CHOICES = ("auto", "on", "off")  # GCN's fused last layer; auto: where tensor tasks are Lambda invocations
OFFLOAD_CHOICES = ("all", "auto")  # which tensor tasks go to Lambdas (graph_servers/leasing.py)
# --offload auto: a task goes to a Lambda if it does at least this much work for each byte it moves over the link.
# A graph server's core does about 7 dense GFLOP/s (1 core, the scale model's reddit runs: 0.5 s of tensor-thread CPU for
# 3.5 GFLOP an epoch); a Lambda's link carries 25 MB/s: with the 8 a server on Dorylus's shapes, a task whose FLOPs per
# byte are below about 7e9 / (8 x 25e6) = 35 takes longer on the links than on the server's core.
OFFLOAD_FLOPS_PER_BYTE = 64
LAMBDA_BACKENDS = ("local", "lambda")  # tensor tasks in Lambda containers (emulated, or AWS's)
INPROC_BACKENDS = ("cpu", "gpu")  # tensor tasks in the graph servers' own threads
AUTO_CHUNK_ROWS = 150_000  # --chunks auto: at most this many rows a chunk (a tensor task's memory grows with them)
ASYNC_SMOOTHING = 0.95  # --stale-smoothing auto in async mode without a fresh wait: PipeGCN's gamma (issue 39)
ASYNC_FRESH_WAIT_MS = 50.0  # --fresh-wait-ms auto in async mode (issue 39's measurements)
STREAM_BLOCKS = 4  # --stream-rows auto on a capped link: blocks a chunk's task streams in
ASYNC_CHUNKS = 4  # --chunks auto on an autotuned pool, or async cpu/gpu: chunks a server pipelines at least
STALE_STEPS = ("none", "inverse", "inverse-lr")  # async: a stale gradient's weight in the update (weights/store.py)
# Upper bounds (``most``): far beyond any real run, low enough that no count overflows an allocation, a
# poll's milliseconds or a dropout key (epochs < 2^48), so a mistyped flag is one line, not a traceback.
MAX_EPOCHS = 1_000_000
MAX_SERVERS = 4096
MAX_LAMBDAS = 10_000  # AWS's concurrency quotas are lower
MAX_WAIT_S = 7 * 86_400.0  # a week


def at_least(flag: str, value: float, low: float) -> None:
    if value < low:
        raise ConfigError(f"{flag} must be >= {low}, got {value}")


def above(flag: str, value: float, low: float) -> None:
    if value <= low:
        raise ConfigError(f"{flag} must be > {low}, got {value}")


def one_of(flag: str, value, choices: tuple) -> None:
    if value not in choices:
        raise ConfigError(f"{flag} must be one of {', '.join(choices)}, got {value!r}")


def count(flag: str, value, low: int = 1) -> None:
    """An integer setting (a bool or a float is none) of at least ``low``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"{flag} must be a number{' or auto' if flag in ('--chunks', '--lambdas') else ''}, got {value!r}")
    at_least(flag, value, low)


@section
class RunSettings(Section):
    """what to train on, and how long"""

    data: str | None = setting(None, "dataset or prepared folder, or a reference graph shipped with dorylus-py by name "
                               "(cora, citeseer) where nothing of that name exists (default: a generated graph)",
                               metavar="PATH", show_default=False)
    epochs: int = setting(200, "epochs", most=MAX_EPOCHS)
    seed: int = setting(0, "weights and dropout seed", most=MAX_SEED)
    threads: int = setting(0, "torch threads (default: torch's choice)", most=1024)
    target_acc: float = setting(0.0, "stop once validation accuracy reaches this (0: run every epoch)")

    def check(self) -> None:
        at_least("--epochs", self.epochs, 1)
        at_least("--seed", self.seed, 0)
        if self.data:
            check_path("--data", self.data)
        if not 0.0 <= self.target_acc <= 1.0:
            raise ConfigError(f"--target-acc must be in [0, 1], got {self.target_acc}")
        at_least("--threads", self.threads, 0)


@section
class ModelSettings(Section):
    """model and optimiser"""

    model: str = setting("gcn", "gcn: Kipf & Welling; gat: graph attention (Velickovic et al.), attention per edge "
                         "computed in ApplyEdge tasks; sage: GraphSAGE with the mean aggregator", choices=MODELS)
    layers: int = setting(2, "layers (Gather + ApplyVertex each)")
    hidden: int = setting(16, "hidden width; for gat the width of each head", most=65_536)
    dropout: float = setting(0.5, "dropout on each layer's input")
    heads: int = setting(8, "gat: attention heads of each hidden layer, concatenated", most=64)
    out_heads: int = setting(1, "gat: heads of the last layer, averaged", most=64)
    attn_dropout: float | None = setting(None, "gat: dropout on the attention coefficients, keyed by edge (default: the "
                                         "same as --dropout)", metavar="P")
    negative_slope: float = setting(0.2, "gat: LeakyReLU slope of the attention scores", most=1.0)
    weight_decay: float = setting(5e-4, "L2 weight decay: gcn on the first layer, gat and sage on every weight but "
                                  "the biases", most=1.0)
    lr: float = setting(0.01, "Adam learning rate", most=10.0)
    feature_norm: str = setting("auto", "row: rows sum to 1; auto: row when all features are >= 0", choices=FEATURE_NORMS)

    def check(self) -> None:
        if self.model not in MODELS:
            raise ConfigError(f"unknown model {self.model!r}; choose one of {', '.join(MODELS)}")
        at_least("--layers", self.layers, 1)
        if self.layers > 255:
            raise ConfigError(f"--layers must be at most 255 (dropout keys), got {self.layers}")
        at_least("--hidden", self.hidden, 1)
        at_least("--heads", self.heads, 1)
        at_least("--out-heads", self.out_heads, 1)
        at_least("--negative-slope", self.negative_slope, 0)
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"--dropout must be in [0, 1), got {self.dropout}")
        if self.attn_dropout is not None and not 0.0 <= self.attn_dropout < 1.0:  # unset: --dropout's, checked
            raise ConfigError(f"--attn-dropout must be in [0, 1), got {self.attn_dropout}")
        above("--lr", self.lr, 0)
        at_least("--weight-decay", self.weight_decay, 0)
        one_of("--feature-norm", self.feature_norm, FEATURE_NORMS)

    def attention_dropout(self) -> float:
        """GAT's dropout on attention coefficients: ``attn_dropout``, or ``dropout`` when unset."""
        return self.dropout if self.attn_dropout is None else self.attn_dropout

    def widths(self, features: int, classes: int) -> list[int]:
        """The model's layer widths, input to output, for a graph of ``features`` and ``classes``."""
        return [features] + [self.hidden] * (self.layers - 1) + [classes]


@section
class PipelineSettings(Section):
    """distributed backends (local, lambda, cpu, gpu)"""

    backend: str = setting("reference", "reference: single-process full-batch oracle; local: graph/weight server "
                           "processes with tensor work in emulated Lambdas; lambda: the same with AWS Lambda (see "
                           "docs/aws.md); cpu/gpu: the same pipeline with tensor work inside the graph servers, on the "
                           "CPU or a CUDA device", choices=BACKENDS)
    graph_servers: int = setting(2, "graph servers = partitions (default: the prepared store's partitions, else 2)",
                                 short="-k", most=MAX_SERVERS)
    weight_servers: int = setting(1, "weight servers; every weight tensor is cut into row blocks dealt over them, so M "
                                  "may exceed the layers", most=MAX_SERVERS)
    chunks: int | Auto = setting(AUTO, "vertex intervals per graph server, each a tensor task per stage (default auto: "
                                 "one per tensor worker of a fixed --lambdas pool (a second wave of tasks only adds their "
                                 "fixed costs, in either mode), and in sync mode 1 on cpu/gpu; "
                                 f"{ASYNC_CHUNKS} with --lambdas auto or async on cpu/gpu; at most about "
                                 f"{AUTO_CHUNK_ROWS:,} rows each)", metavar="N|auto", most=65_536)
    mode: str = setting("sync", "sync: barriers per layer, equals full-batch training; async: bounded staleness; "
                        "gossip / allreduce: decentralised Cluster-GCN workers (see below)", choices=MODES)
    staleness: int = setting(1, "async: max epochs a chunk runs ahead", most=1000)
    switch_threshold: float = setting(0.0, "async: switch to sync mode once validation accuracy is within this of "
                                      "--target-acc, as the original Dorylus does (default 0: never)")
    async_update: str = setting("epoch", "async: one weight update per epoch's worth of chunk gradients, taken without "
                                "a barrier (default; Cora 81 %), or one per chunk gradient (78 %)",
                                choices=("epoch", "chunk"))
    local_barrier: bool | Auto = setting(AUTO, "async: a chunk's graph stage (Gather, its backward, the evaluation's "
                                         "Gather) waits until every chunk of its own server has reached it, so the rows "
                                         "it reads from its own server are of its epoch and only peers' rows can be "
                                         "stale. auto (default): on in async mode, where with --fresh-wait-ms it brings "
                                         "S=1 to sync's epochs on the benchmark graphs (see docs/performance.md, time "
                                         "to accuracy); off: chunks read each other's rows as they are")
    sync_epochs: int = setting(0, "async: the job's first N epochs run synchronously (every stage waits for every "
                               "chunk and every peer's rows), then asynchronously, as the original Dorylus runs its "
                               "first epoch: no chunk gathers ghost rows a peer has not sent yet (they are zeros before "
                               "the first), and Adam's first steps see no stale gradients (default 0)", most=1_000_000,
                               metavar="N")
    stale_smoothing: float | Auto = setting(AUTO, "async: a graph server keeps, for every ghost row a peer sends "
                                            "(training pass) and every gradient contribution a peer sends back, the "
                                            "moving average m = GAMMA m + (1 - GAMMA) received (the first: received "
                                            "itself) in place of the value, and reads it where the stale value stood, "
                                            "as PipeGCN does. Rows of its own chunks are never smoothed. auto "
                                            f"(default): {ASYNC_SMOOTHING} (PipeGCN's) in async mode when --fresh-wait-ms "
                                            "is 0 and without --switch-threshold, 0 (off) elsewhere; 0: off", metavar="GAMMA|auto")
    stale_step: str = setting("none", "async: how the weight server weighs a gradient computed at weights d versions "
                              "behind the newest. none (default): as it is; inverse: the gradient times 1/(d+1) "
                              "before it enters its update or its epoch's sum (staleness-aware SGD; Adam's moments "
                              "see the scaled gradient); inverse-lr: Adam's moments see the gradient unscaled and "
                              "the step's learning rate is divided by (mean d of the step's gradients) + 1",
                              choices=STALE_STEPS)
    fresh_wait_ms: float | Auto = setting(AUTO, "async: a Gather (and its backward, and the evaluation's) waits up to "
                                          "MS for the peers' rows of its own epoch before it reads the older ones it "
                                          "has, so a peer is read stale only when it lags by more. auto (default): "
                                          f"{ASYNC_FRESH_WAIT_MS:g} in async mode, where it brings async S=1 to sync's "
                                          "epochs to an accuracy on the benchmark graphs (docs/performance.md); 0: "
                                          "never waits", most=60_000, metavar="MS|auto")
    predict_weights: bool = setting(False, "async: a training task whose weights are d updates behind its epoch's in "
                                    "sync mode gets W + d (W - W_prev), the weights extrapolated along the last update "
                                    "(SpecTrain, PipeMare); its gradient is applied to the real ones. Default off")
    fuse: str = setting("auto", "gcn with --layers >= 2: one task per chunk computes the last layer's forward, the loss "
                        "and its gradient, and the first backward step, where unfused it takes three (forward, loss, "
                        "backward). auto (default): fused where a task saved is a round trip or bytes on a slow link "
                        "saved: on lambda, and on local with --lambda-latency-ms or --lambda-bandwidth-mbps above 0; "
                        "elsewhere fusing only widens the last layer's Gather. "
                        "gat, sage and a one-layer gcn always run unfused", choices=FUSE_CHOICES)
    remat: bool = setting(False, "sync: graph servers keep only what backward reads. The evaluation pass reuses the "
                          "training pass's buffers, Gather backward writes dZ over Z (dead once Gather ran), and the "
                          "fused last layer's input is recomputed from the layer below for backward instead of kept. "
                          "Tasks always recompute activations and dropout masks. Same results; a server starts an "
                          "epoch once every server finished the one before (default off)")
    partitioner: str = setting("auto", "auto, metis, fennel or hash: how --data is partitioned when it is not a prepared "
                               "store of --graph-servers parts (default auto; see `dorylus prepare --help`)")
    wire_dtype: str = setting("float32", "what vertex rows travel as between processes: ghost rows and gradient "
                              "contributions between graph servers, task rows to tensor workers and their results "
                              "back. bfloat16/float16 halve the bytes; int8 (one scale per row, stochastic rounding, "
                              "as AdaQP) quarters them, at some CPU per byte: it pays on slow links (a Lambda's), not on "
                              "loopback. Weights, weight gradients, attention scores and the optimizer stay float32; "
                              "in-process tensor work (cpu/gpu) crosses no wire", choices=WIRE_DTYPES)
    tensor_threads: int = setting(2, "cpu/gpu: tensor threads per graph server", most=256)
    device: str = setting("", "cpu/gpu backends and gossip/allreduce workers: torch device (default cuda for "
                          "--backend gpu, else cpu). cuda: each graph server on a host takes the next GPU "
                          "(cuda:{local rank % GPUs}); cuda:N; or a comma list, one per graph server. Checked on "
                          "the host that uses it")

    def check(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        one_of("--mode", self.mode, MODES)
        one_of("--fuse", self.fuse, FUSE_CHOICES)
        one_of("--async-update", self.async_update, ("epoch", "chunk"))
        one_of("--wire-dtype", self.wire_dtype, WIRE_DTYPES)
        one_of("--stale-step", self.stale_step, STALE_STEPS)
        if self.stale_smoothing is not AUTO and not 0 <= self.stale_smoothing < 1:
            raise ConfigError(f"--stale-smoothing must be in [0, 1), got {self.stale_smoothing}")
        if self.chunks is not AUTO:  # every backend: a bad count is an error even where unused
            count("--chunks", self.chunks)
        at_least("--graph-servers", self.graph_servers, 1)
        at_least("--weight-servers", self.weight_servers, 1)
        at_least("--staleness", self.staleness, 0)
        at_least("--sync-epochs", self.sync_epochs, 0)
        if self.fresh_wait_ms is not AUTO:
            at_least("--fresh-wait-ms", self.fresh_wait_ms, 0)
        at_least("--tensor-threads", self.tensor_threads, 1)
        device_list(self.device)
        if not 0 <= self.switch_threshold < 1:
            raise ConfigError(f"--switch-threshold must be in (0, 1), got {self.switch_threshold}")

    @property
    def distributed(self) -> bool:
        """The Dorylus pipeline: graph servers, weight servers, tensor workers."""
        return self.backend != "reference" and self.mode not in DECENTRAL_MODES

    def resolved_device(self) -> str:
        return self.device or ("cuda" if self.backend == "gpu" else "cpu")


@section
class PoolSettings(Section):
    """Lambda pool (--backend local or lambda)"""

    lambdas: int | Auto = setting(4, "tensor workers (emulated Lambdas, or concurrent AWS invocations) at once in all, "
                                  "shared out among the graph servers; auto: each graph server sizes its pool as the run "
                                  "goes, growing while tasks wait for a worker and its graph stages idle (keeping a "
                                  "growth only if it raised throughput) and shrinking while workers idle; each decision "
                                  "is in the server log and tasks.jsonl (kind resize)",
                                  metavar="N|auto", most=MAX_LAMBDAS)
    lambdas_min: int = setting(2, "--lambdas auto: fewest workers in all, where each pool starts",
                               metavar="N", most=MAX_LAMBDAS)
    lambdas_max: int = setting(32, "--lambdas auto: most workers in all", metavar="N", most=MAX_LAMBDAS)
    lambda_latency_ms: float = setting(0.0, "local: injected latency per invocation", most=600_000.0)
    lambda_bandwidth_mbps: float = setting(0.0, "local: cap each emulated Lambda's transfers at this rate, each way (the "
                                           "Dorylus paper measured about 200 between a Lambda and an EC2 server; "
                                           "default 0: unlimited)", metavar="MBPS", most=1e6)
    lambda_fail_rate: float = setting(0.0, "local: chance an invocation fails")
    lambda_cold_start_ms: float = setting(0.0, "local: the first invocation on each emulated Lambda (and on each "
                                          "replacement of a dead one) waits this long, as a cold container does",
                                          most=600_000.0)
    lambda_memory_mb: int = setting(3008, "local: billed memory of an emulated Lambda (default 3008); lambda: read from "
                                    "the deployed function", most=10_240)
    lambda_timeout_s: float = setting(60.0, "a Lambda's time limit", most=900.0)
    lease_idle_ms: float = setting(2000.0, "local and lambda: a Lambda serves its graph server's tasks until it has "
                                   "waited this long for one; then it returns and stops being billed (AWS bills an "
                                   "invocation while it waits), and the next task invokes one again. Short: billed "
                                   "about only while busy, each burst of tasks paying an invocation's latency; long: "
                                   "warm between stages, billed for the wait", metavar="MS", most=600_000.0)
    row_cache_mb: int | None = setting(None, "each warm tensor worker keeps the input-feature rows it pulled (the only "
                                       "rows that never change in training, and the widest), up to this many MB (once "
                                       "full it keeps what it holds); the graph server then does not send them to it "
                                       "again (default: a quarter of --lambda-memory-mb; 0: off; the cpu and gpu "
                                       "backends never cache)", metavar="MB")
    offload: str = setting("all", "local and lambda: which tensor tasks go to Lambdas. all (default): every one; auto: "
                           f"those doing at least {OFFLOAD_FLOPS_PER_BYTE} FLOPs for each byte they would move over a "
                           "Lambda's link (a wide layer's ApplyVertex: layer 0 on Dorylus's shapes); the rest (narrow "
                           "layers, the loss, evaluation) run in a thread of the graph server, where their rows are",
                           choices=OFFLOAD_CHOICES)
    stream_rows: int | Auto = setting(AUTO, "stream each row-wise tensor task (GCN and GraphSAGE) in blocks of this "
                                      "many rows: the worker asks for every block at once, computes on each as it "
                                      "arrives and sends its rows of the result back at once, so its downloads, compute "
                                      "and uploads overlap; the graph server takes the result only when the last message "
                                      "is in. auto (default): a chunk in "
                                      f"{STREAM_BLOCKS} blocks where the links are capped (local with "
                                      "--lambda-bandwidth-mbps and a fixed --lambdas pool: at 200 Mbps it brings the "
                                      "epoch within a few per cent of the unlimited one, docs/performance.md), whole "
                                      "chunks elsewhere; 0: whole chunks", metavar="ROWS|auto", most=2**31 - 1)

    def check(self) -> None:
        if self.lambdas is not AUTO:
            count("--lambdas", self.lambdas)
        at_least("--lambdas-min", self.lambdas_min, 1)
        if self.lambdas_max < self.lambdas_min:
            raise ConfigError(f"--lambdas-max ({self.lambdas_max}) is below --lambdas-min ({self.lambdas_min})")
        if not 0.0 <= self.lambda_fail_rate < 1.0:
            raise ConfigError(f"--lambda-fail-rate must be in [0, 1), got {self.lambda_fail_rate}")
        at_least("--lambda-latency-ms", self.lambda_latency_ms, 0)
        at_least("--lambda-bandwidth-mbps", self.lambda_bandwidth_mbps, 0)
        at_least("--lambda-cold-start-ms", self.lambda_cold_start_ms, 0)
        at_least("--lambda-memory-mb", self.lambda_memory_mb, 128)
        above("--lambda-timeout-s", self.lambda_timeout_s, 0)
        at_least("--lease-idle-ms", self.lease_idle_ms, 1)
        if self.row_cache_mb is not None:
            at_least("--row-cache-mb", self.row_cache_mb, 0)
            if self.row_cache_mb >= self.lambda_memory_mb:
                raise ConfigError(f"--row-cache-mb {self.row_cache_mb} leaves no room in a Lambda of "
                                  f"--lambda-memory-mb {self.lambda_memory_mb}")
        if self.stream_rows is not AUTO:
            at_least("--stream-rows", self.stream_rows, 0)
        one_of("--offload", self.offload, OFFLOAD_CHOICES)


@section
class AwsSettings(Section):
    """AWS Lambda (--backend lambda; docs/aws.md)"""

    lambda_function: str = setting("", "lambda: function name or ARN (default: the cluster file's)")
    aws_region: str = setting("", "lambda: AWS region (default: from the AWS environment)")
    aws_profile: str = setting("", "lambda: AWS credentials profile (default: from the AWS environment)")
    lambda_endpoint: str = setting("", "lambda: Lambda API endpoint URL (moto, LocalStack, the lab's Lambda service)")
    lambda_run_here: bool = setting(False, "lambda: also run each accepted invocation's handler on this machine; only "
                                    "for endpoints that record invocations without running code (moto). Servers may "
                                    "then be local")

    def check(self) -> None:
        """Nothing to check alone: whether a function is named depends on the backend (TrainConfig.check)."""


@section
class RecoverySettings(Section):
    """timeouts, checkpoints and restarts (distributed backends)"""

    checkpoint_every: int | None = setting(None, "save every layer's weights and Adam state, all at the same epoch, "
                                           "every N epochs and at the end, into RUN_DIR/checkpoints/; a dead server is "
                                           "restarted from the newest (default 10; 0: never)",
                                           metavar="N", most=MAX_EPOCHS)
    checkpoint_dir: str = setting("", "write checkpoints here instead of RUN_DIR/checkpoints: a folder, or an s3:// "
                                  "prefix that outlives the driver's machine", metavar="DIR", show_default=False)
    max_restarts: int = setting(3, "restart the servers after one dies, hangs or goes silent at most this often, each "
                                "time from the newest checkpoint, before the job stops with the reason", most=1000)
    relaunch_min_s: float = setting(5.0, "relaunch a task after max(this, factor x average)", most=MAX_WAIT_S)
    relaunch_factor: float = setting(3.0, "relaunch a task after max(--relaunch-min-s, this x its kind's average)",
                                     most=1000.0)
    wait_timeout_s: float = setting(300.0, "give up on any single wait after this", most=MAX_WAIT_S)
    hang_timeout_s: float = setting(60.0, "a server whose serving loop has not turned for this long, or whose send to a "
                                    "peer has waited this long, is hung: it exits and is restarted like a dead one, "
                                    "within --max-restarts (default 60; longer than any single step of the job)",
                                    most=MAX_WAIT_S)
    replace_timeout_s: float = setting(120.0, "--cluster: when a server is lost, the others drop the job and the driver "
                                       "waits this long for every server to say hello again (the lost one restarted by "
                                       "its supervisor or systemd), then resumes from the newest checkpoint, within "
                                       "--max-restarts", most=MAX_WAIT_S)
    resume: bool = False  # this run continues a record's newest checkpoint (`--resume RUN_DIR` sets it)

    def check(self) -> None:
        if self.checkpoint_every is not None:
            at_least("--checkpoint-every", self.checkpoint_every, 0)
        if self.checkpoint_dir:  # checked now, not when the first checkpoint is written
            check_path("--checkpoint-dir", self.checkpoint_dir)
        at_least("--max-restarts", self.max_restarts, 0)
        above("--relaunch-min-s", self.relaunch_min_s, 0)
        at_least("--relaunch-factor", self.relaunch_factor, 1)
        for flag, value in (("--wait-timeout-s", self.wait_timeout_s), ("--hang-timeout-s", self.hang_timeout_s),
                            ("--replace-timeout-s", self.replace_timeout_s)):
            above(flag, value, 0)


@section
class GossipSettings(Section):
    """decentralised modes (--mode gossip | allreduce): Cluster-GCN batches on data-parallel workers"""

    workers: int = setting(4, "worker processes (default 4; under torchrun: its world size)", most=1024)
    clusters: int = setting(40, "METIS clusters of the graph", most=1_000_000)
    clusters_per_batch: int = setting(4, "clusters joined into one batch")
    diag_lambda: float = setting(1.0, "diagonal enhancement of the batch adjacency", most=1e6)
    gossip_every: int = setting(1, "gossip: swap parameters and the latest gradient with a random peer every k local "
                                "steps", most=MAX_EPOCHS)
    average_every: int = setting(0, "gossip: every E epochs every worker adopts the average of all models, without "
                                 "stopping (default 0: never)", metavar="E", most=MAX_EPOCHS)
    peer_timeout_s: float = setting(5.0, "a worker that does not answer a peer within this is dead; its batches go to "
                                    "the others", most=MAX_WAIT_S)
    straggler: str = setting("", "slow worker RANK down FACTOR times (experiments)", metavar="RANK:FACTOR",
                             show_default=False)

    def check(self) -> None:
        at_least("--workers", self.workers, 1)
        at_least("--clusters", self.clusters, 1)
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
        above("--peer-timeout-s", self.peer_timeout_s, 0)
        at_least("--average-every", self.average_every, 0)


@section
class ScaleSettings(Section):
    """a scale model of a bigger cluster on this box (docs/lab.md): CPU groups and time dilation"""

    dilation: float = setting(1.0, "a scale model (docs/lab.md): each host gets 1/D of its cores, and every delay, "
                              "timeout and heartbeat is D times longer, every emulated link rate D times lower; the "
                              "record keeps the raw times and the model's (raw / D), which reports read", metavar="D")
    host_cpus: float = setting(0.0, "each graph server on a host of this many cores (a cgroup: CFS quota C/D, a cpuset "
                               "where whole cores fit; needs root); each weight server gets a group of its own too, "
                               "and with --backend local each emulated Lambda (default 0: no CPU groups)", metavar="C")
    weight_host_cpus: float = setting(0.0, "--host-cpus: the weight servers' cores (default 0: the same as --host-cpus)",
                                      metavar="C")
    lambda_vcpus: float = setting(0.0, "--host-cpus: each emulated Lambda's cores (default 0: what AWS gives "
                                  "--lambda-memory-mb, 1,769 MB a vCPU)", metavar="V")
    host_memory_mb: int = setting(0, "--host-cpus: each server's memory limit (the memory controller: a host out of "
                                  "memory is killed; default 0: none)", metavar="MB")

    def check(self) -> None:
        from dorylus_py.timescale import check_dilation

        check_dilation(self.dilation)
        for flag, value in (("--host-cpus", self.host_cpus), ("--weight-host-cpus", self.weight_host_cpus),
                            ("--lambda-vcpus", self.lambda_vcpus)):
            at_least(flag, value, 0)
        at_least("--host-memory-mb", self.host_memory_mb, 0)


SECTIONS = {"run": RunSettings, "gnn": ModelSettings, "pipeline": PipelineSettings, "pool": PoolSettings,
            "aws": AwsSettings, "recovery": RecoverySettings, "gossip": GossipSettings,
            "scale": ScaleSettings}
FIELDS = {f.name: f for cls in SECTIONS.values() for f in fields(cls)}  # every setting's field, by name
SECTION_OF = {f.name: name for name, cls in SECTIONS.items() for f in fields(cls)}  # field -> its section
FIELD_TYPES = {name: str(f.type) for name, f in FIELDS.items()}  # field -> its annotation
