#!/usr/bin/env python3
"""Make a tiny Qwen2 model and its tokenizer on the spot, for a real engine on a CPU (no hub, no download).

    .venv-real/bin/python tools/make_tiny_model.py OUT_DIR [--broken]

Run with the real tier's interpreter (``.venv-real``: torch, transformers, tokenizers). Writes a
Hugging Face folder vLLM serves as ``vllm serve OUT_DIR``: ``config.json``, ``generation_config.json``,
``model.safetensors`` and a byte-level BPE tokenizer trained here on the standard library's own source.

Why the weights are *built*, not random: the greedy output of a random model is one token repeated, which
benchbot's smoke test rightly calls garbage, so a launch would never become *ready*. This model is a
"successor" machine: attention and MLP outputs are zeroed (``o_proj``, ``down_proj``), so the residual
stream of a position is its token's embedding, and the LM head maps each token's embedding to the next
token of a fixed cycle through the printable ASCII tokens of the vocabulary. Greedy decoding therefore
walks that cycle: varied, printable, deterministic text that passes the smoke test, while its answers to
an eval are nonsense (accuracy ~0). ``--broken`` is the same model with its last norm's weights zeroed, as
a kernel writing zeros would leave it: every logit equal, so greedy decoding picks token 0 again and again
(the seed's NaN signature, where the argmax of NaN logits was token 0 and the output ``!!!!``); here token 0
is the special ``<|endoftext|>``, so the text comes out empty, which benchbot must diagnose as garbage.
The engine still runs every layer: embeddings, RMSNorm, attention with its KV cache, MLP, sampling.
Sizes: hidden 128, 2 layers, 2 heads of 64, a model vocabulary of 32768 over a 1024-token tokenizer,
512 positions, fp32: ~9 M parameters, 34 MB.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import sysconfig
from pathlib import Path

VOCAB = 1024
#: The model's vocabulary is larger than the tokenizer's, as Qwen's is (vLLM accepts an id below either):
#: benchmark clients send token ids drawn from the range every common vocabulary has (benchbot: 1000-29999).
MODEL_VOCAB = 32768
HIDDEN = 128
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: How much standard-library source the tokenizer is trained on (enough for 1024 merges, a few seconds).
CORPUS_BYTES = 3_000_000


def corpus_files(limit: int = CORPUS_BYTES) -> list[str]:
    """The standard library's own ``.py`` files, in a fixed order, up to ``limit`` bytes: local text."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out, size = [], 0
    for path in sorted(root.glob("*.py")):
        out.append(str(path))
        size += path.stat().st_size
        if size >= limit:
            break
    return out


def make_tokenizer(out: Path) -> object:
    """A byte-level BPE of :data:`VOCAB` tokens with ChatML's specials, saved as a fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(corpus_files(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def printable_cycle(tokenizer: object, seed: int = 7) -> list[int]:
    """Token ids whose text is printable ASCII of 2+ characters, shuffled once: the successor cycle."""
    ids = []
    specials = set(tokenizer.all_special_ids)  # type: ignore[attr-defined]
    for i in range(len(tokenizer)):  # type: ignore[arg-type]
        if i in specials:
            continue
        text = tokenizer.decode([i])  # type: ignore[attr-defined]
        if len(text) >= 2 and text.isascii() and text.isprintable():
            ids.append(i)
    random.Random(seed).shuffle(ids)
    return ids


def make_model(out: Path, tokenizer: object, *, broken: bool) -> dict[str, object]:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")  # type: ignore[attr-defined]
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")  # type: ignore[attr-defined]
    config = Qwen2Config(
        vocab_size=MODEL_VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
        bos_token_id=pad,
        eos_token_id=eos,
        pad_token_id=pad,
        torch_dtype="float32",
    )
    model = Qwen2ForCausalLM(config)
    cycle = printable_cycle(tokenizer)
    with torch.no_grad():
        emb = torch.randn(MODEL_VOCAB, HIDDEN)
        emb = emb / emb.pow(2).mean(dim=1, keepdim=True).sqrt()  # rms 1: RMSNorm leaves it as it is
        model.model.embed_tokens.weight.copy_(emb)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.norm.weight.fill_(1.0)
        head = torch.zeros(MODEL_VOCAB, HIDDEN)
        for i, token in enumerate(cycle):  # token -> the next one in the cycle
            head[cycle[(i + 1) % len(cycle)]] = emb[token]
        # A token outside the cycle (bytes, specials) lands on the cycle token nearest its embedding.
        model.lm_head.weight.copy_(head)
        if broken:
            model.model.norm.weight.zero_()
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(bos_token_id=pad, eos_token_id=eos, pad_token_id=pad).save_pretrained(out)
    return {"parameters": sum(p.numel() for p in model.parameters()), "cycle": len(cycle)}


def check(out: Path) -> str:
    """Greedy-decode 16 tokens with transformers itself: the text vLLM should produce too."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32)
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        gen = model.generate(ids, max_new_tokens=16, do_sample=False)
    return str(tok.decode(gen[0][ids.shape[1] :]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--broken", action="store_true", help="zero the last norm: every logit equal (garbage)")
    parser.add_argument("--check", action="store_true", help="greedy-decode once with transformers")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tokenizer(args.out)
    facts = make_model(args.out, tokenizer, broken=args.broken)
    if args.check:
        facts["greedy"] = check(args.out)
    print(json.dumps(facts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
