"""The engine interface: what benchbot needs from an engine, and what an engine folder gives the registry.

Jobs, the observer and the observation code never ask "is this SGLang?": they hold an
:class:`EngineDriver` chosen by the host's ``[hosts.NAME.engine] kind`` (through
:func:`workers.engines.registry.driver_for`) and call it. A driver compiles a launch (fixed flags, where
the model goes, which spellings are one option), waits for readiness and smoke-tests, reads what the
server reports about itself (the observation), fingerprints and labels that, diagnoses a failed start
with its engine's rules, and reads speculative-decoding acceptance. Every driver subclasses
:class:`EngineDriver`, which does the shared part once; what an engine writes is data and a few hooks.

Each engine lives in a folder of its own, ``workers/engines/<kind>/``, whose ``__init__`` exposes one
:class:`Engine` named ``ENGINE``: the few facts generic code needs before (or without) loading the
driver (its name, default port and command, how to recognise its processes and ask its version, its
packaged presets) and a loader of its driver. The registry (:mod:`workers.engines.registry`) maps a
kind to that folder; this module imports no engine folder (and the HTTP client only when a driver first
waits or smoke-tests), so an engine folder can import it freely.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

from workers import secrets
from workers.engines import diagnosis
from workers.engines.args import ArgValues, FlagValue, coerce_value, parse_argv
from workers.engines.fingerprint import digest
from workers.errors import BenchbotError
from workers.json_value import JsonObject, JsonValue, json_object, opt_float, opt_int, opt_str

if TYPE_CHECKING:
    from workers.engines.contract import Contract
    from workers.engines.diagnosis import Diagnosis, FitHint, Rule
    from workers.engines.profiling import ProfileCall
    from workers.engines.readiness import ReadyResult, SmokeRequest, SmokeResult


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


class EngineDriver:
    """One serving engine, as benchbot drives it (see the module docstring): the base every driver subclasses.

    The flow every engine shares is written here once: the ``/health`` wait, the smoke generation and its
    judgement, the diagnosis of a failed start, the launch's fixed flags and the argv reading. An engine's
    driver gives the data that makes them its own (as rq's worker classes each override one hook): its
    failure ``rules``, its ``ready_line``, its ``smoke`` request, its flag parser (``serve_args``,
    ``flag_key``, ``requested_args``, ``redact_argv``) and its observation reader (``report``,
    ``describe``, ``fingerprint``); ``multinode_flags`` is where a rank's argv of a gang launch goes.
    """

    #: The config's word for it (``[engine] kind``) and the name messages use.
    kind: str
    name: str
    #: The bench API a plain ``/bench`` uses on this engine (one with no ``/generate`` uses ``completions``).
    default_bench_api: str = "completions"
    #: Arg names newer releases report a requested arg under: the requested-vs-observed diff looks there
    #: when the asked name is missing (empty when the engine never renamed one).
    observed_renames: Mapping[str, tuple[str, ...]] = MappingProxyType({})
    #: Values the engine rewrites on purpose, ``(arg, REQUESTED, OBSERVED)`` upper-cased -> why they are one.
    equivalent_values: Mapping[tuple[str, str, str], str] = MappingProxyType({})
    #: A diagnosis hint's clause that asks for an env setting, by that setting's name: dropped from a
    #: diagnosis whose launch sets it already (:func:`workers.engines.diagnosis.without_satisfied_hints`).
    env_hints: Mapping[str, str] = MappingProxyType({})

    # ---- data hooks: what makes the shared flow this engine's
    #: Its failure rules, most specific first (its ``diagnosis`` module's table).
    rules: Sequence[Rule] = ()
    #: The line it logs once it serves (the contract's recorded ``ready`` text wins where there is one).
    ready_line: str = ""
    #: Its smoke generation: where it is posted, its body, where the answer says what came back.
    smoke: SmokeRequest
    #: What a failed smoke generation suggests when the log names no cause.
    smoke_hint: str = ""
    #: Rewrites the flags a hint names for the host's version (an engine that renamed flags), or None.
    fit_hint: FitHint | None = None
    #: The flag the model goes in (``--model-path``), or None where the model is the first positional word.
    model_flag: str | None = None
    #: Observed args left out of :meth:`fingerprint`: where it listens, names, logging.
    fingerprint_dropped_args: frozenset[str] = frozenset({"host", "port"})
    #: Why ``profile=`` is refused on this engine (an engine that can profile overrides :meth:`profile_call`).
    profile_refusal: str = ""

    # ---- compiling a launch
    def fixed_flags(self, model: str, bind: str, port: int) -> list[tuple[str, FlagValue]]:
        """The flags benchbot always sets (where it listens; the model where it is a flag)."""
        model_flags: list[tuple[str, FlagValue]] = [(self.model_flag, model)] if self.model_flag else []
        return [*model_flags, ("--host", bind), ("--port", str(port))]

    def positionals(self, model: str) -> list[str]:
        """Words that follow the engine command before any flag (the model, where it is no flag)."""
        return [] if self.model_flag else [model]

    def flag_key(self, flag: str) -> str:
        """The option a spelling stands for, so ``--tp 4`` replaces a base ``--tp-size 8`` (here: argparse's
        ``dest`` of a long option; an engine with aliases reads its recorded parser)."""
        return flag.split("=", 1)[0].lstrip("-").replace("-", "_")

    def requested_args(self, flags: Mapping[str, FlagValue], contract: Contract | None) -> ArgValues:
        """Launch flags -> the arg names and values the observation reports them under."""
        return {
            self.flag_key(flag): value if isinstance(value, bool) else coerce_value(value)
            for flag, value in flags.items()
        }

    def multinode_flags(self, *, nnodes: int, node_rank: int, head: str, port: int) -> list[tuple[str, FlagValue]]:
        """The flags that make one rank of a launch across ``nnodes`` hosts (rank 0 on ``head``, rendezvous on
        ``port``); BenchbotError, said to the person, for an engine benchbot cannot launch so.

        The spellings are one data table (``workers/engines/multinode.py``, checked against every recorded
        release); an engine with another form overrides this hook."""
        from workers.engines import multinode  # deferred: the table is only needed by gang launches

        form = multinode.form_for(self.kind, self.name)
        return list(form.flags(nnodes=nnodes, rank=node_rank, head=head, port=port))

    # ---- reading a process
    def serve_args(self, argv: Sequence[str]) -> list[str] | None:
        """The words of a process's argv the engine's parser reads (after its command), None when it is not one."""
        return list(argv[1:])

    def launch_args(self, argv: Sequence[str]) -> ArgValues:
        """``{--flag: value}`` from a process's argv (what it was started with, not what it runs)."""
        rest = self.serve_args(argv) or []
        args: JsonObject = dict(parse_argv(rest))
        if self.model_flag is None and rest and not rest[0].startswith("-"):  # ``serve MODEL ...``: it wins
            args["--model"] = rest[0]
        return args

    def redact_argv(self, argv: Sequence[str]) -> list[str]:
        """argv with secret values hidden, abbreviations resolved as this engine's parser would."""
        return secrets.redact_argv(argv)

    # ---- readiness
    def ready_line_for(self, contract: Contract | None) -> str:
        """The ready line of the host's version: recorded in its contract, else :attr:`ready_line`."""
        return (contract.ready_line if contract is not None else None) or self.ready_line

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
        """Wait until the server serves, or diagnose why it will not (:func:`workers.engines.readiness.wait_ready`
        with this engine's rules and ready line)."""
        from workers.engines import readiness  # loads the HTTP client: this module stays cheap to import

        return await readiness.wait_ready(
            base_url,
            deadline_s=deadline_s,
            is_alive=is_alive,
            read_new_log=read_new_log,
            api_key=api_key,
            gate=gate,
            foreign_listener=foreign_listener,
            contract=contract,
            rules=self.rules,
            engine=self.name,
            ready_line=self.ready_line_for(contract),
            fit_hint=self.fit_hint,
        )

    async def smoke_test(self, base_url: str, api_key: str | None) -> SmokeResult:
        """One short greedy generation (:attr:`smoke`) that must look like language."""
        from workers.engines import readiness

        return await readiness.run_smoke(base_url, api_key, self.smoke)

    def smoke_diagnosis(self, result: SmokeResult, log_text: str) -> Diagnosis:
        """A failed smoke generation as a diagnosis (a known cause in the log wins)."""
        return diagnosis.smoke_diagnosis(
            result, log_text, rules=self.rules, hint=self.smoke_hint, fit_hint=self.fit_hint
        )

    def diagnose(self, log_text: str, *, exited: bool, timed_out: bool, contract: Contract | None) -> Diagnosis:
        """Why a start failed, from its log, with this engine's rules."""
        return diagnosis.diagnose(
            log_text,
            exited=exited,
            returncode=None,
            timed_out=timed_out,
            contract=contract,
            rules=self.rules,
            engine=self.name,
            fit_hint=self.fit_hint,
        )

    # ---- observation: the engine's reader
    async def report(
        self, base_url: str, api_key: str | None, timeout_s: float, argv: Sequence[str] | None
    ) -> ServerReport:
        """Ask the server what it runs (``argv``: the owning process's, when visible)."""
        raise NotImplementedError

    def describe(self, view: ServerView, launch_args: ArgValues) -> str:
        """A short label of what matters for speed."""
        raise NotImplementedError

    def fingerprint(self, view: ServerView) -> str:
        """12 hex chars naming the configuration the server reported (stable across restarts): its args but
        :attr:`fingerprint_dropped_args`, the model and the version; another engine's same words hash apart."""
        args = {k: v for k, v in view.args.items() if k not in self.fingerprint_dropped_args}
        return digest({"engine": self.kind, "args": args, "model": view.model_path, "version": view.version})

    async def spec_decode(self, base_url: str, api_key: str | None) -> SpecDecodeCounters | None:
        """Speculative-decoding counters now, or None when this engine reports them per request (or not at all)."""
        return None

    # ---- profiling
    def profile_call(
        self, steps: int, profile_id: str, output_dir: str, launch_args: Mapping[str, object]
    ) -> ProfileCall:
        """A bounded capture of ``steps`` forward steps (``output_dir`` where the engine lets benchbot choose);
        BenchbotError, said to the person, when this server cannot profile."""
        raise BenchbotError(self.profile_refusal or f"{self.name} cannot profile")


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
