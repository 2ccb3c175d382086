"""`whatif --set NAME=VALUE`: the engine parameters the model can change, parsed and applied to its configuration.

Names are vLLM's flags without the dashes (`max-num-seqs`), plus `VLLM_CPU_KVCACHE_SPACE` (GiB, the CPU
backend's KV space). Memory knobs become KV blocks through the live configuration's KV bytes per token:
`kv-cache-memory-bytes=2GiB` on a model of 2,048 bytes per token with 128-token blocks is 8,192 blocks.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from vllm_sentinel.agent.diagnosis.sim_scheduler import EngineConfig


class BadKnob(ValueError):
    """An unknown --set name, or a value the model cannot take."""


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.I)
_UNITS = {None: 1, "B": 1, "K": 1000, "KB": 1000, "KIB": 1024, "M": 1000**2, "MB": 1000**2, "MIB": 1024**2,
          "G": 1000**3, "GB": 1000**3, "GIB": 1024**3, "T": 1000**4, "TB": 1000**4, "TIB": 1024**4}
_BOOL = {"true": True, "on": True, "1": True, "yes": True, "false": False, "off": False, "0": False, "no": False}


def _positive_int(name: str, text: str) -> int:
    try:
        v = int(text.replace(",", "").replace("_", ""))
    except ValueError:
        raise BadKnob(f"--set {name}={text}: not a whole number; e.g. --set {name}=8") from None
    if v < 1:
        raise BadKnob(f"--set {name}={text}: must be 1 or more")
    return v


def _bytes(name: str, text: str) -> int:
    m = _SIZE.match(text)
    if not m:
        raise BadKnob(f"--set {name}={text}: not a size; use bytes or a unit, e.g. 2GiB or 512MiB")
    unit = m.group(2).upper() if m.group(2) else None
    return int(float(m.group(1)) * _UNITS[unit if unit in _UNITS else unit + "B"])


def _blocks_of_bytes(name: str, n_bytes: int, live: Mapping[str, Any], cfg: EngineConfig) -> int:
    per_token = live.get("kv_bytes_per_token")
    if not per_token:
        raise BadKnob(f"--set {name}: the KV bytes per token of the model are unknown (no config.json found for "
                      "it); give --set num-gpu-blocks=N instead")
    return max(1, int(n_bytes // (int(per_token) * cfg.block_size)))


def _apply_one(name: str, text: str, cfg: EngineConfig, live: Mapping[str, Any]) -> tuple[EngineConfig, str]:
    """cfg with one knob set, and the knob's change in the operator's words."""
    if name in ("max-num-seqs", "max-num-batched-tokens", "max-model-len", "long-prefill-token-threshold"):
        field = name.replace("-", "_")
        # a threshold of 0 is vLLM's "no cap"; every other knob here counts from 1
        value = 0 if name == "long-prefill-token-threshold" and text.strip() == "0" else _positive_int(name, text)
        return replace(cfg, **{field: value}), f"--{name} {getattr(cfg, field)} -> {value}"
    if name in ("num-gpu-blocks", "num-gpu-blocks-override"):
        value = _positive_int(name, text)
        return replace(cfg, num_blocks=value), f"--num-gpu-blocks-override {cfg.num_blocks} -> {value}"
    if name in ("kv-cache-memory-bytes", "VLLM_CPU_KVCACHE_SPACE"):
        n_bytes = _bytes(name, text + ("GiB" if name == "VLLM_CPU_KVCACHE_SPACE" and text.strip().isdigit() else ""))
        blocks = _blocks_of_bytes(name, n_bytes, live, cfg)
        return replace(cfg, num_blocks=blocks), f"{name} {text}: {cfg.num_blocks} -> {blocks} KV blocks"
    if name == "block-size":
        value = _positive_int(name, text)
        blocks = max(1, cfg.num_blocks * cfg.block_size // value)  # the same KV memory in blocks of the new size
        return replace(cfg, block_size=value, num_blocks=blocks), f"--block-size {cfg.block_size} -> {value}"
    if name == "enable-chunked-prefill":
        if text.strip().lower() not in _BOOL:
            raise BadKnob(f"--set {name}={text}: use true or false")
        value = _BOOL[text.strip().lower()]
        return replace(cfg, chunked_prefill=value), f"chunked prefill {'on' if cfg.chunked_prefill else 'off'} -> " \
                                                     f"{'on' if value else 'off'}"
    if name == "scheduling-policy":
        if text not in ("fcfs", "priority"):
            raise BadKnob(f"--set {name}={text}: use fcfs or priority")
        return replace(cfg, policy=text), f"--scheduling-policy {cfg.policy} -> {text}"
    if name == "kv-cache-dtype":
        return _kv_dtype(text, cfg, live)
    raise BadKnob(f"--set {name}: not a knob the model knows; use one of {', '.join(KNOBS)}")


def _kv_dtype(text: str, cfg: EngineConfig, live: Mapping[str, Any]) -> tuple[EngineConfig, str]:
    current = str(live.get("cache_dtype") or "auto")
    if not text.startswith("fp8"):
        raise BadKnob(f"--set kv-cache-dtype={text}: the model represents fp8 (fp8, fp8_e4m3, fp8_e5m2)")
    if current.startswith("fp8"):
        return cfg, f"--kv-cache-dtype {current} -> {text} (no change in bytes per token)"
    model_dtype = str(live.get("model_dtype") or live.get("dtype") or "")
    if model_dtype not in ("bfloat16", "float16", "half", "auto", ""):
        raise BadKnob(f"--set kv-cache-dtype={text}: the KV cache is {model_dtype}; only a 16-bit cache halves")
    return replace(cfg, num_blocks=cfg.num_blocks * 2), \
        f"--kv-cache-dtype {current} -> {text}: {cfg.num_blocks} -> {cfg.num_blocks * 2} KV blocks in the same memory"


KNOBS: tuple[str, ...] = ("max-num-seqs", "max-num-batched-tokens", "max-model-len", "long-prefill-token-threshold",
                          "num-gpu-blocks", "kv-cache-memory-bytes", "VLLM_CPU_KVCACHE_SPACE", "block-size",
                          "enable-chunked-prefill", "scheduling-policy", "kv-cache-dtype")


def parse_sets(items: Sequence[str]) -> list[tuple[str, str]]:
    """['max-num-seqs=2', '--num-gpu-blocks 80'] -> [('max-num-seqs', '2'), ('num-gpu-blocks', '80')]."""
    out = []
    for item in items:
        m = re.match(r"^\s*-{0,2}([A-Za-z_][A-Za-z0-9_-]*)\s*[= ]\s*(\S.*?)\s*$", item)
        if not m:
            raise BadKnob(f"--set {item!r}: write NAME=VALUE, e.g. --set max-num-seqs=2")
        name = m.group(1) if m.group(1).isupper() else m.group(1).replace("_", "-").lower()
        if name not in KNOBS and name != "num-gpu-blocks-override":
            raise BadKnob(f"--set {name}: not a knob the model knows; use one of {', '.join(KNOBS)}")
        out.append((name, m.group(2)))
    return out


def apply_sets(cfg: EngineConfig, sets: Sequence[tuple[str, str]], live: Mapping[str, Any]) -> tuple[EngineConfig, list[str]]:
    """cfg with every knob applied in order, and each change in words."""
    said = []
    for name, text in sets:
        cfg, words = _apply_one(name, text, cfg, live)
        said.append(words)
    return cfg, said


def parse_rate(text: str | None) -> float:
    """'x1.5', '1.5x', '150%' or '1.5' -> 1.5; BadKnob for anything else or a factor not above 0."""
    if text is None:
        return 1.0
    t = text.strip().lower()
    m = re.match(r"^(?:x\s*)?(\d+(?:\.\d+)?)\s*(x|%)?$", t)
    if not m:
        raise BadKnob(f"--rate {text!r}: write a factor, e.g. x1.5, 0.5x or 150%")
    factor = float(m.group(1)) / (100 if m.group(2) == "%" else 1)
    if factor <= 0:
        raise BadKnob(f"--rate {text}: the factor must be above 0")
    return factor

