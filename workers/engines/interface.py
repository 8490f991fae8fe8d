"""The engine interface: what benchbot needs from an engine, and which driver a host uses.

Jobs, the observer and the observation code never ask "is this SGLang?": they hold an
:class:`EngineDriver` chosen by the host's ``[hosts.NAME.engine] kind`` (default ``sglang``) and call
it. A driver compiles a launch (fixed flags, where the model goes, which spellings are one option),
waits for readiness and smoke-tests, reads what the server reports about itself (the observation),
fingerprints and labels that, diagnoses a failed start with its engine's rules, and reads
speculative-decoding acceptance. :mod:`workers.engines.sglang.driver` and
:mod:`workers.engines.vllm.driver` implement it; process identification (which argv is an engine, and
which engine) lives in :mod:`workers.engines.processes` for the host-side process table.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from workers.errors import ConfigError

if TYPE_CHECKING:
    from workers.config import FlagValue
    from workers.engines.contract import Contract
    from workers.engines.profiling import ProfileCall
    from workers.engines.sglang.diagnosis import Diagnosis
    from workers.engines.sglang.readiness import ReadyResult, SmokeResult
    from workers.observation import ServerView

#: The engine kinds a config may name, in the order ``config check`` lists them.
KINDS = ("sglang", "vllm")


@dataclass(frozen=True)
class ServerReport:
    """What the server on the port said about itself.

    ``outcome``: ``ok`` (it answered as this engine: ``view`` holds what it reported), ``warming`` (it
    answered as this engine, ``view`` filled, but its health check does not pass yet: SGLang's warm-up),
    ``starting`` (it answers but is not ready), ``dead`` (it answers but its engine died), ``not_engine`` (it
    answered, not like this engine), ``unreachable`` (no connection), ``error`` (an unexpected HTTP status).
    """

    outcome: str
    view: ServerView | None = None
    detail: str = ""
    #: More the server said, kept in the observation's ``extra`` (vLLM: ``server_info`` where mounted).
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SpecDecodeCounters:
    """Speculative decoding so far: draft rounds and accepted draft tokens (server counters)."""

    drafts: float
    accepted_tokens: float

    def accept_length_since(self, before: SpecDecodeCounters | None) -> float | None:
        """Mean tokens per decode step since ``before`` (accepted drafts + the bonus token), None without drafts."""
        drafts = self.drafts - (before.drafts if before else 0.0)
        accepted = self.accepted_tokens - (before.accepted_tokens if before else 0.0)
        return round(1.0 + accepted / drafts, 4) if drafts > 0 else None


class EngineDriver(Protocol):
    """One serving engine, as benchbot drives it (see the module docstring)."""

    #: The config's word for it (``[engine] kind``) and the name messages use.
    kind: str
    name: str
    #: The bench API a plain ``/bench`` uses on this engine (SGLang: ``generate``; vLLM has no /generate).
    default_bench_api: str

    # ---- compiling a launch
    def fixed_flags(self, model: str, bind: str, port: int) -> list[tuple[str, FlagValue]]:
        """The flags benchbot always sets (where it listens; the model where it is a flag)."""
        ...

    def positionals(self, model: str) -> list[str]:
        """Words that follow the engine command before any flag (vLLM's model)."""
        ...

    def flag_key(self, flag: str) -> str:
        """The option a spelling stands for, so ``--tp 4`` replaces a base ``--tp-size 8``."""
        ...

    def requested_args(self, flags: Mapping[str, Any], contract: Contract | None) -> dict[str, Any]:
        """Launch flags -> the arg names and values the observation reports them under."""
        ...

    # ---- reading a process
    def launch_args(self, argv: Sequence[str]) -> dict[str, Any]:
        """``{--flag: value}`` from a process's argv (what it was started with, not what it runs)."""
        ...

    def redact_argv(self, argv: Sequence[str]) -> list[str]:
        """argv with secret values hidden, abbreviations resolved as this engine's parser would."""
        ...

    # ---- readiness
    async def wait_ready(
        self,
        base_url: str,
        *,
        deadline_s: float,
        is_alive: Callable[[], Awaitable[bool]],
        read_new_log: Callable[[], Awaitable[str]],
        api_key: str | None,
        gate: Callable[[], None] | None,
        foreign_listener: Callable[[], Awaitable[str | None]] | None,
        contract: Contract | None,
    ) -> ReadyResult | Diagnosis:
        """Wait until the server serves, or diagnose why it will not."""
        ...

    async def smoke_test(self, base_url: str, api_key: str | None) -> SmokeResult:
        """One short greedy generation that must look like language."""
        ...

    def smoke_diagnosis(self, result: SmokeResult, log_text: str) -> Diagnosis:
        """A failed smoke generation as a diagnosis (a known cause in the log wins)."""
        ...

    def diagnose(self, log_text: str, *, exited: bool, timed_out: bool, contract: Contract | None) -> Diagnosis:
        """Why a start failed, from its log, with this engine's rules."""
        ...

    # ---- observation
    async def report(
        self, base_url: str, api_key: str | None, timeout_s: float, argv: Sequence[str] | None
    ) -> ServerReport:
        """Ask the server what it runs (``argv``: the owning process's, when visible)."""
        ...

    def fingerprint(self, view: ServerView) -> str:
        """12 hex chars naming the configuration the server reported (stable across restarts)."""
        ...

    def describe(self, view: ServerView, launch_args: Mapping[str, Any]) -> str:
        """A short label of what matters for speed."""
        ...

    async def spec_decode(self, base_url: str, api_key: str | None) -> SpecDecodeCounters | None:
        """Speculative-decoding counters now, or None when this engine reports them per request instead."""
        ...

    # ---- profiling
    def profile_call(
        self, steps: int, profile_id: str, output_dir: str, launch_args: Mapping[str, object]
    ) -> ProfileCall:
        """A bounded capture of ``steps`` forward steps (``output_dir`` where the engine lets benchbot choose);
        BenchbotError, said to the person, when this server cannot profile."""
        ...


def driver_for(kind: str | None) -> EngineDriver:
    """The driver of an engine kind (``sglang``, ``vllm``; a process kind like ``vllm-sim`` too)."""
    family = (kind or "sglang").split("-", 1)[0]
    if family == "sglang":
        from workers.engines.sglang.driver import DRIVER as sglang

        return sglang
    if family == "vllm":
        from workers.engines.vllm.driver import DRIVER as vllm

        return vllm
    raise ConfigError(f"engine kind {kind!r} is not supported (supported: {', '.join(KINDS)})")
