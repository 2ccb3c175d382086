"""The live configuration of one vLLM instance, each value with where it came from; snapshots in the store.

Sources, most trusted first: `vllm:cache_config_info` (what the engine resolved), the vLLM command
line (`--max-num-seqs 8`), the model's config.json (layers, KV heads, max length), vLLM's defaults
(agent/diagnosis/vllm_defaults.py). A value nobody can tell is None, and its source says which source is
missing, so a fix can name what to provide instead of guessing.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_sentinel.agent.diagnosis import kvmath
from vllm_sentinel.agent.diagnosis import vllm_defaults
from vllm_sentinel.agent.diagnosis.vllm_defaults import Hardware
from vllm_sentinel.agent.store.config_snapshots import (config_snapshot_at, config_snapshots_after,
                                                        insert_config_snapshot)
from vllm_sentinel.agent.store.sample_reads import newest_labels
from vllm_sentinel.collectors.argv import parse_vllm_argv

CACHE_INFO_METRIC = "vllm:cache_config_info"
SRC_CACHE_INFO = "cache_config_info"
SRC_MODEL = "model config.json"
UNKNOWN = "unknown: "


def src_flag(flag: str) -> str:
    """Source text of a command-line value: '--max-num-seqs' -> 'flag --max-num-seqs'."""
    return f"flag {flag}"


@dataclass
class LiveConfig:
    """One instance's configuration: values by name (vLLM's names), and the source of each."""

    instance: str
    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    ts_ms: int | None = None  # when it was built, or the snapshot's time

    def get(self, name: str, default: Any = None) -> Any:
        """The value, or `default` when unknown."""
        v = self.values.get(name)
        return default if v is None else v

    def source(self, name: str) -> str:
        """Where the value came from, or 'unknown: <which source is missing>'."""
        return self.sources.get(name, UNKNOWN + "never looked up")

    def known(self, name: str) -> bool:
        """True when the value is known."""
        return self.values.get(name) is not None

    def missing(self, *names: str) -> list[str]:
        """For each unknown name, 'name (why)': the text a fix shows when it cannot compute."""
        out = []
        for n in names:
            if not self.known(n):
                why = self.source(n)
                out.append(f"{n} ({why[len(UNKNOWN):] if why.startswith(UNKNOWN) else why})")
        return out

    def set(self, name: str, value: Any, source: str) -> None:
        """Record a value and its source (None values record why they are unknown)."""
        self.values[name] = value
        self.sources[name] = source if value is not None or source.startswith(UNKNOWN) else UNKNOWN + source

    def to_json(self) -> tuple[str, str]:
        """(config JSON, sources JSON), keys sorted so equal configs serialise equally."""
        return json.dumps(self.values, sort_keys=True, default=str), json.dumps(self.sources, sort_keys=True)

    @classmethod
    def from_json(cls, instance: str, config: str, sources: str, ts_ms: int | None = None) -> "LiveConfig":
        """Inverse of to_json."""
        return cls(instance, json.loads(config), json.loads(sources), ts_ms)


# --- the command line --------------------------------------------------------------------------

# flag -> (LiveConfig name, type)
ARGV_FLAGS: dict[str, tuple[str, type]] = {
    "--model": ("model", str),
    "--served-model-name": ("served_model_name", str),
    "--max-num-seqs": ("max_num_seqs", int),
    "--max-num-batched-tokens": ("max_num_batched_tokens", int),
    "--max-model-len": ("max_model_len", int),
    "--scheduling-policy": ("scheduling_policy", str),
    "--enable-chunked-prefill": ("enable_chunked_prefill", bool),
    "--enable-prefix-caching": ("enable_prefix_caching", bool),
    "--long-prefill-token-threshold": ("long_prefill_token_threshold", int),
    "--max-num-partial-prefills": ("max_num_partial_prefills", int),
    "--block-size": ("block_size", int),
    "--gpu-memory-utilization": ("gpu_memory_utilization", float),
    "--kv-cache-dtype": ("cache_dtype", str),
    "--kv-cache-memory-bytes": ("kv_cache_memory_bytes", int),
    "--num-gpu-blocks-override": ("num_gpu_blocks_override", int),
    "--tensor-parallel-size": ("tensor_parallel_size", int),
    "--pipeline-parallel-size": ("pipeline_parallel_size", int),
    "--data-parallel-size": ("data_parallel_size", int),
    "--dtype": ("dtype", str),
    "--device": ("device", str),
    "--performance-mode": ("performance_mode", str),
}


def _convert(raw: str, typ: type) -> Any:
    if typ is bool:
        return raw.strip().lower() in ("true", "1", "yes", "")
    if typ is int:
        return int(float(raw))
    if typ is float:
        return float(raw)
    return raw


# --- cache_config_info ---------------------------------------------------------------------------

# label -> type: the engine's resolved values, each under its label's name in LiveConfig
CACHE_INFO_TYPES: dict[str, type] = {
    "block_size": int,
    "num_gpu_blocks": int,
    "gpu_memory_utilization": float,
    "enable_prefix_caching": bool,
    "kv_cache_memory_bytes": int,
    "cache_dtype": str,
    "kv_cache_size_tokens": int,
    "kv_cache_max_concurrency": float,
    "sliding_window": int,
    "num_gpu_blocks_override": int,
    "user_specified_block_size": bool,
}


def parse_cache_info(labels: dict[str, str]) -> dict[str, Any]:
    """cache_config_info labels to typed values; 'None' labels are left out.

    {'block_size': '128', 'enable_prefix_caching': 'True', 'sliding_window': 'None'}
    -> {'block_size': 128, 'enable_prefix_caching': True}
    """
    out: dict[str, Any] = {}
    for name, typ in CACHE_INFO_TYPES.items():
        raw = labels.get(name)
        if raw is None or raw in ("None", ""):
            continue
        try:
            out[name] = _convert(raw, typ) if typ is not bool else raw.lower() == "true"
        except ValueError:
            continue  # a label this version writes differently: not worth failing a snapshot for
    return out


def latest_cache_info(store: Any, instance: str, at_ms: int, lookback_ms: int = 3_600_000) -> dict[str, str] | None:
    """Labels of the newest `vllm:cache_config_info` sample of `instance` in (at_ms - lookback_ms, at_ms]."""
    return newest_labels(store, CACHE_INFO_METRIC, instance, at_ms, lookback_ms)


# --- the model's config.json ---------------------------------------------------------------------

def find_model_config(model: str | None) -> tuple[dict[str, Any] | None, str]:
    """(config.json dict, where) for a --model value: a directory, a config.json file, or a Hub id in the HF cache.

    Returns (None, why) when it is not reachable from here.
    """
    if not model:
        return None, "no --model on the command line (pass the argv, or the model directory)"
    p = Path(model).expanduser()
    candidates = [p / "config.json"] if p.is_dir() else [p] if p.is_file() else []
    if not candidates and "/" in model and not p.is_absolute():
        hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub")
        snaps = hub / f"models--{model.replace('/', '--')}" / "snapshots"
        if snaps.is_dir():
            candidates = sorted(snaps.glob("*/config.json"), key=lambda q: q.stat().st_mtime, reverse=True)
    for c in candidates:
        try:
            return json.loads(c.read_text()), str(c)
        except (OSError, ValueError) as e:
            return None, f"{c} unreadable ({e})"
    return None, f"config.json of {model!r} not reachable from this host (not a directory here, not in the HF cache)"


# --- building -------------------------------------------------------------------------------------

def infer_hardware(cache: dict[str, Any], flags: dict[str, str], given: Hardware | None) -> tuple[Hardware, str]:
    """The hardware context defaults depend on: given, else `--device cpu`, else CPU's tell-tale cache info."""
    world = int(flags.get("--tensor-parallel-size", "1") or 1) * int(flags.get("--pipeline-parallel-size", "1") or 1)
    if given is not None and given.platform is not None:
        return Hardware(given.platform, given.device_memory_bytes, given.device_name, world), "given"
    if flags.get("--device") == "cpu":
        return Hardware(vllm_defaults.PLATFORM_CPU, world_size=world), "flag --device cpu"
    # the CPU backend sizes its cache from VLLM_CPU_KVCACHE_SPACE and forces block 128 (vLLM's CPU platform)
    if (cache.get("kv_cache_memory_bytes") and cache.get("block_size") == 128
            and cache.get("user_specified_block_size") is False):
        return Hardware(vllm_defaults.PLATFORM_CPU, world_size=world), "inferred CPU from cache_config_info"
    return Hardware(None, world_size=world), "unknown"


NO_CACHE_INFO = "no vllm:cache_config_info sample for this instance (is the target scraped, stats logging on?)"
NO_ARGV = "vLLM command line not available (sidecar not on the server's host, or process not found)"


def build_live_config(instance: str, cache_labels: dict[str, str] | None = None, argv: list[str] | None = None,
                      model_config: dict[str, Any] | None = None, model_config_where: str = "",
                      hardware: Hardware | None = None, ts_ms: int | None = None) -> LiveConfig:
    """Build a LiveConfig from what is known; pure (no I/O). Each value records its source.

    `model_config_where` is the path the config.json came from, or why it is missing when None.
    """
    cfg = LiveConfig(instance, ts_ms=ts_ms)
    cache = parse_cache_info(cache_labels) if cache_labels else {}
    flags = parse_vllm_argv(argv) if argv else {}
    _apply_engine_and_flags(cfg, cache, flags)
    shape, src_model, model_missing = _apply_model_config(cfg, model_config, model_config_where)
    _apply_defaults(cfg, cache, flags, argv is None, hardware)
    _derive_kv_figures(cfg, shape, src_model, model_missing)
    return cfg


def _apply_engine_and_flags(cfg: LiveConfig, cache: dict[str, Any], flags: dict[str, str]) -> None:
    """The engine's resolved cache config first, then the command line where the engine said nothing."""
    for name, value in cache.items():
        cfg.set(name, value, SRC_CACHE_INFO)
    # flags, unless the engine already said (it resolved them)
    for flag, (name, typ) in ARGV_FLAGS.items():
        if flag in flags and not cfg.known(name):
            try:
                cfg.set(name, _convert(flags[flag], typ), src_flag(flag))
            except ValueError:
                cfg.set(name, None, f"{UNKNOWN}{flag} {flags[flag]!r} is not a {typ.__name__}")
    # max_model_len: the engine's kv_cache_size_tokens / kv_cache_max_concurrency is exactly it
    if not cfg.known("max_model_len") and cache.get("kv_cache_max_concurrency") and cache.get("kv_cache_size_tokens"):
        cfg.set("max_model_len", round(cache["kv_cache_size_tokens"] / cache["kv_cache_max_concurrency"]),
                "cache_config_info (kv_cache_size_tokens / kv_cache_max_concurrency)")


def _apply_model_config(cfg: LiveConfig, model_config: dict[str, Any] | None,
                        where: str) -> tuple[kvmath.KvShape | None, str, str]:
    """The model's shape from its config.json; returns (shape or None, its source text, why it is missing)."""
    shape = None
    model_missing = where or "model config.json not given"
    if model_config is not None:
        try:
            shape = kvmath.kv_shape_from_config(model_config)
        except kvmath.ModelConfigError as e:
            model_missing = f"{where or 'config.json'}: {e}"
    src_model = f"{SRC_MODEL} ({where})" if where and shape else SRC_MODEL
    if shape is None:
        for name in ("num_layers", "num_kv_heads", "head_dim", "model_dtype"):
            cfg.set(name, None, UNKNOWN + model_missing)
        return shape, src_model, model_missing
    for name, value in (("num_layers", shape.num_layers), ("num_kv_heads", shape.num_kv_heads),
                        ("head_dim", shape.head_dim), ("model_dtype", shape.model_dtype),
                        ("is_mla", shape.is_mla)):
        cfg.set(name, value, src_model)
    if not cfg.known("sliding_window") and shape.sliding_window:
        cfg.set("sliding_window", shape.sliding_window, src_model)
    if not cfg.known("max_model_len") and shape.max_position_embeddings:
        cfg.set("max_model_len", shape.max_position_embeddings, f"{src_model}, as vLLM derives it")
    return shape, src_model, model_missing


def _apply_defaults(cfg: LiveConfig, cache: dict[str, Any], flags: dict[str, str], no_argv: bool,
                    hardware: Hardware | None) -> None:
    """vLLM's defaults for this hardware where nothing else said; unknowns say which source is missing."""
    hw, hw_source = infer_hardware(cache, flags, hardware)
    cfg.set("platform", hw.platform, hw_source if hw.platform else UNKNOWN + "platform (CPU/GPU) not known")
    chunked = cfg.get("enable_chunked_prefill", True)
    for name, d in vllm_defaults.defaults_for(hw, cfg.get("max_model_len"), chunked).items():
        if cfg.known(name):
            continue
        if d.value is None:
            why = d.note
            if not cache and name in CACHE_INFO_NAMES:
                why = f"{NO_CACHE_INFO}; {d.note}"
            elif no_argv:
                why = f"{NO_ARGV}; {d.note}"
            cfg.set(name, None, UNKNOWN + why)
        else:
            cfg.set(name, d.value, f"default (vLLM {vllm_defaults.VLLM_VERSION}): {d.note}")
    for name in ("num_gpu_blocks", "kv_cache_size_tokens"):
        if not cfg.known(name):
            cfg.set(name, None, UNKNOWN + NO_CACHE_INFO)


def _derive_kv_figures(cfg: LiveConfig, shape: kvmath.KvShape | None, src_model: str, model_missing: str) -> None:
    """KV bytes per token, capacity in tokens and cache bytes, from the values gathered so far."""
    if shape is not None:
        try:
            bpt = kvmath.kv_bytes_per_token(shape, cfg.get("cache_dtype", "auto"), cfg.get("tensor_parallel_size", 1))
            cfg.set("kv_bytes_per_token", bpt, f"derived: {src_model} and cache dtype {cfg.get('cache_dtype', 'auto')}")
        except kvmath.ModelConfigError as e:
            cfg.set("kv_bytes_per_token", None, UNKNOWN + str(e))
    else:
        cfg.set("kv_bytes_per_token", None, UNKNOWN + model_missing)
    if cfg.known("num_gpu_blocks") and cfg.known("block_size"):
        cfg.set("kv_capacity_tokens", cfg.get("num_gpu_blocks") * cfg.get("block_size"),
                "derived: num_gpu_blocks x block_size")
        if not cfg.known("kv_cache_memory_bytes") and cfg.known("kv_bytes_per_token"):
            cfg.set("kv_cache_memory_bytes", cfg.get("kv_capacity_tokens") * cfg.get("kv_bytes_per_token"),
                    "derived: num_gpu_blocks x block_size x kv_bytes_per_token")
    else:
        cfg.set("kv_capacity_tokens", None, UNKNOWN + NO_CACHE_INFO)
    if not cfg.known("kv_cache_memory_bytes"):
        cfg.set("kv_cache_memory_bytes", None, UNKNOWN + NO_CACHE_INFO)


CACHE_INFO_NAMES = set(CACHE_INFO_TYPES)


def collect(store: Any, instance: str, at_ms: int, argv: list[str] | None = None,
            hardware: Hardware | None = None, model_dir: str | None = None) -> LiveConfig:
    """Build the configuration of `instance` at `at_ms` from the store, the argv and the model's config.json."""
    labels = latest_cache_info(store, instance, at_ms)
    model = model_dir or (parse_vllm_argv(argv).get("--model") if argv else None)
    if model:
        model_config, where = find_model_config(model)
    else:
        model_config, where = None, "no vLLM command line and no model directory given"
    return build_live_config(instance, labels, argv, model_config, where, hardware, at_ms)


# --- snapshots ------------------------------------------------------------------------------------

def save_snapshot(store: Any, cfg: LiveConfig, ts_ms: int) -> bool:
    """Record `cfg` as in force from `ts_ms`, only when it differs from the instance's latest; True if written."""
    config, sources = cfg.to_json()
    row = config_snapshot_at(store, cfg.instance, ts_ms)
    if row and json.loads(row[1]) == json.loads(config) and json.loads(row[2]) == json.loads(sources):
        return False
    insert_config_snapshot(store, cfg.instance, ts_ms, config, sources)
    return True


def load_snapshot_at(store: Any, instance: str, t_ms: int) -> LiveConfig | None:
    """The configuration in force at `t_ms`: the newest snapshot at or before it (None if none yet)."""
    row = config_snapshot_at(store, instance, t_ms)
    return LiveConfig.from_json(instance, row[1], row[2], int(row[0])) if row else None


def snapshot_history(store: Any, instance: str, start_ms: int, end_ms: int) -> list[LiveConfig]:
    """Every configuration in force during [start_ms, end_ms], oldest first (the one in force at start included)."""
    first = load_snapshot_at(store, instance, start_ms)
    rows = config_snapshots_after(store, instance, start_ms, end_ms)
    return ([first] if first else []) + [LiveConfig.from_json(instance, c, s, int(t)) for t, c, s in rows]


def config_for(store: Any, at_ms: int) -> Any:
    """incidents.py's `config_for` hook: instance -> the snapshot in force at `at_ms` ({} when none)."""
    def lookup(instance: str | None) -> LiveConfig | dict:
        if instance is None:
            return {}
        return load_snapshot_at(store, instance, at_ms) or {}
    return lookup


def record_snapshot(store: Any, instance: str, now_ms: int, argv: list[str] | None = None,
                    hardware: Hardware | None = None, model_dir: str | None = None) -> LiveConfig:
    """The daemon's per-tick call: build the configuration now and store it when it changed."""
    cfg = collect(store, instance, now_ms, argv, hardware, model_dir)
    save_snapshot(store, cfg, now_ms)
    return cfg
