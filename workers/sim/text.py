"""The simulator's token model: how many tokens a prompt is, and what text the "model" writes.

No tokenizer ships with the sim (nothing is downloaded), so:

* a prompt given as ``input_ids`` counts ``len(input_ids)`` tokens;
* a text prompt counts ``max(1, ceil(utf8_bytes / 4))`` tokens (the usual ~4 bytes per BPE token for
  English), chat messages add 4 tokens of template per message plus 3 for the assistant header;
* generated tokens are short English word pieces drawn from a fixed vocabulary by an RNG seeded from
  (``--sim-seed``, prompt), so the same prompt gets the same answer, like greedy decoding;
* except for benchbot's built-in eval questions, which ``answers.py`` answers, spelled with one piece per
  character.

Pieces are pre-encoded as JSON string bodies so the streaming hot path only concatenates bytes.
"""

from __future__ import annotations

import hashlib
import json
import random

_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "with",
    "was",
    "on",
    "be",
    "by",
    "this",
    "are",
    "from",
    "at",
    "or",
    "an",
    "have",
    "which",
    "not",
    "but",
    "they",
    "their",
    "can",
    "more",
    "one",
    "all",
    "has",
    "were",
    "been",
    "also",
    "when",
    "there",
    "its",
    "would",
    "about",
    "into",
    "only",
    "other",
    "such",
    "time",
    "some",
    "these",
    "than",
    "first",
    "new",
    "two",
    "may",
    "like",
    "then",
    "over",
    "most",
    "after",
    "used",
    "many",
    "where",
    "between",
    "through",
    "system",
    "model",
    "data",
    "number",
    "state",
    "process",
    "power",
    "light",
    "water",
    "energy",
    "language",
    "market",
    "value",
    "network",
    "memory",
    "server",
    "token",
    "batch",
    "kernel",
    "latency",
    "stream",
    "result",
    "example",
    "method",
    "question",
    "answer",
    "reason",
    "simple",
    "careful",
    "small",
    "large",
    "early",
    "later",
    "river",
    "mountain",
    "garden",
    "window",
    "morning",
    "evening",
    "history",
    "science",
    "music",
    "report",
    "design",
    "balance",
    "signal",
    "pattern",
    "measure",
    "quickly",
    "clearly",
    "often",
    "usually",
]
_SUFFIXES = ("ing", "ed", "s", "ly", "er", "ation", "ment", "ness")
EOS_TOKEN_ID = 151645  # Qwen's <|im_end|>; reported as matched_stop like SGLang
GARBAGE_PIECE = "!"


def _build_vocab() -> list[str]:
    vocab = [" " + w for w in _WORDS]
    vocab += list(_SUFFIXES)
    vocab += [",", ".", " and", " the", " of"]  # make function words a bit more frequent
    vocab.append(GARBAGE_PIECE)  # last: never sampled, only emitted by a broken (NaN) config
    return vocab


VOCAB: list[str] = _build_vocab()
VOCAB_SIZE = len(VOCAB) - 1  # sampled range (the garbage piece excluded)
GARBAGE_ID = len(VOCAB) - 1  # argmax of NaN logits is token 0, which Qwen's vocabulary spells "!"

# --- answer pieces (workers/sim/answers.py) -------------------------------------------------------
# One piece per printable ASCII character (and newline), after the garbage piece: never sampled, only
# used to spell out an answer to an eval question, one token per character.
CHAR_BASE = len(VOCAB)
_CHARS = [chr(c) for c in range(32, 127)] + ["\n"]
VOCAB += _CHARS


def encode_chars(text: str) -> list[int]:
    """The piece indices that spell ``text`` (characters outside printable ASCII become ``?``)."""
    unknown = CHAR_BASE + _CHARS.index("?")
    return [
        CHAR_BASE + (ord(ch) - 32) if 32 <= ord(ch) < 127 else CHAR_BASE + 95 if ch == "\n" else unknown for ch in text
    ]


VOCAB_JSON: list[bytes] = [json.dumps(p)[1:-1].encode() for p in VOCAB]
_TOKEN_ID_BASE = 1000  # fake ids reported in output_ids


def count_text_tokens(text: str) -> int:
    """Deterministic approximation of a tokenizer: one token per ~4 UTF-8 bytes, at least one."""
    n = len(text.encode("utf-8"))
    return max(1, (n + 3) // 4)


def count_chat_tokens(messages: list[dict]) -> int:
    """Prompt tokens for a chat request: message contents plus a fixed template cost."""
    total = 3
    for msg in messages:
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, list):  # OpenAI content parts
            content = " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
        total += 4 + (count_text_tokens(content) if content else 0)
    return total


def prompt_key(prompt: object) -> bytes:
    """A stable digest of a prompt (text, ids or messages) for seeding and the prefix cache."""
    raw = json.dumps(prompt, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.blake2b(raw, digest_size=16).digest()


#: The prefix cache matches whole blocks of this many tokens (SGLang's radix cache matches single tokens
#: with page size 1; a block is close enough for "a shared prefix of K tokens is not prefilled again").
PREFIX_BLOCK_TOKENS = 16


def prefix_blocks(prompt: object) -> tuple[bytes, ...]:
    """Chained digests of the prompt's full leading blocks: equal digests mean an equal prefix.

    Token ids block by :data:`PREFIX_BLOCK_TOKENS` ids; text (a string, or chat messages' contents in
    order) by 4 bytes a token, as :func:`count_text_tokens` counts.
    """
    if isinstance(prompt, list) and all(isinstance(x, int) for x in prompt):
        pieces = [
            json.dumps(prompt[i : i + PREFIX_BLOCK_TOKENS]).encode()
            for i in range(0, len(prompt) - PREFIX_BLOCK_TOKENS + 1, PREFIX_BLOCK_TOKENS)
        ]
    else:
        if isinstance(prompt, str):
            raw = prompt.encode()
        else:
            parts = []
            for msg in prompt if isinstance(prompt, list) else []:
                content = msg.get("content") if isinstance(msg, dict) else None
                parts.append(f"{msg.get('role') if isinstance(msg, dict) else ''}:{content}")
            raw = "\n".join(parts).encode()
        size = 4 * PREFIX_BLOCK_TOKENS
        pieces = [raw[i : i + size] for i in range(0, len(raw) - size + 1, size)]
    out, prev = [], b""
    for piece in pieces:
        prev = hashlib.blake2b(prev + piece, digest_size=16).digest()
        out.append(prev)
    return tuple(out)


def rng_for(seed: int, key: bytes) -> random.Random:
    """The per-request RNG: same seed and prompt give the same tokens and accept lengths."""
    return random.Random(int.from_bytes(key[:8], "big") ^ (seed * 0x9E3779B97F4A7C15 & (2**64 - 1)))


def natural_length(rng: random.Random) -> int:
    """How long the model would talk before EOS when ``ignore_eos`` is off (median ~250 tokens)."""
    return 24 + int(rng.lognormvariate(5.3, 0.6))


def sample_pieces(rng: random.Random, n: int) -> list[int]:
    """``n`` vocabulary indices; word pieces start with a space so the joined text reads as words."""
    choice = rng.randrange
    out: list[int] = []
    suffix_lo = len(_WORDS)
    suffix_hi = suffix_lo + len(_SUFFIXES)
    prev_suffix = True
    for _ in range(n):
        i = choice(VOCAB_SIZE)
        if suffix_lo <= i < suffix_hi and prev_suffix:
            i = choice(suffix_lo)  # no two suffixes in a row
        prev_suffix = suffix_lo <= i < suffix_hi or i >= suffix_hi
        out.append(i)
    return out


def token_id(piece_index: int) -> int:
    """The fake vocabulary id reported in ``output_ids`` for a piece (the garbage piece is id 0, like Qwen)."""
    return 0 if piece_index == GARBAGE_ID else _TOKEN_ID_BASE + piece_index
