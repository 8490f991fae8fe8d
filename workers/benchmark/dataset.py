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

import codecs
import json
import os
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from workers.benchmark import tokens as tok
from workers.errors import BenchbotError
from workers.json_value import RawJson

MAX_DATASET_BYTES = 2**30  # ShareGPT V3 (642 MB) fits; the conversations kept take about as much memory
#: One record's JSON at most: a prompt of ~250k tokens. A longer one fits no model (it is skipped, counted),
#: and parsing is done one record at a time so no single parse holds the GIL (the lease heartbeat) for long.
MAX_RECORD_BYTES = 2**20
#: A JSON array element is parsed before it can be skipped; beyond this the file is refused.
MAX_ARRAY_ELEMENT_BYTES = 64 * 2**20
READ_CHUNK = 2**20
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
    items: list[Conversation] = []
    skipped = 0
    samples: list[str] = []
    for line_no, record in _read_records(p, name):
        try:
            if isinstance(record, _TooLarge):
                raise ValueError(
                    f"a record of {record.size / 2**20:.1f} MiB; one may be at most {MAX_RECORD_BYTES // 2**20} MiB "
                    "(no model takes a prompt that long)"
                )
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


@dataclass(frozen=True)
class _TooLarge:
    """A record over :data:`MAX_RECORD_BYTES`, left unparsed (or parsed and dropped): skipped, counted."""

    size: int


def _read_records(path: Path, name: str) -> Iterator[tuple[int, Any]]:
    """``(line, object)`` per record, read from the file a record at a time: a JSON array (line = 1-based
    position) or JSON lines. Neither the whole text nor all its lines are ever held at once, and each
    ``json`` call parses one record, so the job's other threads (the lease heartbeat) keep running."""
    try:
        with path.open("rb") as f:
            first = f.read(READ_CHUNK)
            if first.startswith(b"\xef\xbb\xbf"):
                first = first[3:]
            if first.lstrip().startswith(b"["):
                yield from _array_records(f, first, name)
            else:
                yield from _line_records(f, first, name)
    except OSError as exc:
        raise BenchbotError(f"cannot read dataset file {name}: {exc.strerror or exc}") from exc


def _decode_line(raw: bytes, line_no: int, name: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BenchbotError(f"dataset file {name} is not UTF-8 text (line {line_no}, byte {exc.start})") from exc


def _line_records(f: Any, first: bytes, name: str) -> Iterator[tuple[int, Any]]:
    pending = first
    line_no = 0
    while True:
        # one line, but never more than a record's limit of it in memory
        cut = pending.find(b"\n")
        while cut < 0 and len(pending) <= MAX_RECORD_BYTES:
            more = f.read(READ_CHUNK)
            if not more:
                break
            pending += more
            cut = pending.find(b"\n")
        if not pending:
            return
        line_no += 1
        if cut < 0 and len(pending) > MAX_RECORD_BYTES:  # skip the rest of this line unread
            size = len(pending)
            pending = b""
            while True:
                more = f.read(READ_CHUNK)
                if not more:
                    break
                cut = more.find(b"\n")
                if cut >= 0:
                    size += cut
                    pending = more[cut + 1 :]
                    break
                size += len(more)
            yield line_no, _TooLarge(size)
            continue
        raw, pending = (pending, b"") if cut < 0 else (pending[:cut], pending[cut + 1 :])
        if len(raw) > MAX_RECORD_BYTES:
            yield line_no, _TooLarge(len(raw))
            continue
        line = _decode_line(raw, line_no, name)
        if not line.strip():
            continue
        try:
            yield line_no, json.loads(line)
        except RecursionError:
            raise BenchbotError(
                f"line {line_no} of dataset file {name} is nested too deeply to be a record. "
                "The file must hold one JSON object per line"
            ) from None
        except ValueError as exc:
            shown = line.strip()[:60]
            raise BenchbotError(
                f"line {line_no} of dataset file {name} is not valid JSON ({exc.args[0]}): "
                f"{shown!r}. The file must hold one JSON object per line"
            ) from exc


def _array_records(f: Any, first: bytes, name: str) -> Iterator[tuple[int, Any]]:
    """The elements of one JSON array, parsed one at a time from a buffer that holds about one element."""
    decoder = json.JSONDecoder()
    utf8 = codecs.getincrementaldecoder("utf-8")()
    eof = False
    read_size = READ_CHUNK

    def more() -> str:
        nonlocal eof
        data = f.read(read_size)
        if not data:
            eof = True
            try:
                return utf8.decode(b"", final=True)
            except UnicodeDecodeError as exc:
                raise BenchbotError(f"dataset file {name} is not UTF-8 text (its end)") from exc
        try:
            return utf8.decode(data)
        except UnicodeDecodeError as exc:
            raise BenchbotError(f"dataset file {name} is not UTF-8 text (near byte {f.tell()})") from exc

    def bad(why: str) -> BenchbotError:
        return BenchbotError(f"dataset file {name} starts like a JSON array but is not valid JSON ({why})")

    try:
        buf = utf8.decode(first)
    except UnicodeDecodeError as exc:
        raise BenchbotError(f"dataset file {name} is not UTF-8 text (byte {exc.start})") from exc
    pos = buf.index("[") + 1
    index = 0
    expect_value = True  # after '[' or ','
    while True:
        while pos < len(buf) and buf[pos] in " \t\r\n":
            pos += 1
        if pos >= len(buf):
            if eof:
                raise bad("it ends before its closing ']'")
            buf, pos = buf[pos:] + more(), 0
            continue
        ch = buf[pos]
        if ch == "]" and (index == 0 or not expect_value):
            rest = buf[pos + 1 :]
            while not rest.strip() and not eof:
                rest = more()
            if rest.strip():
                raise bad("something follows the closing ']'")
            return
        if not expect_value:
            if ch != ",":
                raise bad(f"expected ',' or ']' after element {index}")
            pos += 1
            expect_value = True
            continue
        try:
            value, end = decoder.raw_decode(buf, pos)
            complete = end < len(buf) or eof
        except RecursionError:
            raise bad(f"element {index + 1} is nested too deeply to be a record") from None
        except ValueError as exc:
            if eof:
                raise bad(str(exc)) from exc
            complete = False
        if not complete:  # the element goes on past the buffer: read more, twice as much each time
            if len(buf) - pos > MAX_ARRAY_ELEMENT_BYTES:
                raise bad(f"element {index + 1} is over {MAX_ARRAY_ELEMENT_BYTES // 2**20} MiB")
            buf, pos = buf[pos:] + more(), 0
            read_size = min(read_size * 2, MAX_ARRAY_ELEMENT_BYTES)
            continue
        read_size = READ_CHUNK
        index += 1
        size = end - pos
        yield index, (_TooLarge(size) if size > MAX_RECORD_BYTES else value)
        pos, expect_value = end, False
        if pos > READ_CHUNK:
            buf, pos = buf[pos:], 0


def _text_of(content: Any) -> str:
    """A message's text: a string, or the text parts of an OpenAI content list (images are left out)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, Mapping) and p.get("type") == "text"]
        return "\n".join(p for p in parts if isinstance(p, str))
    return ""


def _turns(record: RawJson) -> list[tuple[str, str]]:
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
