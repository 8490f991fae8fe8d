"""What each request sends: locally made prompts (token ids or text), a shared prefix, dataset prompts.

Local prompts stay the default: nothing to download and lengths under control.

- ``/generate`` and ``/v1/completions`` take token ids, so the length is exact. Without a shared prefix
  :func:`local_token_ids` is exactly :func:`workers.benchmark.bodies.prompt_ids` (same seeds, same ids), so moving
  the client onto this module changed no number.
- The chat API (``/v1/chat/completions``) only takes text. :func:`local_text` writes words drawn from
  :data:`WORDS`, common three-letter English words: with the space before it each word is 4 UTF-8 bytes,
  and such words are typically single tokens in BPE vocabularies, so ``n`` words should be about ``n``
  tokens on a real tokenizer (not checked against one here: no tokenizer is installed) and are exactly
  ``n`` on the simulator (bytes / 4). The chat template adds its own few tokens; the server's
  ``usage.prompt_tokens`` gives the exact count afterwards and is what a record should carry.
- **Shared prefix** (``prefix_tokens=K``): the first K tokens are the same for every request of a level
  (drawn from the level's seed only), the rest is drawn per request; the prefix cache can then skip K
  tokens of every prefill after the first, which is what the option measures. Without it requests share
  nothing (the first token differs), so the cache cannot flatter prefill.
- **Dataset prompts** get a short **salt** (:data:`SALT_WORDS` words unique to the request) at the start
  of their first message, right after the shared prefix if any: a server's radix cache outlives a run,
  so the same ShareGPT prompt sent in yesterday's run (or at the previous level) would otherwise
  prefill from cache.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from workers.benchmark.dataset import Dataset
from workers.benchmark.lengths import Fixed, FromDataset, LengthDist, UniformRange, sample_lengths
from workers.benchmark.wire_apis import WireApi, wire_api
from workers.errors import BenchbotError

#: Token ids of local prompts: ordinary tokens in every common vocabulary, clear of special ids
#: (the ids :func:`workers.benchmark.bodies.prompt_ids` draws).
ID_RANGE = range(1000, 30000)
SALT_WORDS = 4
WORDS = (
    "the",
    "and",
    "for",
    "are",
    "but",
    "not",
    "you",
    "all",
    "any",
    "can",
    "had",
    "her",
    "was",
    "one",
    "our",
    "out",
    "day",
    "get",
    "has",
    "him",
    "his",
    "how",
    "man",
    "new",
    "now",
    "old",
    "see",
    "two",
    "way",
    "who",
    "did",
    "its",
    "let",
    "put",
    "say",
    "she",
    "too",
    "use",
    "may",
    "run",
    "big",
    "end",
    "far",
    "few",
    "got",
    "own",
    "set",
    "try",
    "ask",
    "men",
    "why",
    "off",
    "yes",
    "yet",
    "age",
    "air",
    "art",
    "bad",
    "bed",
    "box",
    "car",
    "cut",
    "dog",
    "eat",
    "eye",
    "fun",
    "hot",
    "job",
    "key",
    "law",
    "lay",
    "low",
    "map",
    "mix",
    "oil",
    "pay",
    "red",
    "sea",
    "sit",
    "six",
    "sun",
    "ten",
    "top",
    "war",
    "win",
    "act",
    "add",
    "arm",
    "bag",
    "bar",
    "bit",
    "buy",
    "cup",
    "fit",
    "fly",
    "gas",
    "hit",
    "ice",
    "lot",
    "met",
    "net",
    "pop",
    "raw",
    "row",
    "sky",
    "tax",
    "tea",
    "via",
    "web",
    "won",
    "ago",
    "aid",
    "bus",
    "cat",
    "cow",
    "dry",
    "egg",
    "fan",
    "fix",
    "god",
    "gun",
    "hat",
    "kid",
    "leg",
    "lie",
    "mad",
    "mom",
)


# --- local prompts -----------------------------------------------------------------------------------


def _check_prefix(tokens: int, prefix_tokens: int) -> None:
    if tokens < 1 or prefix_tokens < 0:
        raise BenchbotError("a prompt is at least 1 token and a shared prefix at least 0")
    if prefix_tokens >= tokens:
        raise BenchbotError(
            f"a shared prefix of {prefix_tokens} tokens leaves nothing of a {tokens}-token prompt "
            "to each request: make the prefix shorter than the shortest prompt"
        )


def local_token_ids(seed: int, index: int, tokens: int, prefix_tokens: int = 0) -> list[int]:
    """``tokens`` ids: ``prefix_tokens`` shared by every request of ``seed``, the rest distinct per ``index``."""
    _check_prefix(tokens, prefix_tokens)
    own = random.Random(f"{seed}:{index}").choices(ID_RANGE, k=tokens - prefix_tokens)
    if not prefix_tokens:
        return own
    return random.Random(f"{seed}:prefix").choices(ID_RANGE, k=prefix_tokens) + own


def _words(key: str, count: int) -> list[str]:
    return random.Random(key).choices(WORDS, k=count)


def shared_prefix_text(seed: int, prefix_tokens: int) -> str:
    """The ~``prefix_tokens``-token text every request of ``seed`` starts with ("" for 0)."""
    return " ".join(_words(f"text:{seed}:prefix", prefix_tokens)) if prefix_tokens > 0 else ""


def local_text(seed: int, index: int, tokens: int, prefix_tokens: int = 0) -> str:
    """Text of ~``tokens`` tokens (exactly ``tokens`` by bytes / 4), prefix shared as in :func:`local_token_ids`."""
    _check_prefix(tokens, prefix_tokens)
    own = " ".join(_words(f"text:{seed}:{index}", tokens - prefix_tokens))
    return f"{shared_prefix_text(seed, prefix_tokens)} {own}" if prefix_tokens else own


def salt(seed: int, index: int) -> str:
    """A few words unique to one request, put before a dataset prompt so no cache holds it already."""
    return " ".join(_words(f"salt:{seed}:{index}", SALT_WORDS))


# --- the per-request plan ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Prompt:
    """One request's input: ids (exact length) or text / chat messages (estimated length), and max output.

    ``input_tokens`` is exact when ``exact_input``; otherwise it is the planning estimate and the record
    should take the server's ``prompt_tokens`` instead.
    """

    index: int
    input_tokens: int
    output_tokens: int
    exact_input: bool
    token_ids: tuple[int, ...] | None = None
    text: str | None = None
    messages: tuple[tuple[str, str], ...] | None = None
    dataset_line: int | None = None

    def chat_messages(self) -> list[dict[str, str]]:
        """``messages`` in the OpenAI format (chat API only)."""
        return [{"role": r, "content": c} for r, c in self.messages or ()]


def plan_prompts(
    n: int,
    seed: int,
    *,
    api: str,
    input_len: LengthDist,
    output_len: LengthDist,
    prefix_tokens: int = 0,
    dataset: Dataset | None = None,
    first_index: int = 0,
    salted: bool = True,
) -> list[Prompt]:
    """``n`` requests' prompts and output lengths, deterministic in ``seed``.

    Request ``i`` gets index ``first_index + i`` (the client numbers warmup requests after the measured
    ones, so they never share a prompt). With a dataset, ``input_len`` is ``in=dataset`` or a range that
    keeps only prompts of that length; ``out=dataset`` uses each prompt's reference reply length.
    """
    wire = wire_api(api)
    if n < 0:
        raise ValueError("n must be >= 0")
    if dataset is None:
        return _plan_local(n, seed, wire, input_len, output_len, prefix_tokens, first_index)
    return _plan_dataset(n, seed, wire, input_len, output_len, prefix_tokens, dataset, first_index, salted)


def _plan_local(
    n: int, seed: int, wire: WireApi, input_len: LengthDist, output_len: LengthDist, prefix_tokens: int, first: int
) -> list[Prompt]:
    for key, dist in (("in", input_len), ("out", output_len)):
        if isinstance(dist, FromDataset):
            raise BenchbotError(f"{key}=dataset needs a dataset: name one with data=NAME")
    assert isinstance(input_len, Fixed | UniformRange)
    if prefix_tokens and prefix_tokens >= input_len.bounds[0]:
        raise BenchbotError(
            f"prefix={prefix_tokens} must be shorter than the shortest prompt "
            f"(in={input_len.describe()}): every request needs some tokens of its own"
        )
    ins = sample_lengths(input_len, n, seed, stream="in")
    outs = sample_lengths(output_len, n, seed, stream="out")
    prompts = []
    for i, (n_in, n_out) in enumerate(zip(ins, outs, strict=True)):
        index = first + i
        if wire.prompt_shape == "messages":
            text = local_text(seed, index, n_in, prefix_tokens)
            prompts.append(Prompt(index, n_in, n_out, exact_input=False, messages=(("user", text),)))
        else:
            ids = local_token_ids(seed, index, n_in, prefix_tokens)
            prompts.append(Prompt(index, n_in, n_out, exact_input=True, token_ids=tuple(ids)))
    return prompts


def _plan_dataset(
    n: int,
    seed: int,
    wire: WireApi,
    input_len: LengthDist,
    output_len: LengthDist,
    prefix_tokens: int,
    dataset: Dataset,
    first: int,
    salted: bool,
) -> list[Prompt]:
    if isinstance(input_len, Fixed):
        raise BenchbotError(
            f"with a dataset the prompts bring their own length: use in=dataset, or a range "
            f"such as in={max(1, input_len.tokens // 2)}-{input_len.tokens * 2} to keep only "
            "prompts of that length"
        )
    input_range = input_len.bounds if isinstance(input_len, UniformRange) else None
    need_reply = isinstance(output_len, FromDataset)
    chosen = dataset.sample(n, seed, input_range=input_range, need_reply=need_reply)
    reply_lengths: Sequence[int] | None = [c.reply_tokens or 1 for c in chosen] if need_reply else None
    outs = sample_lengths(output_len, n, seed, stream="out", dataset_lengths=reply_lengths)
    if prefix_tokens < 0:
        raise BenchbotError("a shared prefix is at least 0 tokens")
    prefix = shared_prefix_text(seed, prefix_tokens)
    prompts = []
    for i, (conv, n_out) in enumerate(zip(chosen, outs, strict=True)):
        index = first + i
        lead = " ".join(part for part in (prefix, salt(seed, index) if salted else "") if part)
        extra = prefix_tokens + (SALT_WORDS if salted else 0)
        messages = list(conv.messages)
        if lead:
            # the shared prefix opens the first message (a true prefix of every request); the salt follows it
            role, content = messages[0]
            messages[0] = (role, f"{lead} {content}")
        n_in = conv.input_tokens + extra
        if wire.prompt_shape == "messages":
            prompts.append(
                Prompt(index, n_in, n_out, exact_input=False, messages=tuple(messages), dataset_line=conv.line)
            )
        else:
            text = "\n\n".join(c for _, c in messages)
            prompts.append(Prompt(index, n_in, n_out, exact_input=False, text=text, dataset_line=conv.line))
    return prompts
