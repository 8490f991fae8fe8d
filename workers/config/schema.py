"""The validated configuration as frozen dataclasses: what every other module reads, never raw TOML."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from workers.config.tune_schema import TuneConfig as TuneConfig
from workers.engines import registry
from workers.engines.args import FlagValue as FlagValue  # one spelling, below the config and the engines

# Per engine kind, each engine folder's own facts, as the registry reads them (re-exported for the config).
from workers.engines.registry import DEFAULT_COMMANDS as DEFAULT_COMMANDS
from workers.engines.registry import DEVICES as DEVICES
from workers.errors import ConfigError
from workers.evaluation import runner as eval_runner
from workers.evaluation import tasks as eval_tasks

#: An engine flag as an engine spells it: ``--tp-size``; some keep underscores (click: ``--tp_size``), and a
#: setting an engine takes from a file only is spelt by its dotted key (``--moe_config.backend``: its folder's
#: ``settings_file``). Each part starts with a letter or digit; the host's recorded contract says which exist.
FLAG_RE = re.compile(r"^--[a-z0-9][a-z0-9_-]*(?:\.[a-z0-9][a-z0-9_-]*)*$")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,39}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
USER_RE = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
DATASET_NAME_RE = NAME_RE

EMBEDDED_SOURCE = "<embedded default>"

#: The keys of ``[engine]`` and of a host's ``[hosts.NAME.engine]`` override.
ENGINE_KEYS = frozenset(
    {
        "kind",
        "command",
        "model",
        "flags",
        "env",
        "api_key_env",
        "launch_timeout_s",
        "pass_env",
        "version_command",
        "device",
    }
)


@dataclass(frozen=True)
class EngineConfig:
    """The serving engine of a host: how it is started and what every launch passes.

    ``[engine]`` is the default every host starts from; ``[hosts.NAME.engine]`` replaces any of its keys
    for that host, so one config can mix a real SGLang box and a simulated one. Read a host's engine as
    :attr:`HostConfig.engine`: the default alone says nothing about any particular host.
    """

    kind: str = registry.DEFAULT_KIND  # a registered engine (workers.engines.registry): which driver runs it
    command: tuple[str, ...] = DEFAULT_COMMANDS[registry.DEFAULT_KIND]
    model: str = "nvidia/Qwen3.5-397B-A17B-NVFP4"
    flags: tuple[tuple[str, FlagValue], ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    api_key_env: str | None = None  # name of the env var holding the engine's --api-key (never the key)
    launch_timeout_s: float = 900.0
    pass_env: tuple[str, ...] = ()  # worker env variables the engine may see (it gets nothing else unnamed)
    #: argv printing the engine's version on the host, when benchbot cannot derive it from ``command``
    version_command: tuple[str, ...] | None = None
    #: ``cuda`` or ``cpu``: which presets the host's words mean (:attr:`preset_set`)
    device: str = "cuda"

    @property
    def preset_set(self) -> str:
        """Whose words this engine's presets are: its kind (``sglang``, ``vllm``), or ``<kind>-<device>`` off the
        GPUs (``vllm-cpu``)."""
        return self.kind if self.device == "cuda" else f"{self.kind}-{self.device}"

    def api_key(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The engine's API key, read from the worker's environment variable ``api_key_env`` names.

        Only the name is configuration; the key itself lives in the environment of the worker that
        serves the host, and is never stored, logged or put on argv.
        """
        environ = os.environ if environ is None else environ
        return environ.get(self.api_key_env) if self.api_key_env else None


@dataclass(frozen=True)
class HostConfig:
    """One GPU host: how to reach it, where its engine listens, and which engine it runs."""

    name: str
    transport: str = "local"  # "local" | "ssh"
    ssh_target: str | None = None
    ssh_port: int = 22
    ssh_user: str | None = None
    ssh_key: str | None = None
    ssh_known_hosts: str | None = None
    ssh_insecure_no_host_check: bool = False
    port: int = 30000
    gpus: int = 8
    bind: str = "127.0.0.1"  # the engine's --host
    http_host: str = "127.0.0.1"  # where the worker reaches the engine's HTTP port
    env: Mapping[str, str] = field(default_factory=dict)
    nvidia_smi: tuple[str, ...] = ("nvidia-smi",)
    log_dir: str = "/tmp/benchbot"
    description: str = ""
    #: This host's effective engine: ``[engine]`` with the keys of ``[hosts.NAME.engine]`` over it.
    engine: EngineConfig = field(default_factory=EngineConfig)

    @property
    def base_url(self) -> str:
        """The engine's HTTP base URL as the worker sees it."""
        return f"http://{self.http_host}:{self.port}"


@dataclass(frozen=True)
class PresetVersion:
    """What a preset emits on hosts whose engine version lies in ``spec`` (``">=0.5.15"``), over the preset:
    first ``remove``, then ``flags``; ``env`` is added to the preset's env."""

    spec: str
    flags: tuple[tuple[str, FlagValue], ...] = ()
    remove: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Preset:
    """A word that adds, removes or sets engine flags and env (per engine version where it must differ)."""

    name: str
    description: str = ""
    flags: tuple[tuple[str, FlagValue], ...] = ()
    remove: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    group: str | None = None
    conflicts: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    versions: tuple[PresetVersion, ...] = ()


@dataclass(frozen=True)
class AccessConfig:
    """Who may do what. Empty lists mean open: the default for a team's private box."""

    users: tuple[str, ...] = ()
    channels: tuple[str, ...] = ()
    admins: tuple[str, ...] = ()
    commands: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def is_admin(self, user: str) -> bool:
        """Admins may cancel anyone's job and run every command."""
        return user in self.admins


@dataclass(frozen=True)
class Limits:
    """Bounds that keep one person from monopolising a shared box, and input sane."""

    max_levels: int = 8
    max_concurrency: int = 1024
    max_requests: int = 20000
    max_tokens: int = 131072
    max_queued_per_user: int = 5
    max_command_length: int = 1000
    max_sweep_configs: int = 8
    job_timeout_s: int = 4 * 3600
    lease_ttl_s: float = 30.0
    #: A fence check passes only with at least this much of the lease left; default TTL/6 (lease.default_margin_s).
    lease_margin_s: float = 5.0
    cancel_grace_s: float = 20.0
    #: Each observer re-observes its hosts this often unasked, so /status can answer from Redis (issue 23).
    observe_every_s: float = 20.0
    #: /status shows an observation older than this as stale, whatever else it says.
    observation_stale_s: float = 60.0
    #: How long /status waits for fresh observations before answering from the stored ones.
    status_deadline_s: float = 0.6


@dataclass(frozen=True)
class EvalConfig:
    """``[eval]``: the defaults of ``/eval`` and the teams' own JSONL tasks (``[eval.tasks]``).

    ``files`` maps a task name to a file on the worker's disk (relative paths are relative to the config
    file). The names are checked at load; the files are read by the worker when an eval runs, so a
    missing file is that job's friendly error, not a config error (the bot may not see the worker's disk).
    """

    task: str = eval_tasks.BUILTIN
    n: int = eval_tasks.DEFAULT_N
    api: str = "chat"
    concurrency: int = eval_runner.DEFAULT_CONCURRENCY
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    files: Mapping[str, eval_tasks.TaskFile] = field(default_factory=dict)

    @property
    def task_names(self) -> list[str]:
        """Every task a command may name: ``builtin`` first, then the configured files."""
        return eval_tasks.task_names(self.files)


@dataclass(frozen=True)
class MetricsConfig:
    """``[metrics]``: where the bot and each worker serve Prometheus's ``/metrics`` (docs/prometheus.md).

    Off unless a port is named, so tests, demos and a newcomer's box open nothing. A worker serves on
    the port of the first of its hosts that ``worker_ports`` names (one worker per host is the usual
    deployment, each with its own port). ``bind`` is loopback by default: the endpoints carry host and
    job names, which are for the operators' Prometheus, not the network at large.
    """

    bind: str = "127.0.0.1"
    bot_port: int | None = None
    worker_ports: Mapping[str, int] = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        """True when any process is asked to serve metrics."""
        return self.bot_port is not None or bool(self.worker_ports)

    def worker_port(self, hosts: tuple[str, ...] | list[str]) -> int | None:
        """The port of a worker serving ``hosts``: its first host's that has one, else None (no endpoint)."""
        return next((self.worker_ports[h] for h in hosts if h in self.worker_ports), None)


#: The rendezvous port of a group whose table names none (torch.distributed's usual MASTER_PORT).
DEFAULT_RENDEZVOUS_PORT = 29500


@dataclass(frozen=True)
class GroupConfig:
    """``[groups.NAME]``: hosts that serve one model together (a gang), as one name in commands.

    ``hosts`` keeps the config's order (the head is the first unless ``head`` names another);
    :attr:`members` is the one global order every gang lease takes them in (sorted names: two gangs that
    share hosts then never each hold a part the other waits for, docs/queue.md). ``engine`` is the
    head's engine with ``[groups.NAME.engine]`` over it (e.g. ``--tp-size 16``); every member runs its kind.
    """

    name: str
    hosts: tuple[str, ...]
    head: str
    port: int = DEFAULT_RENDEZVOUS_PORT  # where the ranks rendezvous on the head (``--dist-init-addr HEAD:PORT``)
    engine: EngineConfig = field(default_factory=EngineConfig)
    description: str = ""

    @property
    def members(self) -> tuple[str, ...]:
        """The hosts in lease order (sorted names)."""
        return tuple(sorted(self.hosts))


@dataclass(frozen=True)
class Config:
    """The whole configuration, immutable once loaded."""

    source: str
    hosts: Mapping[str, HostConfig]
    #: ``[engine]``: what a host runs unless it says otherwise. Decisions for a host use ``host.engine``.
    default_engine: EngineConfig
    presets: Mapping[str, Preset]
    access: AccessConfig = AccessConfig()
    limits: Limits = Limits()
    default_host: str = ""
    #: ``[datasets]``: name -> JSONL file of prompts on the worker's machine (``/bench data=NAME``).
    #: Relative paths are relative to the config file. A command names a dataset, never a path.
    datasets: Mapping[str, str] = field(default_factory=dict)
    #: ``[eval]``: ``/eval``'s defaults and the team's JSONL tasks (docs/eval.md).
    eval: EvalConfig = EvalConfig()
    #: Presets of the other engines, in their own words: ``[engines.SET.presets.WORD]`` (default: each engine
    #: folder's packaged presets, e.g. ``workers/engines/vllm/presets.toml``). ``presets`` above are the
    #: default engine's (SGLang's).
    engine_presets: Mapping[str, Mapping[str, Preset]] = field(default_factory=dict)
    #: ``[metrics]``: the opt-in Prometheus endpoints of the bot and the workers.
    metrics: MetricsConfig = MetricsConfig()
    #: ``[groups.NAME]``: hosts that serve one model together (issue 38), by group name.
    groups: Mapping[str, GroupConfig] = field(default_factory=dict)
    #: ``[tune]``: the numeric knobs ``/tune`` may search (workers/config/tune_section.py).
    tune: TuneConfig = field(default_factory=TuneConfig)

    def presets_for(self, kind: str | None) -> Mapping[str, Preset]:
        """The presets of preset set ``kind`` (a host's :attr:`EngineConfig.preset_set`: ``sglang``, ``vllm``,
        ``vllm-cpu``); ``None``: the words of every set some host uses, the default engine's first (a config
        of SGLang hosts only has SGLang's words)."""
        if kind is None:
            used = {host.engine.preset_set for host in self.hosts.values()}
            merged: dict[str, Preset] = dict(self.presets)
            for other, table in self.engine_presets.items():
                if other in used:
                    merged.update({word: preset for word, preset in table.items() if word not in self.presets})
            return merged
        if kind == registry.DEFAULT_KIND:
            return self.presets
        return self.engine_presets.get(kind, {})

    def dataset_path(self, name: str) -> str:
        """The file behind a dataset name; ConfigError naming the configured ones otherwise."""
        try:
            return self.datasets[name]
        except KeyError:
            known = ", ".join(sorted(self.datasets)) or "none configured"
            raise ConfigError(f"unknown dataset {name!r} (datasets: {known}; add it under [datasets])") from None

    def hosts_named(self, name: str) -> tuple[str, ...]:
        """The hosts a name in a command means: a group's members (lease order), or the one host."""
        group = self.groups.get(name)
        return group.members if group is not None else (self.host(name).name,)

    def groups_of(self, host: str) -> tuple[GroupConfig, ...]:
        """The groups ``host`` belongs to (a host may be in several; only one gang holds it at a time)."""
        return tuple(group for group in self.groups.values() if host in group.hosts)

    def host(self, name: str | None) -> HostConfig:
        """The named host, or the default one; ConfigError for an unknown name."""
        key = name or self.default_host
        try:
            return self.hosts[key]
        except KeyError:
            raise ConfigError(f"unknown host {key!r}") from None


LOCAL_MACHINE = "local"
_LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


def machine_of(host: HostConfig) -> str:
    """Which machine a host's engine runs on, as far as the config tells: ``local``, or the SSH target's host."""
    if host.transport != "ssh" or not host.ssh_target:
        return LOCAL_MACHINE
    target = host.ssh_target.rsplit("@", 1)[-1].strip().lower()
    return LOCAL_MACHINE if target in _LOOPBACK else target


def expand_python(argv: tuple[str, ...]) -> tuple[str, ...]:
    """Replace the ``{python}`` placeholder with this interpreter (used by the simulated host)."""
    return tuple(sys.executable if part == "{python}" else part for part in argv)
