"""`vllm-sentinel plan`: KV-cache capacity planning from a model's config.json (a thin typer sub-app)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

import typer
from rich.table import Table

from vllm_sentinel.agent.cli.common import Exit, check_format, fail, out, print_json
from vllm_sentinel.agent.diagnosis import kvmath
from vllm_sentinel.agent.diagnosis.kvmath import GIB, ModelConfigError, fmt_bytes

app = typer.Typer(add_completion=False)

# weight files whose sizes estimate the non-KV memory when only the GPU size is given
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def read_model_config(model: Path) -> tuple[dict[str, Any], Path]:
    """config.json of a model directory or the file itself; ValueError names what is wrong."""
    path = model / "config.json" if model.is_dir() else model
    if not path.exists():
        where = f"no config.json in {model}" if model.is_dir() else f"{model} does not exist"
        raise ValueError(f"{where}; pass a model directory or its config.json")
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} is not readable JSON ({e})") from None
    except RecursionError:
        raise ValueError(f"{path} is nested too deeply to be a model config; pass the model's config.json") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{path} is not a JSON object")
    return cfg, path


def weights_bytes(model_dir: Path) -> int:
    """Bytes of the weight files in a model directory (0 when there are none)."""
    if not model_dir.is_dir():
        return 0
    return sum(p.stat().st_size for p in model_dir.iterdir() if p.is_file() and p.name.endswith(_WEIGHT_SUFFIXES))


@app.command()
def plan(model: Path = typer.Option(..., "--model", help="model directory or its config.json"),
         max_model_len: Optional[int] = typer.Option(None, help="tokens per request (default: from config.json, as vLLM)"),
         kv_cache_gib: Optional[float] = typer.Option(None, help="KV cache budget in GiB (vLLM logs it at start-up)"),
         gpu_mem_gib: Optional[float] = typer.Option(None, help="GPU memory in GiB (per GPU); the KV budget is "
                                                                "this x utilisation minus weights and --non-kv-gib"),
         gpu_memory_utilization: float = typer.Option(0.92, help="vLLM's --gpu-memory-utilization (default 0.92)"),
         non_kv_gib: Optional[float] = typer.Option(None, help="memory that is not KV (weights, activations, graphs) "
                                                               "in GiB; default: the weight files' size / TP"),
         kv_cache_dtype: str = typer.Option("auto", help="vLLM's --kv-cache-dtype: auto (model dtype), fp8, ..."),
         block_size: int = typer.Option(16, help="tokens per KV block (vLLM: 16 on GPU, 128 on CPU)"),
         tensor_parallel_size: int = typer.Option(1, "--tensor-parallel-size", "-tp", help="GPUs sharing the KV heads"),
         fmt: str = typer.Option("table", "--format", help="table or json")) -> None:
    """KV-cache capacity planning: bytes per token, capacity, max concurrency, the largest safe --max-num-seqs."""
    check_format(fmt, ("table", "json"))
    if kv_cache_gib is not None and gpu_mem_gib is not None:
        raise fail("give either --kv-cache-gib or --gpu-mem-gib (with --gpu-memory-utilization), not both", Exit.USAGE)
    if not 0 < gpu_memory_utilization <= 1:
        raise fail(f"--gpu-memory-utilization {gpu_memory_utilization}: must be in (0, 1]", Exit.USAGE)
    for name, value in (("--max-model-len", max_model_len), ("--block-size", block_size),
                        ("--tensor-parallel-size", tensor_parallel_size)):
        if value is not None and value <= 0:
            raise fail(f"{name} {value}: must be positive", Exit.USAGE)
    for name, gib in (("--kv-cache-gib", kv_cache_gib), ("--gpu-mem-gib", gpu_mem_gib), ("--non-kv-gib", non_kv_gib)):
        if gib is not None and not (math.isfinite(gib) and 0 <= gib <= 2**20 and (gib > 0 or name == "--non-kv-gib")):
            raise fail(f"{name} {gib}: give a size in GiB, a positive number such as 80", Exit.USAGE)
    if kv_cache_dtype != "auto" and kv_cache_dtype not in kvmath.DTYPE_BYTES:
        raise fail(f"--kv-cache-dtype {kv_cache_dtype!r}: unknown; use auto or one of "
                    f"{', '.join(sorted(kvmath.DTYPE_BYTES))}", Exit.USAGE)
    try:
        cfg, cfg_path = read_model_config(model)
    except ValueError as e:
        raise fail(str(e)) from None

    budget, note = None, ""
    if kv_cache_gib is not None:
        budget, note = int(kv_cache_gib * GIB), f"--kv-cache-gib {kv_cache_gib:g}"
    elif gpu_mem_gib is not None:
        if non_kv_gib is not None:
            non_kv, what = int(non_kv_gib * GIB), f"--non-kv-gib {non_kv_gib:g}"
        else:
            weights = weights_bytes(cfg_path.parent)
            if not weights:
                raise fail(f"no weight files next to {cfg_path} to estimate what is not KV; pass --non-kv-gib "
                            "(weights + activations per GPU) or --kv-cache-gib")
            non_kv = weights // tensor_parallel_size
            what = f"weights {fmt_bytes(non_kv)} (activations and CUDA graphs not subtracted: an upper bound)"
        budget = kvmath.kv_budget_bytes(int(gpu_mem_gib * GIB), gpu_memory_utilization, non_kv)
        note = f"{gpu_mem_gib:g} GiB x {gpu_memory_utilization:g} - {what}"
        if budget <= 0:
            raise fail(f"no memory left for the KV cache: {note} <= 0; raise --gpu-memory-utilization or use more GPUs")
    try:
        result = kvmath.make_plan(cfg, max_model_len, kv_cache_dtype, block_size, budget, note, tensor_parallel_size)
    except ModelConfigError as e:
        raise fail(f"{cfg_path}: {e}") from None
    doc = {"model": str(cfg_path), **result.as_dict()}
    if fmt == "json":
        print_json(doc)
    else:
        render_plan(doc)


def render_plan(doc: dict[str, Any]) -> None:
    """The plan as a two-column rich table."""
    a = doc["architecture"]
    t = Table(title=f"KV cache plan: {doc['model']}", show_header=False, title_justify="left")
    t.add_column("what", style="bold")
    t.add_column("value")
    heads = "1 latent (MLA)" if a["mla"] else f"{a['num_kv_heads']} KV heads x {a['head_dim']}"
    t.add_row("architecture", f"{a['model_type'] or '?'}: {a['num_layers']} layers, {heads}, {a['model_dtype']}"
              + (f", sliding window {a['sliding_window']:,}" if a["sliding_window"] else ""))
    t.add_row("KV cache dtype", doc["kv_cache_dtype"])
    t.add_row("bytes per token", f"{doc['bytes_per_token']:,} ({fmt_bytes(doc['bytes_per_token'])})")
    t.add_row(f"block ({doc['block_size']} tokens)", fmt_bytes(doc["bytes_per_block"]))
    t.add_row(f"one request at max_model_len {doc['max_model_len']:,}", fmt_bytes(doc["bytes_per_request_at_max_model_len"]))
    if doc["kv_budget_bytes"] is None:
        t.add_row("capacity", "give --kv-cache-gib, or --gpu-mem-gib and --gpu-memory-utilization")
    else:
        t.add_row("KV budget", f"{fmt_bytes(doc['kv_budget_bytes'])} ({doc['kv_budget_note']})")
        t.add_row("capacity", f"{doc['num_blocks']:,} blocks = {doc['capacity_tokens']:,} tokens")
        t.add_row("max concurrency at max_model_len", f"{doc['max_concurrency_at_max_model_len']:g}x")
        t.add_row("largest safe --max-num-seqs", f"{doc['safe_max_num_seqs']:,}")
    out.print(t)
