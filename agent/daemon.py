"""Wiring for `vllm-sentinel run`: collectors for the targets, the store, rules, the API routes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from vllm_sentinel.agent.client import daemon_route_diagnose
from vllm_sentinel.agent.incidents import Evaluator, window_evaluator
from vllm_sentinel.agent.rulepack import load_pack
from vllm_sentinel.agent.paths import socket_path_for
from vllm_sentinel.agent.sidecar import Sidecar, SidecarConfig
from vllm_sentinel.agent.store import Store
from vllm_sentinel.collectors.vllm import VllmCollector


@dataclass
class DaemonOptions:
    """Everything `run` needs, already validated."""

    targets: list[str]
    db: Path
    interval_s: float = 1.0
    scrape_timeout_s: float = 1.0
    scrape_max_bytes: int = 32 * 2**20
    retention_ms: int = 7 * 86_400_000
    metrics_port: int | None = 9464
    socket_path: Path | None = None
    nvml: str = "auto"  # auto: collect GPU counters when nvidia-ml-py is installed; on / off
    rules: list[Path] | None = None  # rule files or folders; None: the shipped pack
    eval_interval_s: float = 5.0
    extra_collectors: list = field(default_factory=list)


def build_sidecar(options: DaemonOptions) -> Sidecar:
    """A ready-to-start Sidecar; raises with a clear message on misconfiguration."""
    if not options.targets:
        raise ValueError("no --target given; pass the vLLM server URL, e.g. --target http://127.0.0.1:8000")
    if options.interval_s <= 0:
        raise ValueError("--interval must be positive")
    collectors = [VllmCollector(t, timeout_s=options.scrape_timeout_s, max_bytes=options.scrape_max_bytes)
                  for t in options.targets]
    names = [c.instance for c in collectors]
    if len(set(names)) != len(names):
        raise ValueError(f"the same target is given twice: {names}")
    for c in collectors:
        c.name = f"vllm {c.instance}"  # one scheduler job and one status line per target
    collectors += _gpu_collectors(options.nvml, names)
    pack = load_pack(options.rules)  # a wrong rule file fails here, at start, naming file:line
    store = Store.open(options.db)
    config = SidecarConfig(
        interval_s=options.interval_s, retention_ms=options.retention_ms, eval_interval_s=options.eval_interval_s,
        socket_path=options.socket_path or socket_path_for(options.db), metrics_port=options.metrics_port,
        evaluate=Evaluator(pack),
        extra_routes={"/v1/diagnose": daemon_route_diagnose(
            window_evaluator(pack), load_rules=lambda paths: window_evaluator(load_pack(paths)))})
    return Sidecar(store, collectors + list(options.extra_collectors), config)


def _gpu_collectors(mode: str, instances: list[str]) -> list:
    """The NVML collector, if wanted; with one target its GPUs share that target's instance label."""
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"--nvml {mode!r}: use auto, on or off")
    if mode == "off":
        return []
    if mode == "auto":
        import importlib.util
        if importlib.util.find_spec("pynvml") is None:
            return []
    from vllm_sentinel.collectors.nvml import NvmlCollector
    import socket
    # the sidecar sits beside one vLLM server: its GPUs belong to that instance, so rules can join on it
    instance = instances[0] if len(instances) == 1 else socket.gethostname()
    return [NvmlCollector(instance=instance)]
