"""Wiring for `vllm-sentinel run`: collectors for the targets, the store, rules, the API routes."""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass, field
from pathlib import Path

from vllm_sentinel.agent.alerts.rulepack import load_pack
from vllm_sentinel.agent.alerts.ruleparams import ParamOverrides, load_params_file
from vllm_sentinel.agent.daemon.alert_fixes import rank_for_alert
from vllm_sentinel.agent.daemon.alertmanager import AlertmanagerNotifier, alerts_url
from vllm_sentinel.agent.daemon.autoreport import AutoReporter
from vllm_sentinel.agent.daemon.cpu_budget import DEFAULT_BUDGET, CpuBudget
from vllm_sentinel.agent.daemon.paths import UnsafeSocketPath, prepare_socket_dir, socket_path_for
from vllm_sentinel.agent.daemon.routes import (LoadRules, daemon_route_capacity, daemon_route_capture,
                                               daemon_route_compare, daemon_route_diagnose, daemon_route_report,
                                               daemon_route_whatif)
from vllm_sentinel.agent.daemon.file_sd import TargetSpec
from vllm_sentinel.agent.daemon.sidecar import Sidecar, SidecarConfig
from vllm_sentinel.agent.daemon.targets import RELOAD_CHECK_S, TargetSet
from vllm_sentinel.agent.diagnosis import liveconfig
from vllm_sentinel.agent.diagnosis.captures import IncidentCapturer
from vllm_sentinel.agent.diagnosis.fix_ranking import pack_objectives
from vllm_sentinel.agent.diagnosis.incidents import Evaluator
from vllm_sentinel.agent.diagnosis.replica_signal import ReplicaNeed, current_replicas, desired_replicas
from vllm_sentinel.agent.diagnosis.diagnose import WindowEvaluator
from vllm_sentinel.agent.diagnosis.window import pack_window_evaluator
from vllm_sentinel.agent.store.db import DEFAULT_MEMORY_LIMIT, Store
from vllm_sentinel.collectors.base import now_ms
from vllm_sentinel.collectors.nvml import NvmlCollector
from vllm_sentinel.collectors.host_sockets import HostSockets
from vllm_sentinel.collectors.process import ProcessCollector
from vllm_sentinel.collectors.vllm import VllmCollector, default_instance, normalize_target

log = logging.getLogger(__name__)

PROCESS_INTERVAL_S = 5.0  # process discovery scans /proc: every few seconds is plenty
CONFIG_INTERVAL_S = 30.0
# DuckDB's worker threads in the daemon: none beside the caller's. Its reads and each tick's insert are small,
# and handing them to a second thread cost more CPU than it saved (a tick of 16 targets: 4.6 -> 3.5 ms); its
# hourly rewrite and roll-ups must not take cores from the vLLM beside it (DuckDB's default: one per core)
STORE_THREADS = 1


@dataclass
class DaemonOptions:
    """Everything `run` needs, already validated."""

    targets: list[str]
    db: Path
    targets_file: Path | None = None  # Prometheus file_sd (JSON/YAML), re-read when it changes
    interval_s: float = 1.0
    scrape_timeout_s: float = 3.0
    scrape_max_bytes: int = 32 * 2**20
    retention_ms: int = 7 * 86_400_000
    metrics_port: int | None = 9464
    metrics_host: str = "127.0.0.1"  # 0.0.0.0 in a pod, so the kubelet's probes and Prometheus reach it
    socket_path: Path | None = None
    nvml: str = "auto"  # auto: collect GPU counters when nvidia-ml-py is installed; on / off
    rules: list[Path] | None = None  # rule files or folders; None: the shipped pack
    eval_interval_s: float = 5.0
    reports_dir: Path | None = None  # None: <db>.reports beside the database
    params: Path | None = None  # rule threshold overrides (YAML name: value)
    alertmanagers: list[str] = field(default_factory=list)  # incidents are sent there as alerts
    vllm_profiler_s: float | None = None  # trigger vLLM's profiler this long on stack-explained incidents; None: never
    extra_collectors: list = field(default_factory=list)
    cpu_budget: float = DEFAULT_BUDGET  # fraction of one core; optional work waits and the interval stretches to keep it
    store_memory: str = DEFAULT_MEMORY_LIMIT  # DuckDB's buffer pool; past it blocks are evicted, sorts spill


def default_scrape_timeout_s(interval_s: float) -> float:
    """The interval, but at least 3 s (a loaded vLLM answers /metrics between engine steps) and at most 10 s.

    A scrape still running when the next is due makes that next one skip, never overlap.
    """
    return min(max(interval_s, 3.0), 10.0)


def build_sidecar(options: DaemonOptions) -> Sidecar:
    """A ready-to-start Sidecar; raises with a clear message on misconfiguration."""
    if not options.targets and options.targets_file is None:
        raise ValueError("no --target given; pass the vLLM server URL, e.g. --target http://127.0.0.1:8000, "
                         "or --targets-file FILE")
    if options.interval_s <= 0:
        raise ValueError("--interval must be positive")
    for url in options.alertmanagers:
        alerts_url(url)  # a wrong URL fails here, before the store is opened
    processes: dict[str, ProcessCollector] = {}  # instance -> its process collector, as targets come and go
    targets = TargetSet([static_target(t) for t in options.targets], options.targets_file,
                        _target_starter(options, processes))
    target_collectors = targets.initial()  # a bad targets file fails here, naming file:line
    names = list(targets.running)
    gpus = _gpu_collectors(options.nvml, names)
    # --params is read once, here; a request's own overrides replace it, never re-read it
    overrides = load_params_file(options.params) if options.params else None
    pack = load_pack(options.rules, overrides)  # a wrong rule file fails here, at start, naming file:line
    # what the host holds comes after what the command line says: a wrong file is named whatever the port
    check_metrics_port(options.metrics_port, options.metrics_host)
    try:  # before anything starts: a socket folder others can write would let them answer for us
        prepare_socket_dir(options.socket_path or socket_path_for(options.db))
    except UnsafeSocketPath as e:
        raise ValueError(str(e)) from None
    store = Store.open(options.db, memory_limit=options.store_memory, threads=STORE_THREADS)
    evaluator = Evaluator(pack, config_for=lambda inst: liveconfig.load_snapshot_at(store, inst, now_ms()) or {})
    budget = CpuBudget(options.cpu_budget, options.interval_s)
    reporter = AutoReporter(options.reports_dir or options.db.with_name(options.db.name + ".reports"), pack,
                            gate=budget.allow)
    capturer = IncidentCapturer(processes, profiler_s=options.vllm_profiler_s, gate=budget.allow)
    objectives = pack_objectives(pack)
    notifier = (AlertmanagerNotifier(options.alertmanagers, eval_interval_s=options.eval_interval_s,
                                     rank=lambda reader, inc, now: rank_for_alert(reader, inc, now, objectives),
                                     gate=budget.allow)
                if options.alertmanagers else None)

    def evaluate(s: Store, now: int) -> dict:
        before = dict(evaluator.open)  # resolved incidents leave evaluator.open; the notifier still needs them
        result = evaluator(s, now)
        if result.get("opened"):
            opened = {inc.id: {"incident": inc.labels.get("incident"), "instance": inc.labels.get("instance")}
                      for inc in evaluator.open.values()}
            capturer.after_evaluation(s, result, opened)
        if notifier is not None:
            resolved = set(result.get("resolved", []))
            notifier.after_evaluation(now, evaluator.open.values(), [i for i in before.values() if i.id in resolved],
                                      reader=s.reader)
        reporter.after_evaluation(s, result, now)
        result["desired_replicas"] = _desired_replicas(evaluator, now)
        return result

    config = SidecarConfig(
        interval_s=options.interval_s, retention_ms=options.retention_ms, eval_interval_s=options.eval_interval_s,
        socket_path=options.socket_path or socket_path_for(options.db), metrics_port=options.metrics_port,
        metrics_host=options.metrics_host,
        evaluate=evaluate, on_stop=[capturer.close, reporter.close] + ([notifier.close] if notifier else []),
        status_extra=lambda: {**targets.status(), "reports_dir": str(reporter.out_dir), "reports": reporter.written,
                              "captures": capturer.last_status,
                              "alertmanager": notifier.status if notifier else {}, "cpu": budget.status()},
        cpu_budget=budget,
        writer_tasks=[(CONFIG_INTERVAL_S, "config snapshot", _snapshotter(processes))],
        background_tasks=[(RELOAD_CHECK_S, "targets file", targets.reload_if_changed)] if options.targets_file else [],
        extra_routes={"/v1/report": daemon_route_report(pack), "/v1/capture": daemon_route_capture(),
                      "/v1/capacity": daemon_route_capacity(),
                      "/v1/whatif": daemon_route_whatif(),
                      "/v1/compare": daemon_route_compare(pack_window_evaluator(pack)),
                      "/v1/diagnose": daemon_route_diagnose(pack_window_evaluator(pack),
                                                            load_rules=_request_rules(options.rules, overrides))})
    sidecar = Sidecar(store, target_collectors + gpus + list(options.extra_collectors), config)

    def stop_collector(name: str) -> None:
        sidecar.remove_collector(name)
        for instance in [i for i, p in processes.items() if p.name == name]:
            del processes[instance]  # no more stack captures or config snapshots of a gone target

    targets.bind(sidecar.add_collector, stop_collector, sidecar.metrics.registry)
    budget.bind_metrics(sidecar.metrics.registry)
    if notifier is not None:
        notifier.count = lambda url, result, n: sidecar.metrics.alert_notifications.labels(url, result).inc(n)
    return sidecar


def check_metrics_port(port: int | None, host: str = "127.0.0.1") -> None:
    """Refuse a --metrics-port out of range or already taken (ValueError naming the fix), before anything starts."""
    if port is None:
        return
    if not 0 < port <= 65535:
        raise ValueError(f"--metrics-port {port}: use a port from 1 to 65535 (0 turns the own /metrics off)")
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # as the metrics server binds: SO_REUSEADDR, so a port in TIME_WAIT is not mistaken for a busy one
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        probe.bind((host, port))
    except OSError as e:
        raise ValueError(f"--metrics-port {port}: cannot listen on {host}:{port} ({e.strerror}); another process "
                         "uses it: choose another with --metrics-port N, or --metrics-port 0 to turn it off") from None
    finally:
        probe.close()


def _request_rules(rules: list[Path] | None, overrides: ParamOverrides | None) -> LoadRules:
    """For a diagnose request with its own --rules or --params: those, else the daemon's own."""
    def load(paths: list[Path] | None, params: ParamOverrides | None) -> WindowEvaluator:
        return pack_window_evaluator(load_pack(paths or rules, params or overrides))
    return load


def _target_starter(options: DaemonOptions, processes: dict[str, ProcessCollector]):
    """How one target's collectors are built: its /metrics scrape, and its processes on this host."""
    # every target's process collector runs at about the same moment: they share one read of the host's
    # socket tables (on a busy host /proc/net/tcp has thousands of rows) and of who holds which socket
    sockets = HostSockets(max_age_s=1.0)

    def start_target(spec: TargetSpec) -> list:
        vllm = VllmCollector(spec.url, instance=spec.instance, timeout_s=options.scrape_timeout_s,
                             max_bytes=options.scrape_max_bytes, labels=spec.label_dict)
        vllm.name = f"vllm {vllm.instance}"  # one scheduler job and one status line per target
        process = ProcessCollector(spec.url, instance=spec.instance, sockets=sockets)
        process.name = f"process {process.instance}"
        process.interval_s = PROCESS_INTERVAL_S
        processes[spec.instance] = process
        return [vllm, process]
    return start_target


def static_target(target: str) -> TargetSpec:
    """A --target URL as a target (no labels of its own); a bad URL is a ValueError naming the fix."""
    url = normalize_target(target)
    return TargetSpec(url=url, instance=default_instance(url))


def _desired_replicas(evaluator: Evaluator, now: int) -> dict[str, ReplicaNeed] | None:
    """The autoscaling signal from the incidents just evaluated; None (the gauge keeps its values) on failure."""
    try:
        return desired_replicas(evaluator.open.values(), current_replicas(evaluator.instant, now),
                                evaluator.config_for)
    except Exception:  # the signal must never stop incident tracking
        log.exception("desired replicas could not be computed; the last values stay published")
        return None


def _snapshotter(processes: dict[str, ProcessCollector]):
    """Record each instance's live configuration (cache_config_info + argv + config.json) when it changes."""
    # the platform (for vLLM's defaults) is inferred from cache_config_info by liveconfig. With no
    # API server process found (server down, or not on this host) nothing is recorded: the last
    # snapshot stays in force, rather than vLLM's defaults posing as the server's flags
    def snapshot(store: Store, now: int) -> None:
        for p in list(processes.values()):
            api_server = next((x for x in p.processes if x.role == "api_server"), None)
            if api_server is None and liveconfig.load_snapshot_at(store, p.instance, now) is not None:
                continue
            liveconfig.record_snapshot(store, p.instance, now, argv=api_server.argv if api_server else None)
    return snapshot


def _gpu_collectors(mode: str, instances: list[str]) -> list:
    """The NVML collector, if wanted; with one target its GPUs share that target's instance label."""
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"--nvml {mode!r}: use auto, on or off")
    if mode == "off":
        return []
    if mode == "auto" and not _nvml_library_present():
        return []  # a CPU host: no GPU collector, and reports say "no NVML series" where it matters
    # the sidecar sits beside one vLLM server: its GPUs belong to that instance, so rules can join on it
    instance = instances[0] if len(instances) == 1 else socket.gethostname()
    return [NvmlCollector(instance=instance)]


def _nvml_library_present() -> bool:
    """True when nvidia-ml-py is installed and the driver's libnvidia-ml loads (a GPU host)."""
    try:
        import pynvml  # optional (the nvml extra) and needs the driver: tried only when --nvml auto
        pynvml.nvmlInit()
    except Exception:  # ImportError, or NVMLError: library not found, no driver, no permission
        return False
    try:
        pynvml.nvmlShutdown()
    except Exception:
        pass
    return True
