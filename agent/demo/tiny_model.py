"""Build a tiny random-weight Llama (tokenizer + weights) that a real vLLM can serve, offline, in seconds.

No model can be downloaded in CI or on an air-gapped demo box, and the sentinel only needs a server
that schedules, queues, preempts and counts tokens like a real one; a 256-wide, 4-layer Llama with a
byte-level BPE tokenizer trained on text shipped here does exactly that.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sysconfig
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

MODEL_NAME = "tiny-llama"
_COMPLETE_MARKER = ".tiny-model-complete.json"
# bumped when the recipe changes, so an old cache dir is rebuilt rather than silently reused
_RECIPE_VERSION = 2

# Text shipped in the code so the tokenizer's merges never depend on what the machine has installed;
# the stdlib files below only add volume.
_SHIPPED_TEXT = """\
The server receives requests, places them in a queue, and schedules them in batches. Each request
has a prompt and asks for a number of new tokens. The scheduler decides which requests run in the
next step, how many prompt tokens are processed, and which requests must wait. When the key value
cache is full, a running request is preempted: its blocks are freed and its tokens are computed
again later. Operators watch the time to first token, the time per output token, the number of
requests waiting, and the cache usage. A good system tells the operator why serving is slow, which
parameter to change, and what evidence supports the change. The model reads the prompt, predicts
the next token, and repeats until it reaches the limit or the end of the sequence.
the of and to in is it that for on with as was at by be this are from or have an they which one
you were her all she there would their we him been has when who will more no if out so said what
up its about into than them can only other new some could time these two may then do first any my
now such like our over man me even most made after also did many before must through back years
where much your way well down should because each just those people how too little state good very
make world still own see men work long get here between both life being under never day same
another know while last might us great old year off come since against go came right used take
three place small number large point system request token cache block queue model server batch
""".replace("\n", " ")

_SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]

# A minimal chat template so /v1/chat/completions also works (vLLM refuses chat without one).
_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
)


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the tiny model; every field is part of the cache key."""

    vocab_size: int = 2048
    hidden_size: int = 256
    intermediate_size: int = 512
    num_hidden_layers: int = 4
    # heads and KV heads set the KV-cache bytes per token the planner computes
    num_attention_heads: int = 4
    num_key_value_heads: int = 2  # grouped-query attention, as most served models use
    max_position_embeddings: int = 2048
    seed: int = 0

    def cache_key(self) -> str:
        """Short stable hash of the spec and recipe version: same spec -> same directory name."""
        blob = json.dumps({"recipe": _RECIPE_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def default_cache_dir() -> Path:
    """Per-user cache root: $VLLM_SENTINEL_CACHE, else $XDG_CACHE_HOME/vllm-sentinel, else ~/.cache/vllm-sentinel."""
    explicit = os.environ.get("VLLM_SENTINEL_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "vllm-sentinel"


def default_model_dir(spec: TinyModelSpec | None = None) -> Path:
    """Where `build_tiny_model()` puts the model when no directory is given."""
    spec = spec or TinyModelSpec()
    return default_cache_dir() / "models" / f"{MODEL_NAME}-{spec.cache_key()}"


def is_complete(model_dir: Path, spec: TinyModelSpec | None = None) -> bool:
    """True when `model_dir` holds a finished build of exactly this spec."""
    spec = spec or TinyModelSpec()
    marker = Path(model_dir) / _COMPLETE_MARKER
    try:
        return json.loads(marker.read_text()).get("key") == spec.cache_key()
    except (OSError, ValueError):
        return False


def training_corpus(max_chars: int = 400_000) -> list[str]:
    """Text for the tokenizer: the shipped paragraph plus a fixed list of stdlib sources, in a fixed order."""
    texts = [_SHIPPED_TEXT] * 20  # weight the shipped words so they become whole tokens
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    total = sum(len(t) for t in texts)
    for name in ("this.py", "textwrap.py", "argparse.py", "difflib.py", "calendar.py", "inspect.py"):
        try:
            text = (stdlib / name).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue  # a trimmed Python install: the shipped text alone is enough
        texts.append(text[: max(0, max_chars - total)])
        total += len(texts[-1])
        if total >= max_chars:
            break
    return texts


def _train_tokenizer(spec: TinyModelSpec, out_dir: Path) -> None:
    """Train a byte-level BPE on the local corpus and save it as a transformers fast tokenizer."""
    # tokenizers and transformers are the server extra (heavy, optional): loaded only to build the model
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=_SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable: round-trips any text
        show_progress=False,
    )
    tok.train_from_iterator(training_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=spec.max_position_embeddings,
    )
    fast.chat_template = _CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))


def _build_weights(spec: TinyModelSpec, out_dir: Path) -> None:
    """Random-initialised Llama with a fixed seed, saved as safetensors."""
    # torch and transformers are the server extra (heavy, optional): loaded only to build the model
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    config = LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        tie_word_embeddings=False,
    )
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config)
    model.to(torch.bfloat16)  # vLLM CPU serves bf16 anyway; float32 weights make it warn per tensor
    # the library never prints: silence transformers' "Writing model shards" progress bar
    bar_was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(str(out_dir), safe_serialization=True)
    finally:
        if bar_was_on:
            hf_logging.enable_progress_bar()


def build_tiny_model(out_dir: Path | None = None, spec: TinyModelSpec | None = None) -> Path:
    """Build (or reuse) the tiny model in `out_dir` (default: per-user cache) and return its directory.

    Idempotent and safe against a concurrent builder: the model is written to a temporary sibling
    directory and renamed into place, so a reader never sees half a model.
    """
    spec = spec or TinyModelSpec()
    target = Path(out_dir) if out_dir is not None else default_model_dir(spec)
    if is_complete(target, spec):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        _train_tokenizer(spec, staging)
        _build_weights(spec, staging)
        marker = {"key": spec.cache_key(), "name": MODEL_NAME, "spec": asdict(spec)}
        (staging / _COMPLETE_MARKER).write_text(json.dumps(marker, sort_keys=True))
        if target.exists():
            if is_complete(target, spec):  # another process finished first
                return target
            if any(target.iterdir()) and not (target / _COMPLETE_MARKER).exists():
                raise FileExistsError(
                    f"{target} exists and is not a tiny-model build; pass an empty or new directory"
                )
            shutil.rmtree(target)  # an empty dir or an older recipe's build: replace it whole
        try:
            staging.rename(target)
        except OSError:
            if is_complete(target, spec):  # lost a rename race to an identical build
                return target
            raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target
