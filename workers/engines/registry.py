"""Which engines benchbot drives: an engine kind -> its folder, and what generic code asks of all of them.

Generic code (config validation, presets, the process table, the version probe, the observer, jobs) never
names an engine: it asks here. An engine is a folder ``workers/engines/<kind>/`` whose ``__init__``
defines ``ENGINE`` (:class:`workers.engines.interface.Engine`) and one line in :data:`ENGINE_PACKAGES`.
Engines kept outside this repository (and the test suite's toy engine) are named in the environment
variable ``BENCHBOT_ENGINES`` (``kind=package[,kind=package...]``), read on every call, so the bot and the
workers that share an environment see the same engines.

A kind is lower-case letters, digits and ``_``: a process of an engine's simulator is ``<kind>-sim`` and
a preset set of another device is ``<kind>-<device>``, both read back by splitting at the first ``-``.
This module imports no engine at import time: each folder is imported when first asked for.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from workers.errors import ConfigError

if TYPE_CHECKING:
    from workers.engines.interface import Engine, EngineDriver

#: The engine folders in this repository, in the order messages list them. Adding an engine: one line here.
ENGINE_PACKAGES: dict[str, str] = {
    "sglang": "workers.engines.sglang",
    "vllm": "workers.engines.vllm",
    "trtllm": "workers.engines.trtllm",
}
#: The engine of a host whose config names no kind; its presets are the config's own ``[presets]``.
DEFAULT_KIND = "sglang"
#: More engines, from outside this repository: ``kind=package`` pairs, comma-separated.
EXTRA_ENGINES_ENV = "BENCHBOT_ENGINES"

_KIND_RE = re.compile(r"^[a-z][a-z0-9_]*$")


def _packages() -> dict[str, str]:
    """Every registered kind -> its package: this repository's, then the environment's."""
    packages = dict(ENGINE_PACKAGES)
    for item in os.environ.get(EXTRA_ENGINES_ENV, "").split(","):
        if not item.strip():
            continue
        kind, sep, package = (part.strip() for part in item.partition("="))
        if not sep or not _KIND_RE.match(kind) or not package:
            raise ConfigError(f"{EXTRA_ENGINES_ENV}: {item.strip()!r} is not kind=package (a kind is [a-z0-9_])")
        packages.setdefault(kind, package)
    return packages


def kinds() -> tuple[str, ...]:
    """The engine kinds a config may name, in the order messages list them."""
    return tuple(_packages())


def family(kind: str | None) -> str:
    """The engine a process kind or preset set belongs to: ``vllm-sim`` and ``vllm-cpu`` -> ``vllm``; None ->
    the default engine."""
    return (kind or DEFAULT_KIND).split("-", 1)[0]


def engine(kind: str | None) -> Engine:
    """The engine of ``kind`` (a process kind like ``vllm-sim`` too); ConfigError naming the supported ones."""
    name = family(kind)
    package = ENGINE_PACKAGES.get(name) or _packages().get(name)  # this repository's first: no env read for them
    if package is None:
        raise ConfigError(f"engine kind {kind!r} is not supported (supported: {', '.join(kinds())})")
    try:
        module = importlib.import_module(package)
    except ImportError as exc:  # a package named in BENCHBOT_ENGINES that is not installed (or fails to import)
        raise ConfigError(f"engine kind {name!r}: its package {package} cannot be imported ({exc})") from None
    except Exception as exc:  # a plug-in whose import raises anything else: refused in one sentence, no traceback
        raise ConfigError(
            f"engine kind {name!r}: its plug-in package {package} failed while it was imported "
            f"({type(exc).__name__}: {str(exc)[:200]}); fix it or take it out of {EXTRA_ENGINES_ENV}"
        ) from None
    found = getattr(module, "ENGINE", None)
    if found is None or getattr(found, "kind", None) != name:
        raise ConfigError(f"engine package {package} defines no ENGINE of kind {name!r}")
    return found


def engines() -> list[Engine]:
    """Every registered engine, in :func:`kinds` order."""
    return [engine(kind) for kind in kinds()]


def driver_for(kind: str | None) -> EngineDriver:
    """The driver of an engine kind (``sglang``, ``vllm``; a process kind like ``vllm-sim`` too)."""
    return engine(kind).load_driver()


def drivers() -> list[EngineDriver]:
    """Every registered engine's driver (each loaded on first use)."""
    return [e.load_driver() for e in engines()]


def display_name(key: str | None) -> str:
    """How a message names an engine, one of its preset sets or contracts (``vllm-cpu``: vLLM's CPU build);
    None: the default engine; an unknown key as given."""
    return ENGINE_NAMES.get(key or DEFAULT_KIND, key or DEFAULT_KIND)


def packaged_preset_files() -> dict[str, Path]:
    """Every engine's packaged presets, by preset set (``vllm``, ``vllm-cpu``, ...)."""
    return {name: path for e in engines() for name, path in e.preset_files.items()}


T = TypeVar("T")


class ByKind(Mapping[str, T]):
    """A read-only view ``kind -> one fact of its engine`` over the registry as it is now (``BENCHBOT_ENGINES``
    included), for tables that used to be written out per engine."""

    def __init__(self, pick: Callable[[Engine], T]) -> None:
        self._pick = pick

    def __getitem__(self, kind: str) -> T:
        if kind not in ENGINE_PACKAGES and kind not in _packages():  # this repository's engines need no env read
            raise KeyError(kind)
        return self._pick(engine(kind))

    def __iter__(self) -> Iterator[str]:
        return iter(kinds())

    def __len__(self) -> int:
        return len(kinds())


class _Names(Mapping[str, str]):
    """``kind or preset set -> its name in messages``, over the registry as it is now."""

    def __getitem__(self, key: str) -> str:
        if family(key) in _packages():
            found = engine(key)
            if key == found.kind:
                return found.name
            if key in found.set_names:
                return found.set_names[key]
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        for e in engines():
            yield e.kind
            yield from e.set_names

    def __len__(self) -> int:
        return sum(1 for _ in self)


#: How messages name each engine and its other preset sets or contracts (``vllm-cpu``: vLLM's CPU build).
ENGINE_NAMES: Mapping[str, str] = _Names()
#: Each engine kind's command when a config names none.
DEFAULT_COMMANDS: Mapping[str, tuple[str, ...]] = ByKind(lambda e: e.default_command)
#: What each engine computes on (``cuda``, ``cpu``).
DEVICES: Mapping[str, tuple[str, ...]] = ByKind(lambda e: e.devices)
#: The port each engine listens on when no ``--port`` is given.
DEFAULT_PORTS: Mapping[str, int] = ByKind(lambda e: e.default_port)


def process_needles() -> tuple[str, ...]:
    """Substrings that make the host-side process scan send a command line back: every engine's, and the
    simulator's package."""
    found: list[str] = []
    for e in engines():
        found += [e.kind, *e.process_needles]  # the kind: ``benchbot sim KIND``
    return tuple(dict.fromkeys([*found, "workers.sim"]))


def redact_engine_argv(argv: Sequence[str]) -> list[str]:
    """argv with secret values hidden by every engine's rules (each knows the abbreviations its parser takes),
    for a command whose engine is not known (an error message about any command a host ran)."""
    out = list(argv)
    for driver in drivers():
        out = driver.redact_argv(out)
    return out
