"""Where a graph server's tensor tasks run: threads of its own (``cpu``/``gpu``), emulated Lambdas
(``local``) or AWS Lambda (``lambda``), with its share of ``--lambdas``."""

from __future__ import annotations

from dorylus_py.devices import cuda_devices, device_for, local_rank
from dorylus_py.platforms import InprocPlatform, LocalLambdaPlatform
from dorylus_py.serving.job import JobSpec
from dorylus_py.serving.node import ServerNode
from dorylus_py.worker.event import LeaseEvent
from dorylus_py.worker.task_runner import TaskRunner
from graph_servers.direct import DirectWorkers


def server_device(spec: JobSpec, rank: int) -> str:
    """The torch device of this graph server's graph stages and in-process tensor tasks: ``cpu`` when its
    tasks run in Lambdas. Checked here, on the server's host (``devices.py``)."""
    cfg = spec.config
    if cfg.backend in ("local", "lambda"):
        return "cpu"
    return device_for(cfg.device, cfg.backend, rank, local_rank(spec.graph_servers, rank), cuda_devices())


def make_platform(spec: JobSpec, rank: int, node: ServerNode, device: str, direct_event: LeaseEvent, usage=None):
    """Where this server's tensor tasks run; ``--lambdas`` is shared out among the graph servers. In-process
    threads run ``direct_event``'s lease with a signing session of their own (for the weight servers),
    emulated Lambdas get the job key (their own environment); ``usage``: the server's CPU accounting,
    which counts its own threads' tensor work."""
    cfg = spec.config
    if cfg.backend not in ("local", "lambda"):
        session, gate = node.session.sibling(), node.gate
        direct = DirectWorkers(node.ctx, node.poller, cfg.tensor_threads, lambda: TaskRunner(direct_event, session, gate),
                               usage.on_tensor_thread if usage is not None else None)
        return InprocPlatform(direct, device)
    per_server = spec.lambda_share[0]  # the run plan's share of --lambdas
    seed = cfg.seed * 1000 + rank + 7919 * spec.restart
    if cfg.backend == "local":
        return LocalLambdaPlatform(per_server, cfg.lambda_latency_ms, cfg.lambda_fail_rate, cfg.lambda_memory_mb,
                                   cfg.lambda_timeout_s, seed=seed, cold_start_ms=cfg.lambda_cold_start_ms,
                                   key=node.job_key, bandwidth_mbps=cfg.lambda_bandwidth_mbps)
    from dorylus_py.platforms.aws import AwsLambdaPlatform

    return AwsLambdaPlatform(cfg.lambda_function, per_server, cfg.lambda_memory_mb, cfg.aws_region or None,
                             cfg.aws_profile or None, cfg.lambda_endpoint or None, cfg.lambda_timeout_s,
                             run_here=cfg.lambda_run_here, seed=seed, key=node.job_key)
