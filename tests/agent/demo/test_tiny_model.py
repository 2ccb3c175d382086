"""tiny_model builds a Llama that transformers loads and a tokenizer that round-trips text, offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the server extra (transformers, tokenizers) is not installed")
pytest.importorskip("tokenizers", reason="the server extra (transformers, tokenizers) is not installed")

from vllm_sentinel.agent.demo.tiny_model import (  # noqa: E402
    MODEL_NAME,
    TinyModelSpec,
    build_tiny_model,
    default_model_dir,
    is_complete,
)

# smaller than the default so the whole module stays a few seconds on 2 cores
SMALL = TinyModelSpec(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", SMALL)


def test_model_loads_with_transformers_and_generates(model_dir: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    assert config.model_type == "llama"
    assert (config.hidden_size, config.num_hidden_layers, config.num_key_value_heads) == (64, 2, 1)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    out = model.generate(torch.tensor([[1, 10, 20]]), max_new_tokens=3, do_sample=False)
    assert out.shape == (1, 6)


def test_default_spec_is_the_documented_shape() -> None:
    spec = TinyModelSpec()
    assert (spec.hidden_size, spec.num_hidden_layers) == (256, 4)
    assert MODEL_NAME == "tiny-llama"


def test_tokenizer_round_trips_text(model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    for text in ("The server receives requests.", "ünïcödé ☃ and tabs\tand\nnewlines", "x" * 300):
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
    assert tok.eos_token == "</s>" and tok.bos_token == "<s>"
    assert len(tok) == SMALL.vocab_size


def test_chat_template_renders(model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("user: hi\nassistant: ")


def test_build_is_idempotent_and_deterministic(model_dir: Path, tmp_path: Path) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in model_dir.iterdir()}
    assert build_tiny_model(model_dir, SMALL) == model_dir
    assert {p.name: p.stat().st_mtime_ns for p in model_dir.iterdir()} == before  # reused, not rebuilt

    again = build_tiny_model(tmp_path / "again", SMALL)
    assert (again / "tokenizer.json").read_bytes() == (model_dir / "tokenizer.json").read_bytes()
    assert (again / "model.safetensors").read_bytes() == (model_dir / "model.safetensors").read_bytes()


def test_incomplete_dir_is_rebuilt(model_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "half"
    target.mkdir()
    assert not is_complete(target, SMALL)
    build_tiny_model(target, SMALL)
    assert is_complete(target, SMALL)
    assert json.loads((target / "config.json").read_text())["vocab_size"] == SMALL.vocab_size


def test_refuses_to_overwrite_a_foreign_directory(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a tiny-model build"):
        build_tiny_model(tmp_path, SMALL)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_default_dir_is_per_user_cache_keyed_by_spec(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("VLLM_SENTINEL_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_model_dir().parent == tmp_path / "vllm-sentinel" / "models"
    assert default_model_dir(SMALL) != default_model_dir()
    monkeypatch.setenv("VLLM_SENTINEL_CACHE", str(tmp_path / "c"))
    assert default_model_dir().parent == tmp_path / "c" / "models"
