"""Random LoRA adapters for engine tests: B is not zero, so the adapter changes what the engine computes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from engine.weights import ModelInfo


def random_adapter(model: ModelInfo, out: Path, seed: int = 1, scale: float = 0.5) -> Path:
    """A rank-8 q/v adapter of ``model`` with B drawn from N(0, scale) under ``seed``, saved to ``out``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model.path, dtype=torch.float32)
    torch.manual_seed(seed)  # before PEFT draws A: the same seed gives the same adapter
    peft = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, param in peft.named_parameters():
            if "lora_B" in name:
                param.normal_(0, scale)  # LoRA B starts at zero; make the adapter change the output
    peft.save_pretrained(out)
    return out


ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


def light_adapter(
    model: ModelInfo,
    out: Path,
    seed: int = 1,
    scale: float = 0.5,
    rank: int = 8,
    targets: Sequence[str] = ("q_proj", "v_proj"),
) -> Path:
    """The same kind of adapter (rank 8 on q/v unless told), written from the model's config.json
    with numpy (no PEFT, no weights). A is drawn with std fan_in^-0.5, B with ``scale``.

    For tests that need a loadable adapter, not a particular one: random_adapter loads the model
    and imports transformers and PEFT, seconds on a busy machine; this takes milliseconds.
    """
    import numpy as np
    from safetensors.numpy import save_file

    cfg = json.loads((Path(model.path) / "config.json").read_text())
    hidden, heads, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head, inter = cfg.get("head_dim") or hidden // heads, cfg["intermediate_size"]
    dims = {  # (fan in, fan out)
        "q_proj": (hidden, heads * head),
        "k_proj": (hidden, kv * head),
        "v_proj": (hidden, kv * head),
        "o_proj": (heads * head, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(cfg["num_hidden_layers"]):
        for proj in targets:
            stem = f"base_model.model.model.layers.{layer}.{'self_attn' if proj in ATTENTION else 'mlp'}.{proj}"
            fan_in, fan_out = dims[proj]
            tensors[f"{stem}.lora_A.weight"] = rng.normal(0, fan_in**-0.5, (rank, fan_in)).astype(np.float32)
            tensors[f"{stem}.lora_B.weight"] = rng.normal(0, scale, (fan_out, rank)).astype(np.float32)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": sorted(targets),
        "bias": "none",
        "lora_dropout": 0.0,
        "fan_in_fan_out": False,
        "base_model_name_or_path": str(model.path),
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
        "inference_mode": True,
    }
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return out
