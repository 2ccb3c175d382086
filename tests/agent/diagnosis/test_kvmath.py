"""KV arithmetic against published model configs and against vLLM 0.32's own numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_sentinel.agent.diagnosis import kvmath
from vllm_sentinel.agent.diagnosis.kvmath import GIB, MIB, ModelConfigError

MODELS = Path(__file__).parents[1] / "fixtures" / "models"


def shape(name: str) -> kvmath.KvShape:
    return kvmath.kv_shape_from_config(json.loads((MODELS / name / "config.json").read_text()))


def test_llama_7b_fp16_is_half_a_mib_per_token_and_2_gib_per_4096_token_request():
    s = shape("llama-2-7b")
    assert (s.num_layers, s.num_kv_heads, s.head_dim, s.model_dtype) == (32, 32, 128, "float16")
    per_token = kvmath.kv_bytes_per_token(s)
    assert per_token == 524_288 == MIB // 2
    assert per_token * 4096 == 2 * GIB


def test_gqa_divides_by_the_query_groups():
    s = shape("llama-3-8b")
    assert (s.num_kv_heads, s.head_dim, s.model_dtype) == (8, 128, "bfloat16")
    assert kvmath.kv_bytes_per_token(s) == 2 * 32 * 8 * 128 * 2 == 131_072
    assert kvmath.kv_bytes_per_token(s, "fp8") == 65_536
    assert kvmath.kv_bytes_per_token(s, "float32") == 262_144


def test_tensor_parallel_splits_kv_heads_but_never_below_one():
    s = shape("llama-3-8b")
    assert kvmath.kv_bytes_per_token(s, tensor_parallel_size=4) == 131_072 // 4
    assert kvmath.kv_bytes_per_token(s, tensor_parallel_size=16) == 131_072 // 8  # 1 head per GPU, replicated


def test_qwen2_ignores_an_unused_sliding_window_and_mistral_keeps_its_window():
    q = shape("qwen2-7b-instruct")
    assert (q.num_kv_heads, q.head_dim, q.sliding_window) == (4, 128, None)
    assert kvmath.kv_bytes_per_token(q) == 2 * 28 * 4 * 128 * 2 == 57_344
    m = shape("mistral-7b-v0.1")
    assert m.sliding_window == 4096
    # a 32k request holds only the window's blocks (+1 straddling), as vLLM's SlidingWindowSpec
    assert kvmath.blocks_per_request(32768, 16, m.sliding_window) == 257
    assert kvmath.blocks_per_request(1000, 16, m.sliding_window) == 63


def test_mla_stores_one_latent_per_layer():
    d = shape("deepseek-v2-lite")
    assert d.is_mla and (d.num_kv_heads, d.head_dim, d.kv_factor) == (1, 576, 1)
    assert kvmath.kv_bytes_per_token(d) == 27 * 576 * 2 == 31_104


def test_page_sizes_match_vllms_own_kv_cache_specs():
    torch = pytest.importorskip("torch")
    iface = pytest.importorskip("vllm.v1.kv_cache_interface")
    for name, cls in (("llama-3-8b", iface.FullAttentionSpec), ("llama-2-7b", iface.FullAttentionSpec),
                      ("deepseek-v2-lite", iface.MLAAttentionSpec)):
        s = shape(name)
        dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}[s.model_dtype]
        spec = cls(block_size=16, num_kv_heads=s.num_kv_heads, head_size=s.head_dim, dtype=dtype)
        # vLLM sizes one block of one layer; we size one token of all layers
        assert spec.page_size_bytes * s.num_layers == kvmath.kv_bytes_per_token(s) * 16, name


def test_reproduces_the_reference_capture_of_a_real_vllm_cpu_server():
    # vllm-0.32.0-cpu-one-request.prom.txt: kv_cache_memory_bytes=1073741824, block_size=128,
    # num_gpu_blocks=2048, kv_cache_size_tokens=262144, kv_cache_max_concurrency=128.0, max_model_len 2048;
    # its tiny Llama had 4 layers, 4 KV heads of 64, bfloat16 (see fixtures/models/README.md)
    s = kvmath.kv_shape_from_config({"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
                                     "hidden_size": 256, "torch_dtype": "bfloat16",
                                     "max_position_embeddings": 2048})
    per_token = kvmath.kv_bytes_per_token(s)
    assert per_token == 4096
    cap = kvmath.capacity_from_bytes(1_073_741_824, per_token, 128)
    assert cap.num_blocks == 2048 and cap.tokens == 262_144
    assert kvmath.max_concurrency(cap.num_blocks, 128, 2048) == 128.0
    assert kvmath.kv_cache_size_tokens(cap.num_blocks, 128, 2048) == 262_144


def test_reproduces_what_vllm_logged_for_todays_tiny_model(tmp_path):
    from vllm_sentinel.agent.demo.tiny_model import TinyModelSpec
    spec = TinyModelSpec()
    cfg = {"num_hidden_layers": spec.num_hidden_layers, "num_attention_heads": spec.num_attention_heads,
           "num_key_value_heads": spec.num_key_value_heads, "hidden_size": spec.hidden_size, "dtype": "bfloat16"}
    per_token = kvmath.kv_bytes_per_token(kvmath.kv_shape_from_config(cfg))
    assert per_token == 2048
    cap = kvmath.capacity_from_bytes(GIB, per_token, 128)
    # "CPU KV cache size: 524,288 tokens, Maximum concurrency for 2,048 tokens per request: 256.00x"
    assert kvmath.kv_cache_size_tokens(cap.num_blocks, 128, 2048) == 524_288
    assert kvmath.max_concurrency(cap.num_blocks, 128, 2048) == 256.0
    # "... for 512 tokens per request: 1024.00x"; with --num-gpu-blocks-override 8: 1,024 tokens, 2.00x
    assert kvmath.max_concurrency(cap.num_blocks, 128, 512) == 1024.0
    assert kvmath.kv_cache_size_tokens(8, 128, 512) == 1024
    assert kvmath.max_concurrency(8, 128, 512) == 2.0


def test_safe_max_num_seqs_rounds_down_and_counts_partial_blocks():
    assert kvmath.safe_max_num_seqs(2048, 128, 2048) == 128
    assert kvmath.safe_max_num_seqs(2048, 128, 2049) == 120  # 17 blocks each: 2048 // 17
    assert kvmath.safe_max_num_seqs(8, 128, 512) == 2
    assert kvmath.safe_max_num_seqs(3, 128, 512) == 0


def test_max_num_seqs_for_mean_tokens():
    assert kvmath.max_num_seqs_for_mean_tokens(262_144, 1000, 128) == 221
    assert kvmath.max_num_seqs_for_mean_tokens(100, 10_000, 16) == 1  # never below one
    with pytest.raises(ValueError):
        kvmath.max_num_seqs_for_mean_tokens(100, -100, 16)


def test_fragmentation_estimate():
    f = kvmath.fragmentation_estimate(running=10, mean_prompt_tokens=500, mean_generation_tokens=200,
                                      blocks_used=100, block_size=128)
    assert f.tokens_held == 6000 and f.slots_held == 12800
    assert f.utilisation == pytest.approx(0.46875)
    assert f.wasted_slots == 6800
    assert f.expected_last_block_waste == 635
    empty = kvmath.fragmentation_estimate(0, 0, 0, 0, 16)
    assert empty.wasted_slots == 0 and empty.utilisation != empty.utilisation  # nan


def test_head_dim_from_hidden_and_mha_default():
    s = kvmath.kv_shape_from_config({"n_layer": 12, "n_head": 12, "n_embd": 768, "torch_dtype": "float32",
                                     "n_positions": 1024})  # GPT-2 naming
    assert (s.num_kv_heads, s.head_dim, s.model_dtype, s.max_position_embeddings) == (12, 64, "bfloat16", 1024)


def test_multimodal_text_config_is_used():
    s = kvmath.kv_shape_from_config({"model_type": "llava", "text_config": {
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
        "torch_dtype": "float16"}})
    assert (s.num_layers, s.num_kv_heads, s.head_dim) == (32, 8, 128)


def test_errors_name_the_missing_keys():
    with pytest.raises(ModelConfigError, match="num_hidden_layers"):
        kvmath.kv_shape_from_config({"hidden_size": 4096})
    with pytest.raises(ModelConfigError, match="hidden_size"):
        kvmath.kv_shape_from_config({"num_hidden_layers": 2, "num_attention_heads": 4})
    with pytest.raises(ModelConfigError, match="qk_rope_head_dim"):
        kvmath.kv_shape_from_config({"num_hidden_layers": 2, "kv_lora_rank": 512})
    with pytest.raises(ModelConfigError, match="unknown KV cache dtype"):
        kvmath.dtype_bytes("fp5", "bfloat16")


def test_budget_and_formatting():
    assert kvmath.kv_budget_bytes(80 * GIB, 0.9, 14 * GIB) == int(80 * GIB * 0.9) - 14 * GIB
    assert kvmath.kv_budget_bytes(GIB, 0.5, 2 * GIB) == 0
    assert kvmath.fmt_bytes(524_288) == "512 KiB"
    assert kvmath.fmt_bytes(2 * GIB) == "2 GiB"
    assert kvmath.fmt_bytes(1536) == "1.50 KiB"
    assert kvmath.fmt_bytes(10) == "10 B"
