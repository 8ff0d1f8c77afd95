"""Random LoRA adapters for engine tests: B is not zero, so the adapter changes what the engine computes."""

from __future__ import annotations

import json
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


def light_adapter(model: ModelInfo, out: Path, seed: int = 1, scale: float = 0.5) -> Path:
    """The same kind of rank-8 q/v adapter, written from the model's config.json with numpy (no PEFT, no weights).

    For tests that need a loadable adapter, not a particular one: random_adapter loads the model
    and imports transformers and PEFT, seconds on a busy machine; this takes milliseconds.
    """
    import numpy as np
    from safetensors.numpy import save_file

    cfg = json.loads((Path(model.path) / "config.json").read_text())
    hidden, head = cfg["hidden_size"], cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    outs = {"q_proj": cfg["num_attention_heads"] * head, "v_proj": cfg["num_key_value_heads"] * head}
    rng, rank = np.random.default_rng(seed), 8
    tensors = {}
    for layer in range(cfg["num_hidden_layers"]):
        for proj, width in outs.items():
            stem = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            tensors[f"{stem}.lora_A.weight"] = rng.normal(0, hidden**-0.5, (rank, hidden)).astype(np.float32)
            tensors[f"{stem}.lora_B.weight"] = rng.normal(0, scale, (width, rank)).astype(np.float32)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": sorted(outs), "bias": "none",
              "lora_dropout": 0.0, "fan_in_fan_out": False, "base_model_name_or_path": str(model.path),
              "modules_to_save": None, "use_rslora": False, "use_dora": False, "inference_mode": True}  # fmt: skip
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return out
