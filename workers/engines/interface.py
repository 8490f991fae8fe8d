"""The engine interface: what benchbot needs from an engine, and what an engine folder gives the registry.

Jobs, the observer and the observation code never ask "is this SGLang?": they hold an
:class:`EngineDriver` chosen by the host's ``[hosts.NAME.engine] kind`` (through
:func:`workers.engines.registry.driver_for`) and call it. A driver compiles a launch (fixed flags, where
the model goes, which spellings are one option), waits for readiness and smoke-tests, reads what the
server reports about itself (the observation), fingerprints and labels that, diagnoses a failed start
with its engine's rules, and reads speculative-decoding acceptance.

Each engine lives in a folder of its own, ``workers/engines/<kind>/``, whose ``__init__`` exposes one
:class:`Engine` named ``ENGINE``: the few facts generic code needs before (or without) loading the
driver (its name, default port and command, how to recognise its processes and ask its version, its
packaged presets) and a loader of its driver. The registry (:mod:`workers.engines.registry`) maps a
kind to that folder; this module imports neither, so an engine folder can import it freely.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from workers.engines.args import ArgValues, FlagValue
from workers.json_value import JsonObject, JsonValue, json_object, opt_float, opt_int, opt_str

if TYPE_CHECKING:
    from workers.engines.contract import Contract
    from workers.engines.diagnosis import Diagnosis
    from workers.engines.profiling import ProfileCall
    from workers.engines.readiness import ReadyResult, SmokeResult


@dataclass(frozen=True)
class ServerView:
    """What the server says about itself (each engine's driver reads it its own way), with secrets redacted."""

    version: str | None
    args: ArgValues
    model_path: str | None
    served_model_name: str | None
    max_total_num_tokens: int | None
    last_gen_throughput: float | None
    avg_spec_accept_length: float | None

    def to_dict(self) -> JsonObject:
        return {
            "version": self.version,
            "args": dict(self.args),
            "model_path": self.model_path,
            "served_model_name": self.served_model_name,
            "max_total_num_tokens": self.max_total_num_tokens,
            "last_gen_throughput": self.last_gen_throughput,
            "avg_spec_accept_length": self.avg_spec_accept_length,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> ServerView:
        return cls(
            version=opt_str(d.get("version")),
            args=json_object(d.get("args")),
            model_path=opt_str(d.get("model_path")),
            served_model_name=opt_str(d.get("served_model_name")),
            max_total_num_tokens=opt_int(d.get("max_total_num_tokens")),
            last_gen_throughput=opt_float(d.get("last_gen_throughput")),
            avg_spec_accept_length=opt_float(d.get("avg_spec_accept_length")),
        )


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
    extra: Mapping[str, JsonValue] = field(default_factory=dict)


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

    @property
    def observed_renames(self) -> Mapping[str, tuple[str, ...]]:
        """Arg names newer releases report a requested arg under: the requested-vs-observed diff looks there
        when the asked name is missing (``{}`` when the engine never renamed one)."""
        ...

    @property
    def equivalent_values(self) -> Mapping[tuple[str, str, str], str]:
        """Values the engine rewrites on purpose, ``(arg, REQUESTED, OBSERVED)`` upper-cased -> why they are one."""
        ...

    @property
    def env_hints(self) -> Mapping[str, str]:
        """A diagnosis hint's clause that asks for an env setting, by that setting's name: dropped from a
        diagnosis whose launch sets it already (:func:`workers.engines.diagnosis.without_satisfied_hints`)."""
        ...

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

    def requested_args(self, flags: Mapping[str, FlagValue], contract: Contract | None) -> ArgValues:
        """Launch flags -> the arg names and values the observation reports them under."""
        ...

    # ---- reading a process
    def launch_args(self, argv: Sequence[str]) -> ArgValues:
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

    def describe(self, view: ServerView, launch_args: ArgValues) -> str:
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


@dataclass(frozen=True)
class MetricNames:
    """Where an engine's Prometheus ``/metrics`` says what telemetry samples during a level (the first name
    present wins; several when releases renamed one)."""

    running: tuple[str, ...] = ()  # requests being served now
    queued: tuple[str, ...] = ()  # requests waiting
    kv_usage: tuple[str, ...] = ()  # KV-cache usage as a 0..1 fraction
    #: The server's own latency histograms (base names, seconds; ``_sum``/``_count`` are read): time to first
    #: token, inter-token latency and end-to-end latency, as the engine measures them (the level's server view).
    ttft: tuple[str, ...] = ()
    itl: tuple[str, ...] = ()
    e2e: tuple[str, ...] = ()
    #: How a server of this engine is made to serve ``/metrics`` when it answers 404 (the run says so).
    off_hint: str = ""
    #: Why a server of this engine has no load gauges at all, for an engine whose ``/metrics`` is something else:
    #: telemetry then never asks it (a scrape may be a side effect, or hold the sampler up) and says this instead.
    no_gauges: str = ""


@dataclass(frozen=True)
class SettingsFile:
    """Launch settings an engine takes only from a file, never from its command line, and never reports back
    (TensorRT-LLM's LLM API settings in its ``--config`` YAML): what benchbot needs to write them and to verify
    them afterwards.

    Generic code does the rest. A launch's settings go into the private 0600 file named by ``--config`` (the
    API key's file, :mod:`workers.host.engine_env`); a file holding no secret is kept beside the fence file
    while the server runs and removed when benchbot stops it. The observation reads the file the running
    process's argv names (bounded, through the transport; only benchbot's own file, never executed) and folds
    ``read``'s settings into the observed args, so the fingerprint, the label and the requested-vs-observed
    diff see them; a file it cannot read is said so (:data:`SETTINGS_UNREAD_ARG`).
    """

    #: ``(the merged flags, the host's engine version) -> (flags for argv, the file's document)``: which of a
    #: launch's flags belong in the file, and how the file holds them (JSON-able; written as JSON, which YAML
    #: reads too). Flags that stay on argv keep their order.
    split: Callable[[Sequence[tuple[str, FlagValue]], str | None], tuple[list[tuple[str, FlagValue]], JsonObject]]
    #: ``the file's text -> {arg: value}`` in the observation's arg names (those ``requested_args`` gives the
    #: same flags); ValueError when the text is not the document ``split`` writes.
    read: Callable[[str], JsonObject]
    #: The options a running server's argv names its settings file with (the last one given wins).
    path_flags: tuple[str, ...] = ("--config",)


#: The observed arg that says an engine's settings file could not be read back (its value: why), so a server
#: whose file is gone never fingerprints like one that was launched without settings.
SETTINGS_UNREAD_ARG = "benchbot.settings_file_unread"


@dataclass(frozen=True)
class Engine:
    """What one engine folder tells the registry: ``workers/engines/<kind>/__init__.py`` defines ``ENGINE``.

    Everything here is cheap to import (no HTTP client, no driver): the config validator, the host-side
    process table and the version probe read it. The driver, which does the work, is loaded on first use.
    """

    #: The config's word for it (``[engine] kind``); a process of its simulator is ``<kind>-sim``.
    kind: str
    #: The name messages use (``SGLang``).
    name: str
    #: The port it listens on when its argv names no ``--port``.
    default_port: int
    #: The command a host runs when its config names none (the model and flags follow).
    default_command: tuple[str, ...]
    #: ``argv -> kind`` when argv runs one of the engine's real entry points (its server, not a sub-command,
    #: not a file named like it in someone's editor), else None. Pure: it runs on the process table.
    recognise: Callable[[Sequence[str]], str | None]
    #: ``command -> argv`` that prints the engine's version on the host (run with the engine's env), or None
    #: when the command is not one this engine can tell (a wrapper: the host sets ``version_command``).
    version_argv: Callable[[Sequence[str]], list[str] | None]
    #: Loads and returns the driver (an import inside, so the registry stays light).
    load_driver: Callable[[], EngineDriver]
    #: Substrings of a command line that make the host-side process scan send it back in full: whatever the
    #: recogniser (and the engine's children, which belong to its tree) needs to see.
    process_needles: tuple[str, ...] = ()
    #: What it computes on (``cuda``, ``cpu``); a host's ``device`` must be one of them.
    devices: tuple[str, ...] = ("cuda",)
    #: Packaged presets per preset set: ``<kind>`` for ``device = "cuda"``, ``<kind>-<device>`` for others.
    #: A config's ``[engines.SET.presets]`` replaces one. Empty for the default engine, whose presets are the
    #: config's own ``[presets]``.
    preset_files: Mapping[str, Path] = field(default_factory=dict)
    #: Names of its preset sets and contracts other than ``kind`` in messages (``vllm-cpu``: vLLM's CPU build).
    set_names: Mapping[str, str] = field(default_factory=dict)
    #: ``command -> argv`` that prints the host's launch options as JSON when its version has no recorded
    #: contract (:mod:`workers.engines.option_dump`), or None when the engine cannot be asked so.
    option_dump_argv: Callable[[Sequence[str]], list[str] | None] | None = None
    #: What its ``/metrics`` calls running and queued requests and KV-cache usage (telemetry reads them).
    metrics: MetricNames = field(default_factory=MetricNames)
    #: Whether its server checks an API key (``api_key_env`` gives it one); a host of an engine that checks
    #: none refuses ``api_key_env`` rather than pretend its server is protected.
    checks_api_key: bool = True
    #: Launch settings it reads from a file only (:class:`SettingsFile`), or None: every flag goes on argv.
    settings_file: SettingsFile | None = None
