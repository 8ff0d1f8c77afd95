"""Models resolve locally, deterministically, and engine and trainer see one hash."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from engine import weights
from engine.weights import ModelError, resolve_model, weights_sha256


def test_tiny_is_deterministic_and_fast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONTHEJOB_CACHE", str(tmp_path / "a"))
    started = time.perf_counter()
    first = resolve_model("tiny")
    built_in = time.perf_counter() - started
    monkeypatch.setenv("ONTHEJOB_CACHE", str(tmp_path / "b"))
    second = resolve_model("tiny")
    assert first.sha256 == second.sha256 == weights_sha256(second.path)
    assert first.path != second.path
    print(f"tiny model built in {built_in:.2f}s")  # informational; no timing assertion


def test_tiny_tokenizer_has_chatml_and_byte_vocab(tiny_model: weights.ModelInfo) -> None:
    from transformers import AutoConfig, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model.path)
    ids = tok.apply_chat_template([{"role": "user", "content": "héllo"}], add_generation_prompt=True)
    if not isinstance(ids, list):
        ids = ids["input_ids"]
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")
    cfg = AutoConfig.from_pretrained(tiny_model.path)
    assert cfg.hidden_size // cfg.num_attention_heads == 64
    assert max(ids) < cfg.vocab_size


def test_default_is_converted_from_the_installed_gguf(default_model: weights.ModelInfo) -> None:
    assert weights.smollm2_gguf().suffix == ".gguf"
    assert (default_model.path / "model.safetensors").is_file()
    assert weights_sha256(default_model.path) == default_model.sha256


def test_path_models_and_errors(tiny_model: weights.ModelInfo, tmp_path: Path) -> None:
    again = resolve_model(str(tiny_model.path))
    assert again.sha256 == tiny_model.sha256 and again.name == tiny_model.name
    with pytest.raises(ModelError, match="no such folder"):
        resolve_model(str(tmp_path / "nope"))
    with pytest.raises(ModelError, match="config.json"):
        resolve_model(str(tmp_path))
