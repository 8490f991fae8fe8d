"""Eval tasks: questions whose answers a program can check, and where they come from.

Two sources:

* ``builtin``: generated on the spot, no download. Multi-digit addition and multiplication (the answer is
  a number, found in free text) and exact copy (repeat a string), mixed one of each in turn. Item ``i``
  of seed ``s`` is always the same question, whatever ``n`` is, so a run with ``n=100`` asks the first 100
  questions of a run with ``n=300`` and the two can be compared item by item.
* a team's own JSONL file (``{"question", "answer", "regex"?}`` per line, e.g. a GSM8K test file kept on
  the worker), registered under a name by the config. GSM8K's own ``answer`` (worked solution, then
  ``#### 72``) is understood: the part after ``####`` is the answer.

Every item says how its reply is checked: ``number`` (the last number in the reply equals the answer),
``exact`` (the reply equals the answer after whitespace normalisation) or ``regex`` (the item's pattern
pulls the answer out of the reply). ``parse_builtin`` reads a built-in question back, so the simulator
can answer it (workers/sim/answers.py).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

from workers.errors import BenchbotError

BUILTIN = "builtin"
METHODS = ("number", "exact", "regex")
#: 300 questions: enough for a 5-point drop to stand out from noise (docs/eval.md has the arithmetic).
DEFAULT_N = 300
MAX_N = 5000
BUILTIN_MAX_TOKENS = 512  # room for a reasoning model's working; a plain answer stops after ~20 tokens
JSONL_MAX_TOKENS = 1024  # GSM8K-style questions are answered with a worked solution
MAX_FILE_BYTES = 64 * 2**20
MAX_ERRORS_SHOWN = 5
_NAME_RE = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")

BUILTIN_KINDS = ("add", "mul", "copy")
_ARITH_TEMPLATE = "What is {a} {op} {b}? Answer with the final number."
_COPY_TEMPLATE = "Repeat the following text exactly, and reply with nothing else:\n{text}"
_ARITH_RE = re.compile(r"What is (\d{1,12}) ([+*]) (\d{1,12})\? Answer with the final number\.")
_COPY_RE = re.compile(r"Repeat the following text exactly, and reply with nothing else:\n([^\n]+)")
_COPY_WORDS = (
    "amber",
    "birch",
    "cobalt",
    "delta",
    "ember",
    "falcon",
    "garnet",
    "harbor",
    "indigo",
    "juniper",
    "kestrel",
    "lantern",
    "meadow",
    "nickel",
    "orbit",
    "pepper",
    "quartz",
    "raven",
    "saffron",
    "timber",
    "umber",
    "velvet",
    "willow",
    "xenon",
    "yonder",
    "zephyr",
    "copper",
    "maple",
    "onyx",
    "prairie",
    "summit",
    "thistle",
)
_CODE_CHARS = "ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnpqrstuvwxyz23456789"


class TaskError(BenchbotError):
    """A task cannot be loaded: unknown name, missing or malformed file, bad ``n``."""


@dataclass(frozen=True)
class Item:
    """One question: the prompt sent, the expected answer, and how a reply is checked."""

    id: str
    prompt: str
    expected: str
    method: str = "number"  # one of METHODS
    pattern: str | None = None  # the regex, for method "regex"
    kind: str = ""  # add | mul | copy | jsonl

    @property
    def key(self) -> str:
        """Identity of the question across runs (prompt + answer): what pairs a run's items with a baseline's."""
        raw = f"{self.prompt}\0{self.expected}".encode()
        return hashlib.sha256(raw).hexdigest()[:16]


@dataclass(frozen=True)
class Task:
    """A named list of items, with the output budget a reply gets."""

    name: str
    items: tuple[Item, ...]
    max_tokens: int
    source: str
    seed: int = 0

    @property
    def fingerprint(self) -> str:
        """Hash of the questions asked: two runs with the same fingerprint asked exactly the same."""
        digest = hashlib.sha256()
        for item in self.items:
            digest.update(item.key.encode())
        return digest.hexdigest()[:16]

    def __len__(self) -> int:
        return len(self.items)


@dataclass(frozen=True)
class TaskFile:
    """Where a named JSONL task lives (on the worker's disk) and how long its replies may be."""

    path: Path
    max_tokens: int = JSONL_MAX_TOKENS


# ------------------------------------------------------------------------------------------ builtin


def _number(rng: random.Random, min_digits: int, max_digits: int) -> int:
    """A number of ``min_digits`` to ``max_digits`` digits (no leading zero)."""
    digits = rng.randint(min_digits, max_digits)
    return rng.randint(10 ** (digits - 1), 10**digits - 1)


def _builtin_item(seed: int, index: int) -> Item:
    """Item ``index`` of seed ``seed``: its own RNG, so it does not depend on how many items come before."""
    rng = random.Random(f"benchbot-eval:{seed}:{index}")  # str seeds hash with SHA-512: stable across runs
    kind = BUILTIN_KINDS[index % len(BUILTIN_KINDS)]
    if kind == "add":
        a, b = _number(rng, 3, 6), _number(rng, 3, 6)
        prompt, expected = _ARITH_TEMPLATE.format(a=a, op="+", b=b), str(a + b)
    elif kind == "mul":
        a, b = _number(rng, 2, 4), _number(rng, 2, 3)
        prompt, expected = _ARITH_TEMPLATE.format(a=a, op="*", b=b), str(a * b)
    else:
        words = rng.sample(_COPY_WORDS, rng.randint(3, 5))
        code = (
            "".join(rng.choice(_CODE_CHARS) for _ in range(3))
            + "-"
            + "".join(rng.choice(_CODE_CHARS) for _ in range(3))
        )
        words.insert(rng.randint(0, len(words)), code)
        text = " ".join(words)
        prompt, expected = _COPY_TEMPLATE.format(text=text), text
    return Item(
        id=f"{index:04d}-{kind}",
        prompt=prompt,
        expected=expected,
        method="exact" if kind == "copy" else "number",
        kind=kind,
    )


def builtin_task(n: int = DEFAULT_N, seed: int = 0, max_tokens: int = BUILTIN_MAX_TOKENS) -> Task:
    """The generated task: ``n`` questions, arithmetic and exact copy in turn, the same for the same seed."""
    n = _check_n(n)
    items = tuple(_builtin_item(seed, i) for i in range(n))
    return Task(name=BUILTIN, items=items, max_tokens=max_tokens, source=f"generated (seed {seed})", seed=seed)


def parse_builtin(prompt: str) -> tuple[str, str] | None:
    """``(kind, answer)`` when ``prompt`` contains a built-in question, else None (the simulator's oracle)."""
    m = _ARITH_RE.search(prompt)
    if m:
        a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
        return ("add", str(a + b)) if op == "+" else ("mul", str(a * b))
    m = _COPY_RE.search(prompt)
    if m:
        return "copy", m.group(1)
    return None


# ------------------------------------------------------------------------------------------ JSONL


def _final_answer(raw: str) -> str:
    """GSM8K writes the worked solution, then ``#### 72``: the answer is what follows the last ``####``."""
    return raw.rsplit("####", 1)[1].strip() if "####" in raw else raw.strip()


_NUMBER_RE = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


def _is_number(text: str) -> bool:
    """An ASCII decimal number (``Decimal`` alone takes ``NaN``, ``Infinity`` and fullwidth digits)."""
    return bool(_NUMBER_RE.fullmatch(text.replace(",", "")))


def _check_finite(answer_text: str) -> None:
    """A numeric answer no reply can ever equal (NaN, infinities, 1e999 overflowing a float) is refused."""
    lowered = answer_text.replace(",", "").strip().lower().lstrip("+-")
    if lowered in ("nan", "inf", "infinity", "snan"):
        raise ValueError(f'"answer" {answer_text!r} is not a finite number: no reply could ever match it')
    if _is_number(answer_text):
        try:
            value = float(Decimal(answer_text.replace(",", "")))
        except (InvalidOperation, OverflowError):
            value = math.inf
        if not math.isfinite(value):
            raise ValueError(f'"answer" {answer_text!r} is too large to compare: no reply could ever match it')


def _refuse_constant(name: str) -> float:
    """``json.loads`` takes ``NaN`` and ``Infinity``, which JSON does not have."""
    raise ValueError(f"{name} is not JSON (an answer must be a finite number or a string)")


def _decode(line: bytes) -> object:
    """One line's JSON, strictly: no NaN/Infinity; nesting too deep for the parser is a ValueError."""
    try:
        return json.loads(line.decode("utf-8"), parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError("nested too deeply to be a question (a line is one flat JSON object)") from None


def _parse_line(data: object) -> tuple[str, str, str | None]:
    """``(question, answer, regex)`` from one decoded line; ValueError says what is wrong with it."""
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    question = data.get("question")
    if not isinstance(question, str) or not question.strip():
        raise ValueError('"question" must be a non-empty string')
    answer = data.get("answer")
    if isinstance(answer, bool) or not isinstance(answer, str | int | float):
        raise ValueError('"answer" must be a string or a number')
    if isinstance(answer, float) and not math.isfinite(answer):  # 1e999 decodes to inf
        raise ValueError(f'"answer" {answer!r} is not a finite number: no reply could ever match it')
    answer_text = _final_answer(str(answer))
    if not answer_text:
        raise ValueError('"answer" is empty')
    _check_finite(answer_text)
    regex = data.get("regex")
    if regex is not None:
        if not isinstance(regex, str) or not regex:
            raise ValueError('"regex" must be a non-empty string')
        try:
            compiled = re.compile(regex)
        except re.error as exc:
            raise ValueError(f'"regex" {regex!r} does not compile: {exc}') from None
        if compiled.groups > 1:
            raise ValueError(f'"regex" {regex!r} has {compiled.groups} groups; use one (the answer) or none')
    return question, answer_text, regex


def _select(count: int, n: int, seed: int) -> list[int]:
    """Which lines a run of ``n`` asks: a seeded shuffle's first ``n``, in file order. The same seed gives
    nested subsets (``n=100`` is inside ``n=300``), so smaller runs still pair with a baseline."""
    if n >= count:
        return list(range(count))
    order = list(range(count))
    random.Random(f"benchbot-eval-jsonl:{seed}").shuffle(order)
    return sorted(order[:n])


def load_jsonl_task(
    path: str | Path, *, name: str = "jsonl", n: int | None = None, seed: int = 0, max_tokens: int = JSONL_MAX_TOKENS
) -> Task:
    """A team's own questions from a JSONL file; a bad file raises a TaskError naming the lines."""
    p = Path(path)
    if not p.exists():
        raise TaskError(f"task {name!r}: the file {p} does not exist on this worker")
    if not p.is_file():
        raise TaskError(f"task {name!r}: {p} is not a file")
    try:
        size = p.stat().st_size
        if size > MAX_FILE_BYTES:
            raise TaskError(f"task {name!r}: {p} is {size / 2**20:.0f} MiB; the limit is {MAX_FILE_BYTES // 2**20} MiB")
        raw = p.read_bytes()
    except OSError as exc:
        raise TaskError(f"task {name!r}: cannot read {p}: {exc.strerror or exc}") from None
    parsed: list[tuple[int, str, str, str | None]] = []
    errors: list[str] = []
    for lineno, line in enumerate(raw.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            data = _decode(line)
            question, answer, regex = _parse_line(data)
        except UnicodeDecodeError:
            errors.append(f"line {lineno}: not UTF-8 text")
        except json.JSONDecodeError as exc:
            errors.append(f"line {lineno}: not JSON ({exc.msg} at column {exc.colno})")
        except ValueError as exc:
            errors.append(f"line {lineno}: {exc}")
        else:
            parsed.append((lineno, question, answer, regex))
    if errors:
        shown = "; ".join(errors[:MAX_ERRORS_SHOWN])
        more = f" (and {len(errors) - MAX_ERRORS_SHOWN} more)" if len(errors) > MAX_ERRORS_SHOWN else ""
        raise TaskError(
            f"task {name!r}: {p} has {len(errors)} bad line{'s' if len(errors) > 1 else ''}: "
            f"{shown}{more}. Each line must be "
            '{"question": "...", "answer": "..." or a number, "regex": "..." (optional)}'
        )
    if not parsed:
        raise TaskError(f"task {name!r}: {p} has no questions")
    n = _check_n(DEFAULT_N if n is None else n)
    items = []
    for i in _select(len(parsed), n, seed):
        lineno, question, answer, regex = parsed[i]
        method = "regex" if regex else "number" if _is_number(answer) else "exact"
        items.append(
            Item(id=f"line-{lineno}", prompt=question, expected=answer, method=method, pattern=regex, kind="jsonl")
        )
    digest = hashlib.sha256(raw).hexdigest()[:12]
    picked = "all" if len(items) == len(parsed) else f"{len(items)} (seed {seed})"
    return Task(
        name=name,
        items=tuple(items),
        max_tokens=max_tokens,
        seed=seed,
        source=f"{p} (sha256 {digest}, {picked} of {len(parsed)} questions)",
    )


# ------------------------------------------------------------------------------------------ registry


def _check_n(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise TaskError(f"n={n!r}: the number of questions must be between 1 and {MAX_N}")
    return n


def check_task_files(files: Mapping[str, TaskFile | str | Path] | None) -> dict[str, TaskFile]:
    """Validate the config's ``name -> file`` map (names only: the files live on the worker)."""
    out: dict[str, TaskFile] = {}
    for name, value in (files or {}).items():
        if name == BUILTIN:
            raise TaskError(f"task name {BUILTIN!r} is reserved for the generated task")
        if not _NAME_RE.match(name):
            raise TaskError(f"task name {name!r}: use a short lowercase word (letters, digits, - or _)")
        out[name] = value if isinstance(value, TaskFile) else TaskFile(Path(value))
    return out


def task_names(files: Mapping[str, TaskFile | str | Path] | None = None) -> list[str]:
    """Every task a command may name: ``builtin`` first, then the configured files."""
    return [BUILTIN, *sorted(check_task_files(files))]


def load_task(
    name: str | None = None,
    *,
    n: int | None = None,
    seed: int = 0,
    files: Mapping[str, TaskFile | str | Path] | None = None,
) -> Task:
    """The task called ``name`` (``builtin`` when None) with ``n`` questions (``DEFAULT_N`` when None)."""
    known = check_task_files(files)
    key = (name or BUILTIN).strip().lower()
    if key == BUILTIN:
        return builtin_task(DEFAULT_N if n is None else n, seed)
    if key not in known:
        raise TaskError(f"unknown task {name!r}; known: {', '.join(task_names(files))}")
    entry = known[key]
    return load_jsonl_task(entry.path, name=key, n=n, seed=seed, max_tokens=entry.max_tokens)
