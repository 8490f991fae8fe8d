"""A job's ``BenchSpec`` -> the load generator's ``BenchParams``, with the worker's own config.

The payload says what a person asked (levels or rates, length shapes, a dataset *name*); the worker
knows where its dataset files are and what key its engine wants. Loading the dataset here, before
any request is sent, means a missing or malformed file fails the job with a clear message and
nothing measured.
"""

from __future__ import annotations

from workers.benchmark.client import BenchParams
from workers.benchmark.dataset import Dataset, load_dataset
from workers.benchmark.lengths import parse_length
from workers.benchmark.spec import BenchSpec
from workers.config import Config
from workers.errors import BenchbotError


def bench_params(spec: BenchSpec, config: Config | None, *, api_key: str | None) -> BenchParams:
    """Everything the client needs for ``spec``; BenchbotError / ConfigError for what cannot run here."""
    dataset: Dataset | None = None
    if spec.dataset:
        if config is None:
            raise BenchbotError(f"data={spec.dataset}: no config here to find the dataset in")
        dataset = load_dataset(config.dataset_path(spec.dataset))
    return BenchParams(
        levels=spec.levels,
        rates=spec.rates,
        arrivals=spec.arrivals,
        duration_s=spec.duration_s,
        input_len=spec.input_len,
        output_len=spec.output_len,
        input_dist=parse_length(spec.input, "in") if spec.input else None,
        output_dist=parse_length(spec.output, "out") if spec.output else None,
        num_requests=spec.num_requests,
        warmup=spec.warmup,
        prefix_tokens=spec.prefix_tokens,
        dataset=dataset,
        api=spec.api,
        api_key=api_key,
        timeout_s=spec.limits.timeout_s,
        limits=spec.limits,
    )
