"""A file of real prompts: ShareGPT-style conversations or OpenAI ``messages``, one JSON object a line.

The team points at a local file in the config (a name -> path table, so a Slack user picks a name and
never types a path); nothing is downloaded. Accepted records, one per line (JSONL), or all of them in
one JSON array (the way ``ShareGPT_V3_unfiltered_cleaned_split.json`` ships):

- ShareGPT: ``{"conversations": [{"from": "human", "value": "..."}, {"from": "gpt", "value": "..."}]}``
  (speakers ``human``/``user``, ``gpt``/``assistant``/``chatgpt``/``bard``, ``system``);
- OpenAI: ``{"messages": [{"role": "user", "content": "..." | [{"type": "text", "text": "..."}]}, ...]}``;
- plain: ``{"prompt": "...", "completion": "..."}`` (``completion`` optional).

Each record becomes the leading system messages plus its **first** user turn (the prompt) and the
assistant turn right after it, if any (the reference reply, whose length ``out=dataset`` uses): the
convention of vLLM's and SGLang's ShareGPT loaders, so numbers stay comparable with theirs. Records
that do not fit (no user turn, the assistant speaks first, no text) are skipped and counted; a line
that is not JSON at all is an error, because it means the file is not what the config says.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from workers.benchmark import tokens as tok
from workers.errors import BenchbotError

MAX_DATASET_BYTES = 2 * 2**30
MAX_SKIP_SAMPLES = 5
_USER = {"human": "user", "user": "user"}
_ASSISTANT = {
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
}
_SYSTEM = {"system": "system"}
ROLE_OF = {**_USER, **_ASSISTANT, **_SYSTEM}


@dataclass(frozen=True)
class Conversation:
    """One usable record: the prompt as chat messages, its reference reply, and their token counts."""

    line: int
    messages: tuple[tuple[str, str], ...]  # (role, content): leading system turns, then one user turn
    reply: str | None
    input_tokens: int
    reply_tokens: int | None

    @property
    def prompt_text(self) -> str:
        """The prompt as one text, for ``/generate`` and ``/v1/completions`` (no chat template applied)."""
        return "\n\n".join(content for _, content in self.messages)

    def chat_messages(self) -> list[dict[str, str]]:
        """The prompt in the OpenAI chat format."""
        return [{"role": role, "content": content} for role, content in self.messages]


@dataclass(frozen=True)
class Dataset:
    """The usable conversations of a file, how they were counted, and what was skipped and why."""

    path: str
    items: tuple[Conversation, ...]
    skipped: int
    skip_samples: tuple[str, ...]
    counted_by: str = tok.APPROX

    def __len__(self) -> int:
        return len(self.items)

    def texts(self) -> list[str]:
        """Prompt texts in item order (to count them with the server's tokenizer)."""
        return [c.prompt_text for c in self.items]

    def replies(self) -> list[str | None]:
        return [c.reply for c in self.items]

    def with_token_counts(
        self, input_tokens: Sequence[int], reply_tokens: Sequence[int | None], counted_by: str = tok.SERVER
    ) -> Dataset:
        """The same items with exact counts (e.g. from :func:`workers.benchmark.tokens.server_token_counts`)."""
        if len(input_tokens) != len(self.items) or len(reply_tokens) != len(self.items):
            raise ValueError("one count per item")
        items = tuple(
            replace(c, input_tokens=max(1, i), reply_tokens=r)
            for c, i, r in zip(self.items, input_tokens, reply_tokens, strict=True)
        )
        return replace(self, items=items, counted_by=counted_by)

    def eligible(
        self, *, input_range: tuple[int, int] | None = None, need_reply: bool = False
    ) -> tuple[Conversation, ...]:
        """Items whose prompt length is inside ``input_range`` (inclusive) and, if asked, have a reply."""
        out = []
        for c in self.items:
            if input_range is not None and not input_range[0] <= c.input_tokens <= input_range[1]:
                continue
            if need_reply and not c.reply_tokens:
                continue
            out.append(c)
        return tuple(out)

    def sample(
        self, n: int, seed: int, *, input_range: tuple[int, int] | None = None, need_reply: bool = False
    ) -> list[Conversation]:
        """``n`` items, the same for the same seed: a seeded shuffle, taken in order.

        Without replacement while the eligible items last; beyond that the shuffle starts again (a
        different order), so a prompt repeats only after every eligible prompt has been used once.
        """
        pool = self.eligible(input_range=input_range, need_reply=need_reply)
        if not pool:
            wanted = []
            if input_range is not None:
                wanted.append(f"a prompt of {input_range[0]}-{input_range[1]} tokens")
            if need_reply:
                wanted.append("a reply (out=dataset)")
            raise BenchbotError(
                f"no conversation in {Path(self.path).name} has {' and '.join(wanted)} "
                f"({len(self.items)} usable; tokens counted by {self.counted_by})"
            )
        rng = random.Random(f"dataset:{seed}")
        out: list[Conversation] = []
        while len(out) < n:
            order = list(pool)
            rng.shuffle(order)
            out.extend(order[: n - len(out)])
        return out


def load_dataset(
    path: str | os.PathLike[str],
    *,
    max_records: int | None = None,
    count: Callable[[str], int] = tok.approx_tokens,
) -> Dataset:
    """Read and check a dataset file; ``count`` measures prompts and replies (approximately by default).

    Errors (missing file, not UTF-8, a line that is not JSON, nothing usable) are ``BenchbotError``s that
    name the file and the line. ``max_records`` stops after that many usable records (big files).
    """
    p = Path(path)
    name = p.name or str(p)
    if not p.exists():
        raise BenchbotError(f"dataset file {p} does not exist (check the dataset paths in the config)")
    if not p.is_file():
        raise BenchbotError(f"dataset path {p} is not a file")
    size = p.stat().st_size
    if size == 0:
        raise BenchbotError(f"dataset file {name} is empty")
    if size > MAX_DATASET_BYTES:
        raise BenchbotError(
            f"dataset file {name} is {size / 2**30:.1f} GiB; at most "
            f"{MAX_DATASET_BYTES // 2**30} GiB (cut it down, e.g. with head -n)"
        )
    try:
        text = p.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise BenchbotError(f"dataset file {name} is not UTF-8 text (byte {exc.start})") from exc
    except OSError as exc:
        raise BenchbotError(f"cannot read dataset file {name}: {exc.strerror or exc}") from exc
    items: list[Conversation] = []
    skipped = 0
    samples: list[str] = []
    for line_no, record in _records(text, name):
        try:
            messages, reply = conversation_of(record)
        except ValueError as problem:
            skipped += 1
            if len(samples) < MAX_SKIP_SAMPLES:
                samples.append(f"line {line_no}: {problem}")
            continue
        prompt = "\n\n".join(c for _, c in messages)
        items.append(
            Conversation(
                line=line_no,
                messages=messages,
                reply=reply,
                input_tokens=count(prompt),
                reply_tokens=count(reply) if reply else None,
            )
        )
        if max_records is not None and len(items) >= max_records:
            break
    if not items:
        why = "; ".join(samples) if samples else "no records"
        raise BenchbotError(
            f"dataset file {name} has no usable conversations ({why}). Each line should be "
            'a JSON object with "conversations" (ShareGPT), "messages" (OpenAI) or "prompt"'
        )
    return Dataset(path=str(p), items=tuple(items), skipped=skipped, skip_samples=tuple(samples))


def _records(text: str, name: str) -> Iterator[tuple[int, Any]]:
    """``(line, object)`` per record: a JSON array (line = 1-based position) or JSON lines."""
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            data = json.loads(stripped)
        except ValueError as exc:
            raise BenchbotError(f"dataset file {name} starts like a JSON array but is not valid JSON ({exc})") from exc
        if not isinstance(data, list):
            raise BenchbotError(f"dataset file {name} is not a JSON array of records")
        yield from enumerate(data, start=1)
        return
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield line_no, json.loads(line)
        except ValueError as exc:
            shown = line.strip()[:60]
            raise BenchbotError(
                f"line {line_no} of dataset file {name} is not valid JSON ({exc.args[0]}): "
                f"{shown!r}. The file must hold one JSON object per line"
            ) from exc


def _text_of(content: Any) -> str:
    """A message's text: a string, or the text parts of an OpenAI content list (images are left out)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, Mapping) and p.get("type") == "text"]
        return "\n".join(p for p in parts if isinstance(p, str))
    return ""


def _turns(record: Mapping[str, Any]) -> list[tuple[str, str]]:
    if "conversations" in record:
        field, speaker_key, text_key = "conversations", "from", "value"
    elif "messages" in record:
        field, speaker_key, text_key = "messages", "role", "content"
    elif "prompt" in record:
        prompt = record["prompt"]
        if not isinstance(prompt, str):
            raise ValueError('"prompt" is not a string')
        turns = [("user", prompt)]
        if isinstance(record.get("completion"), str):
            turns.append(("assistant", record["completion"]))
        return turns
    else:
        raise ValueError('no "conversations", "messages" or "prompt" field')
    raw = record[field]
    if not isinstance(raw, list):
        raise ValueError(f'"{field}" is not a list')
    turns = []
    for turn in raw:
        if not isinstance(turn, Mapping):
            raise ValueError("a turn is not an object")
        speaker = str(turn.get(speaker_key, "")).lower()
        if speaker not in ROLE_OF:
            raise ValueError(f'unknown speaker "{turn.get(speaker_key)}"')
        turns.append((ROLE_OF[speaker], _text_of(turn.get(text_key))))
    return turns


def conversation_of(record: Any) -> tuple[tuple[tuple[str, str], ...], str | None]:
    """(prompt messages, reference reply) of one record; ``ValueError`` says why a record is unusable."""
    if not isinstance(record, Mapping):
        raise ValueError("not a JSON object")
    turns = _turns(record)
    prompt: list[tuple[str, str]] = []
    i = 0
    while i < len(turns) and turns[i][0] == "system":
        if turns[i][1].strip():
            prompt.append(turns[i])
        i += 1
    if i >= len(turns):
        raise ValueError("no user turn")
    role, content = turns[i]
    if role != "user":
        raise ValueError("the conversation starts with the assistant")
    if not content.strip():
        raise ValueError("the first user turn has no text")
    prompt.append((role, content))
    reply = None
    if i + 1 < len(turns) and turns[i + 1][0] == "assistant" and turns[i + 1][1].strip():
        reply = turns[i + 1][1]
    return tuple(prompt), reply
