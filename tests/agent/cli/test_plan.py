"""`vllm-sentinel plan` through typer's CliRunner, on published configs and on the real tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vllm_sentinel.agent.cli.plan import app

MODELS = Path(__file__).parents[1] / "fixtures" / "models"
runner = CliRunner()


def plan_json(*args: str) -> dict:
    r = runner.invoke(app, [*args, "--format", "json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_llama_2_7b_json():
    doc = plan_json("--model", str(MODELS / "llama-2-7b"), "--max-model-len", "4096", "--kv-cache-gib", "16")
    assert doc["bytes_per_token"] == 524_288
    assert doc["bytes_per_request_at_max_model_len"] == 2 * 1024**3
    assert (doc["num_blocks"], doc["capacity_tokens"]) == (2048, 32_768)
    assert doc["max_concurrency_at_max_model_len"] == 8.0 and doc["safe_max_num_seqs"] == 8
    assert doc["model"].endswith("llama-2-7b/config.json")


def test_llama_3_gqa_fp8_and_default_max_model_len():
    doc = plan_json("--model", str(MODELS / "llama-3-8b" / "config.json"), "--kv-cache-gib", "40",
                    "--kv-cache-dtype", "fp8")
    assert doc["max_model_len"] == 8192  # max_position_embeddings, as vLLM derives it
    assert doc["bytes_per_token"] == 65_536
    assert doc["capacity_tokens"] == 40 * 1024**3 // 65_536
    assert doc["safe_max_num_seqs"] == 80


def test_mistral_sliding_window_and_mla():
    m = plan_json("--model", str(MODELS / "mistral-7b-v0.1"), "--kv-cache-gib", "10")
    assert m["architecture"]["sliding_window"] == 4096
    # a 32k request holds only 257 blocks of the 4096-token window
    assert m["bytes_per_request_at_max_model_len"] == 257 * 16 * 131_072
    d = plan_json("--model", str(MODELS / "deepseek-v2-lite"), "--max-model-len", "32768", "--kv-cache-gib", "20")
    assert d["architecture"]["mla"] is True and d["bytes_per_token"] == 31_104


def test_table_output_without_a_budget():
    r = runner.invoke(app, ["--model", str(MODELS / "qwen2-7b-instruct")])
    assert r.exit_code == 0, r.output
    assert "57,344 (56 KiB)" in r.stdout and "give --kv-cache-gib" in r.stdout
    r = runner.invoke(app, ["--model", str(MODELS / "llama-2-7b"), "--kv-cache-gib", "16"])
    assert "largest safe --max-num-seqs" in r.stdout and "2,048 blocks = 32,768 tokens" in r.stdout


def test_clear_errors(tmp_path):
    r = runner.invoke(app, ["--model", str(tmp_path)])
    assert r.exit_code == 1 and "no config.json in" in r.stderr
    (tmp_path / "config.json").write_text('{"hidden_size": 4096, "num_attention_heads": 32}')
    r = runner.invoke(app, ["--model", str(tmp_path)])
    assert r.exit_code == 1 and "no layer count (one of num_hidden_layers" in r.stderr
    (tmp_path / "config.json").write_text('{"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64}')
    r = runner.invoke(app, ["--model", str(tmp_path)])
    assert r.exit_code == 1 and "pass --max-model-len" in r.stderr
    r = runner.invoke(app, ["--model", str(tmp_path), "--max-model-len", "64", "--gpu-mem-gib", "24"])
    assert r.exit_code == 1 and "--non-kv-gib" in r.stderr
    r = runner.invoke(app, ["--model", str(tmp_path), "--kv-cache-gib", "1", "--gpu-mem-gib", "24"])
    assert r.exit_code == 2 and "not both" in r.stderr
    r = runner.invoke(app, ["--model", str(tmp_path), "--max-model-len", "64", "--kv-cache-dtype", "fp5"])
    assert r.exit_code == 2 and "--kv-cache-dtype 'fp5': unknown; use auto or one of" in r.stderr
    (tmp_path / "config.json").write_text("[1, 2]")
    r = runner.invoke(app, ["--model", str(tmp_path)])
    assert r.exit_code == 1 and "not a JSON object" in r.stderr


def test_gpu_memory_budget_subtracts_weights_or_the_given_non_kv():
    doc = plan_json("--model", str(MODELS / "llama-3-8b"), "--gpu-mem-gib", "80", "--gpu-memory-utilization", "0.9",
                    "--non-kv-gib", "18")
    assert doc["kv_budget_bytes"] == int(80 * 1024**3 * 0.9) - 18 * 1024**3
    assert doc["num_blocks"] == doc["kv_budget_bytes"] // (131_072 * 16)


@pytest.fixture(scope="module")
def tiny_model() -> Path:
    from vllm_sentinel.agent.demo.tiny_model import build_tiny_model
    return build_tiny_model()


def test_real_tiny_model_matches_what_the_real_vllm_cpu_server_reports(tiny_model):
    # vLLM 0.32.0 CPU, VLLM_CPU_KVCACHE_SPACE=1, block 128 (fixtures/models/README.md):
    # "CPU KV cache size: 524,288 tokens, Maximum concurrency for 2,048 tokens per request: 256.00x"
    doc = plan_json("--model", str(tiny_model), "--kv-cache-gib", "1", "--block-size", "128")
    assert doc["max_model_len"] == 2048
    assert doc["bytes_per_token"] == 2048
    assert doc["kv_cache_size_tokens"] == 524_288 and doc["max_concurrency_at_max_model_len"] == 256.0
    # weights are read from the real safetensors file when only the GPU size is given
    g = plan_json("--model", str(tiny_model), "--gpu-mem-gib", "1", "--block-size", "128")
    assert "weights" in g["kv_budget_note"] and 0 < g["kv_budget_bytes"] < int(0.92 * 1024**3)


def test_reference_capture_of_a_real_vllm_cpu_server(tmp_path, tiny_model):
    # vllm-0.32.0-cpu-one-request.prom.txt: kv_cache_memory_bytes=1073741824 -> kv_cache_size_tokens=262144,
    # num_gpu_blocks=2048, concurrency 128 at 2048; its tiny Llama had 4 KV heads (the tiny model without GQA)
    cfg = json.loads((tiny_model / "config.json").read_text())
    cfg["num_key_value_heads"] = 4
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    doc = plan_json("--model", str(tmp_path), "--kv-cache-gib", "1", "--block-size", "128")
    assert doc["bytes_per_token"] == 4096
    assert (doc["num_blocks"], doc["kv_cache_size_tokens"]) == (2048, 262_144)
    assert doc["max_concurrency_at_max_model_len"] == 128.0 and doc["safe_max_num_seqs"] == 128
