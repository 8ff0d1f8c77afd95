"""The long-context tiny model: SmolLM2's tokenizer, 65,536 positions, tools in its prompt, short turns."""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine.tiny_long import POSITIONS
from engine.weights import ModelInfo, smollm2_gguf, weights_sha256

PARAMETERS = {"type": "object", "properties": {"cmd": {"type": "string"}}}
TOOL = {"type": "function", "function": {"name": "Bash", "description": "run a command", "parameters": PARAMETERS}}


def test_smollm2_tokenizer_and_long_positions(tiny_long_model: ModelInfo) -> None:
    tok: Any = AutoTokenizer.from_pretrained(tiny_long_model.path)
    gguf = smollm2_gguf()
    smollm2: Any = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    text = "def main():\n    print('hello, world')  # 42"
    assert tok(text)["input_ids"] == smollm2(text)["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(tiny_long_model.path)
    assert model.config.max_position_embeddings == POSITIONS
    assert model.config.vocab_size == len(smollm2)
    assert weights_sha256(tiny_long_model.path) == tiny_long_model.sha256


def test_template_shows_tools_calls_results_and_inline_system(tiny_long_model: ModelInfo) -> None:
    tok: Any = AutoTokenizer.from_pretrained(tiny_long_model.path)
    messages = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "list files"},
        {"role": "system", "content": "Reminder: be brief."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "Bash", "arguments": '{"cmd": "ls"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "notes.txt"},
    ]
    prompt = tok.apply_chat_template(messages, tools=[TOOL], tokenize=False, add_generation_prompt=True)
    assert prompt.startswith("<|im_start|>system\nYou are an agent.\n\n# Tools")
    assert '"name": "Bash"' in prompt and "<|im_start|>system\nReminder: be brief.<|im_end|>" in prompt
    assert '<tool_call>\n{"name": "Bash", "arguments": {"cmd": "ls"}}\n</tool_call>' in prompt
    assert "<|im_start|>user\n<tool_response>\nnotes.txt\n</tool_response><|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_turns_end_after_about_ten_tokens(tiny_long_model: ModelInfo) -> None:
    """P(end of turn) per token, on random contexts: a CLI's output cap is never what ends a reply."""
    model = AutoModelForCausalLM.from_pretrained(tiny_long_model.path)
    eos = model.config.eos_token_id
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        ids = torch.randint(0, model.config.vocab_size, (1, 1024), generator=generator)
        p_end = torch.softmax(model(ids).logits[0], -1)[:, eos]
    assert 0.05 < float(p_end.min()) and float(p_end.max()) < 0.25, (float(p_end.min()), float(p_end.max()))
