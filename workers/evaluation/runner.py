"""Ask a server a task's questions greedily and score the replies.

One request per item (temperature 0, the task's ``max_tokens``), over SGLang's OpenAI chat or
completions API or its native ``/generate``, with at most ``concurrency`` in flight (httpx async, one
pooled client). As in the bench client, an optional ``gate()`` runs before every request is sent (a job
passes its lease fence check there): whatever it raises ends the eval and cancels the requests in
flight. A request that fails is retried ``retries`` times; one that still fails scores as wrong with
the error as its reason, and when more than ``MAX_FAILED_SHARE`` of the items failed the eval stops
with an EvalError: a server that does not answer has no accuracy.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from workers.benchmark.wire_apis import WIRE_APIS, wire_api
from workers.capped_http import capped_client
from workers.errors import BenchbotError
from workers.evaluation.scoring import (
    DEFAULT_ALPHA,
    DEFAULT_MIN_DROP,
    Accuracy,
    Comparison,
    ItemResult,
    accuracy,
    compare,
    score_item,
)
from workers.evaluation.tasks import Item, Task
from workers.json_value import JsonObject, JsonValue, RawJson

EVAL_SCHEMA = 1
#: The APIs an eval can ask through (the wire-API table's, in name order).
APIS = tuple(sorted(WIRE_APIS))
DEFAULT_CONCURRENCY = 32
MAX_CONCURRENCY = 256
DEFAULT_TIMEOUT_S = 600.0
MAX_FAILED_SHARE = 0.1
#: Called before each request is sent; raises (e.g. LeaseLostError) to abort the eval.
Gate = Callable[[], None]
#: Called with (items done, items in all) as replies come in.
Progress = Callable[[int, int], None]


class EvalError(BenchbotError):
    """The eval could not produce an accuracy: bad parameters, or a server that does not answer."""


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class EvalParams:
    """How to ask: which API, how many at once, the output budget (the task's when None), credentials."""

    api: str = "chat"
    concurrency: int = DEFAULT_CONCURRENCY
    max_tokens: int | None = None
    model: str | None = None  # None: the first model of /v1/models
    api_key: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S  # per request
    retries: int = 1
    #: Merged into every request body, e.g. ``{"chat_template_kwargs": {"enable_thinking": False}}``.
    extra_body: Mapping[str, JsonValue] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.api not in APIS:
            raise EvalError(f"api {self.api!r}: use one of {', '.join(APIS)}")
        if not _is_int(self.concurrency) or not 1 <= self.concurrency <= MAX_CONCURRENCY:
            raise EvalError(f"concurrency {self.concurrency!r}: use 1 to {MAX_CONCURRENCY}")
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < 1):
            raise EvalError(f"max_tokens {self.max_tokens!r}: use a positive number")
        if not _is_int(self.retries) or not 0 <= self.retries <= 5:
            raise EvalError(f"retries {self.retries!r}: use 0 to 5")
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, int | float) or not self.timeout_s > 0:
            raise EvalError(f"timeout_s {self.timeout_s!r}: use a positive number of seconds")

    def to_dict(self) -> JsonObject:
        """What a stored run says about how it asked (never the API key)."""
        return {
            "api": self.api,
            "concurrency": self.concurrency,
            "max_tokens": self.max_tokens,
            "model": self.model,
            "timeout_s": self.timeout_s,
            "retries": self.retries,
            "extra_body": dict(self.extra_body),
        }


@dataclass(frozen=True)
class EvalRun:
    """A scored eval: what was asked of which server, and how each item went."""

    task: str
    task_fingerprint: str
    task_source: str
    api: str
    model: str
    max_tokens: int
    items: tuple[ItemResult, ...]
    started_at: float
    duration_s: float
    completion_tokens: int = 0
    schema: int = EVAL_SCHEMA

    @property
    def accuracy(self) -> Accuracy:
        return accuracy(self.items)

    @property
    def failed_requests(self) -> int:
        """Items that got no reply at all (counted wrong)."""
        return sum(1 for r in self.items if r.reason.startswith("no reply"))

    def summary(self) -> str:
        """``builtin: 96.0 % (288/300, 95 % CI 93.2-97.7 %)``, plus failed requests when there were any."""
        text = f"{self.task}: {self.accuracy}"
        if self.failed_requests:
            text += f", {self.failed_requests} request(s) failed"
        return text

    def compare_to(
        self, baseline: EvalRun, *, alpha: float = DEFAULT_ALPHA, min_drop: float = DEFAULT_MIN_DROP
    ) -> Comparison:
        """This run against ``baseline`` (which must have run the same task)."""
        if baseline.task != self.task:
            raise EvalError(
                f"the baseline ran task {baseline.task!r}, this run {self.task!r}: run the baseline's task to compare"
            )
        return compare(self.items, baseline.items, alpha=alpha, min_drop=min_drop)

    def to_dict(self) -> JsonObject:
        return {
            "schema": self.schema,
            "task": self.task,
            "task_fingerprint": self.task_fingerprint,
            "task_source": self.task_source,
            "api": self.api,
            "model": self.model,
            "max_tokens": self.max_tokens,
            "started_at": self.started_at,
            "duration_s": self.duration_s,
            "completion_tokens": self.completion_tokens,
            "accuracy": self.accuracy.to_dict(),
            "items": [r.to_dict() for r in self.items],
        }

    @classmethod
    def from_dict(cls, data: RawJson) -> EvalRun:
        """Rebuild a stored run; a malformed one raises EvalError."""
        if not isinstance(data, Mapping):
            raise EvalError("a stored eval must be a JSON object")
        if data.get("schema") != EVAL_SCHEMA:
            raise EvalError(
                f"a stored eval has schema {data.get('schema')!r}; this benchbot reads schema {EVAL_SCHEMA}"
            )
        try:
            return cls(
                task=str(data["task"]),
                task_fingerprint=str(data["task_fingerprint"]),
                task_source=str(data.get("task_source") or ""),
                api=str(data["api"]),
                model=str(data.get("model") or ""),
                max_tokens=int(data["max_tokens"]),
                items=tuple(ItemResult.from_dict(r) for r in data["items"]),
                started_at=float(data["started_at"]),
                duration_s=float(data["duration_s"]),
                completion_tokens=int(data.get("completion_tokens") or 0),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise EvalError(f"a stored eval is malformed: {type(exc).__name__}: {exc}") from None


# ------------------------------------------------------------------------------------------ requests


@dataclass(frozen=True)
class _Reply:
    text: str | None
    finish_reason: str | None
    completion_tokens: int
    error: str | None = None
    retry: bool = False  # worth another try (transport error, 5xx)


def _body(api: str, item: Item, model: str, max_tokens: int, extra: Mapping[str, JsonValue]) -> tuple[str, JsonObject]:
    """``(path, JSON body)`` of a greedy request for ``item``: the API's entry in the wire-API table."""
    wire = wire_api(api)
    return wire.path, {**wire.ask_body(item.prompt, model, max_tokens), **extra}


def _parse(api: str, data: Any) -> _Reply:
    """The reply text, finish reason and token count from a 200 response body."""
    return _Reply(*wire_api(api).read_answer(data))


async def _ask(client: httpx.AsyncClient, path: str, body: dict, api: str, timeout_s: float) -> _Reply:
    try:
        resp = await client.post(path, json=body, timeout=timeout_s)
    except httpx.TimeoutException:
        return _Reply(None, None, 0, f"timed out after {timeout_s:g} s", retry=True)
    except httpx.HTTPError as exc:
        return _Reply(None, None, 0, f"{type(exc).__name__}: {exc}".strip(": "), retry=True)
    if resp.status_code != 200:
        text = resp.text.strip()[:200]
        return _Reply(None, None, 0, f"HTTP {resp.status_code}: {text}", retry=resp.status_code >= 500)
    try:
        return _parse(api, resp.json())
    except (ValueError, AttributeError, TypeError) as exc:
        return _Reply(None, None, 0, f"unexpected answer ({type(exc).__name__}): {resp.text[:200]}")


async def _model_name(client: httpx.AsyncClient, gate: Gate | None) -> str:
    if gate is not None:
        gate()
    try:
        resp = await client.get("/v1/models", timeout=30)
        resp.raise_for_status()
        return str(resp.json()["data"][0]["id"])
    except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as exc:
        raise EvalError(f"could not read the model name from /v1/models ({exc}); pass the model explicitly") from None


async def run_eval(
    base_url: str,
    task: Task,
    params: EvalParams | None = None,
    *,
    gate: Gate | None = None,
    on_progress: Progress | None = None,
) -> EvalRun:
    """Ask every item of ``task`` at ``base_url`` and score the replies (see the module doc)."""
    params = params or EvalParams()
    max_tokens = params.max_tokens or task.max_tokens
    headers = {"Authorization": f"Bearer {params.api_key}"} if params.api_key else {}
    limits = httpx.Limits(max_connections=params.concurrency, max_keepalive_connections=params.concurrency)
    started, t0 = time.time(), time.monotonic()
    results: list[ItemResult | None] = [None] * len(task.items)
    tokens = [0] * len(task.items)
    failed_limit = max(3, int(MAX_FAILED_SHARE * len(task.items)))
    failures: list[str] = []
    done = 0
    # the engine is reached directly, never through a proxy from the worker's environment, and its
    # answers are size-capped (workers/capped_http.py)
    async with capped_client(base_url=base_url.rstrip("/"), headers=headers, limits=limits) as client:
        model = params.model
        if model is None and wire_api(params.api).needs_model:
            model = await _model_name(client, gate)
        todo = iter(range(len(task.items)))

        async def worker() -> None:
            nonlocal done
            for i in todo:  # one shared iterator: next() never awaits, so no index is taken twice
                item = task.items[i]
                path, body = _body(params.api, item, model or "", max_tokens, params.extra_body)
                for _attempt in range(params.retries + 1):
                    if gate is not None:
                        gate()
                    reply = await _ask(client, path, body, params.api, params.timeout_s)
                    if reply.error is None or not reply.retry:
                        break
                if reply.error is not None:
                    failures.append(f"{item.id}: {reply.error}")
                    if len(failures) > failed_limit:
                        raise EvalError(
                            f"the server failed {len(failures)} of the {done + 1} requests answered so "
                            f"far (first: {failures[0]}): no accuracy from a server that does not "
                            "answer"
                        )
                results[i] = score_item(item, reply.text, reply.finish_reason, reply.error)
                tokens[i] = reply.completion_tokens
                done += 1
                if on_progress is not None:
                    on_progress(done, len(task.items))

        tasks = [asyncio.ensure_future(worker()) for _ in range(min(params.concurrency, len(task.items)))]
        try:
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return EvalRun(
        task=task.name,
        task_fingerprint=task.fingerprint,
        task_source=task.source,
        api=params.api,
        model=model or "",
        max_tokens=max_tokens,
        items=tuple(r for r in results if r is not None),
        started_at=started,
        duration_s=time.monotonic() - t0,
        completion_tokens=sum(tokens),
    )
