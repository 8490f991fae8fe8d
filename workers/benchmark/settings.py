"""A job's :class:`BenchSpec` + this worker's config -> what the load generator runs: the one place.

The payload says what a person asked (levels or rates, length shapes, a dataset *name*); the worker
knows where its dataset files are and what key its engine wants. :func:`client_settings` is the only
place the two meet: it keeps the spec as it is and adds the worker's facts beside it, so every module
of the client reads an option from the spec itself and a new ``/bench`` option is one field of
:class:`BenchSpec` plus the code that acts on it. Loading the dataset here, before any request is
sent, means a missing or malformed file fails the job with a clear message and nothing measured.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace

from workers.benchmark import schedule
from workers.benchmark.dataset import Dataset, load_dataset
from workers.benchmark.spec import DEFAULT_API, BenchSpec
from workers.benchmark.wire_apis import wire_api
from workers.config import Config
from workers.errors import BenchbotError

#: The load generator's hot paths: ``auto`` (wire for ``http://``, else aiohttp), ``wire``, ``aiohttp``.
CLIENTS = ("auto", "wire", "aiohttp")


@dataclass(frozen=True)
class ClientSettings:
    """A bench request as this worker runs it: the spec unchanged, and what only the worker knows.

    ``dataset`` is the spec's dataset loaded from this worker's files; ``api_key`` the engine's key;
    ``model`` the name ``/v1/completions`` needs (``None``: asked from the server once per sweep).
    ``seed=None`` draws a fresh seed per sweep: a server's prefix cache survives between runs, so
    repeating yesterday's prompts would measure cached prefills. Each level also gets its own prompts.
    ``processes=None`` sizes the client processes to the level; ``client`` picks the hot path.
    """

    spec: BenchSpec
    dataset: Dataset | None = None
    api_key: str | None = None
    model: str | None = None
    seed: int | None = None
    processes: int | None = None
    client: str = "auto"

    def __post_init__(self) -> None:
        check_runnable(self.spec)
        if self.client not in CLIENTS:
            raise BenchbotError(f"Unknown bench client {self.client!r}; use one of: {', '.join(CLIENTS)}.")

    def shape(self) -> str:
        """``1024 in / 256 out tokens``, ``512-2048 in / dataset out tokens, prefix 256`` ..."""
        spec = self.spec
        text = f"{spec.input_dist().describe()} in / {spec.output_dist().describe()} out tokens"
        if spec.prefix_tokens:
            text += f", shared prefix {spec.prefix_tokens}"
        if self.dataset is not None:
            text += f", prompts from {os.path.basename(self.dataset.path)}"
        if spec.api != DEFAULT_API:
            text += f", {spec.api} API"
        return text

    def without_dataset(self) -> ClientSettings:
        """These settings for a shard process: its prompts are planned already, so the dataset stays home."""
        return self if self.dataset is None else replace(self, dataset=None)


def client_settings(
    spec: BenchSpec, config: Config | None, *, api_key: str | None, model: str | None = None
) -> ClientSettings:
    """Everything the client needs for ``spec`` on this worker; BenchbotError / ConfigError for what cannot
    run here (an unknown dataset, a file that does not parse, a spec the client refuses)."""
    dataset: Dataset | None = None
    if spec.dataset:
        if config is None:
            raise BenchbotError(f"data={spec.dataset}: no config here to find the dataset in")
        dataset = load_dataset(config.dataset_path(spec.dataset))
    return ClientSettings(spec, dataset=dataset, api_key=api_key, model=model)


def check_runnable(spec: BenchSpec) -> None:
    """BenchbotError unless the client can run ``spec``: levels or rates (one of the two), sane numbers.

    The grammar refuses these already; a payload built by hand (or by an older bot) meets them here,
    before anything is sent.
    """
    if bool(spec.levels) == bool(spec.rates):
        raise BenchbotError("Give concurrency levels or request rates (rate=...), one of the two.")
    if any(not isinstance(c, int) or c < 1 for c in spec.levels):
        raise BenchbotError(f"Concurrency levels must be positive whole numbers, got {spec.levels!r}.")
    if any(not r > 0 or not math.isfinite(r) for r in spec.rates):
        raise BenchbotError(f"Request rates must be positive numbers, got {spec.rates!r}.")
    if spec.arrivals not in schedule.PATTERNS:
        raise BenchbotError(f"Unknown arrival pattern {spec.arrivals!r}; use one of: {', '.join(schedule.PATTERNS)}.")
    if spec.duration_s is not None and not spec.duration_s > 0:
        raise BenchbotError("An open-loop duration must be positive.")
    wire_api(spec.api)  # BenchbotError naming the known APIs
    if spec.input_len < 1 or spec.output_len < 1:
        raise BenchbotError("Input and output lengths must be at least 1 token.")
    if spec.num_requests is not None and spec.num_requests < 1:
        raise BenchbotError("The number of requests per level must be at least 1.")
    if spec.warmup is not None and spec.warmup < 0:
        raise BenchbotError("The warmup is at least 0 requests.")
    if spec.prefix_tokens < 0:
        raise BenchbotError("A shared prefix is at least 0 tokens.")
