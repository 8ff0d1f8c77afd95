"""Random LoRA adapters for engine tests: B is not zero, so the adapter changes what the engine computes."""

from __future__ import annotations

from pathlib import Path

import torch

from engine.weights import ModelInfo


def random_adapter(model: ModelInfo, out: Path, seed: int = 1, scale: float = 0.5) -> Path:
    """A rank-8 q/v adapter of ``model`` with B drawn from N(0, scale) under ``seed``, saved to ``out``."""
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
