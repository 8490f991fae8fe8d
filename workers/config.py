"""benchbot.toml: hosts (each with its engine), presets, access and limits, validated with errors that name the key.

Found via ``--config``, then ``BENCHBOT_CONFIG``, then ``./benchbot.toml``; with none of those, the
embedded default (one simulated host named ``sim`` and the seed's presets) is used, so a newcomer can
run everything with no file at all.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tomllib
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.engines.contract import check_version_spec
from workers.errors import ConfigError
from workers.evaluation import runner as eval_runner
from workers.evaluation import tasks as eval_tasks
from workers.jobs.lease import default_margin_s
from workers.ports import free_local_port

FLAG_RE = re.compile(r"^--[a-z0-9][a-z0-9-]*$")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,39}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
USER_RE = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
DATASET_NAME_RE = NAME_RE

#: Engine flag values as the config and the grammar hold them: a string, or True for a bare flag.
FlagValue = str | bool

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


#: Each engine kind's command when a config names none (vLLM's model follows ``serve`` as a positional).
DEFAULT_COMMANDS: dict[str, tuple[str, ...]] = {
    "sglang": ("python3", "-m", "sglang.launch_server"),
    "vllm": ("vllm", "serve"),
}
#: Preset sets that live under ``[engines.SET.presets]`` (SGLang's are ``[presets]``): vLLM's, and vLLM's
#: for hosts whose engine runs on the CPU (``device = "cpu"``: vLLM's CPU build, no CUDA-only backends).
OTHER_ENGINE_KINDS = ("vllm", "vllm-cpu")
#: What an engine computes on: ``cuda`` (the GPUs; the default) or ``cpu`` (vLLM's CPU build).
DEVICES: dict[str, tuple[str, ...]] = {"sglang": ("cuda",), "vllm": ("cuda", "cpu")}


@dataclass(frozen=True)
class EngineConfig:
    """The serving engine of a host: how it is started and what every launch passes.

    ``[engine]`` is the default every host starts from; ``[hosts.NAME.engine]`` replaces any of its keys
    for that host, so one config can mix a real SGLang box and a simulated one. Read a host's engine as
    :attr:`HostConfig.engine`: the default alone says nothing about any particular host.
    """

    kind: str = "sglang"  # "sglang" | "vllm": which driver (workers.engines.driver) runs this host's engine
    command: tuple[str, ...] = ("python3", "-m", "sglang.launch_server")
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
        """Whose words this engine's presets are: ``sglang``, ``vllm``, or ``vllm-cpu`` on a CPU build."""
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
    #: Presets of the other engines, in their own words: ``[engines.vllm.presets.WORD]`` (default: the
    #: packaged ``workers/engines/vllm/presets.toml``). ``presets`` above are SGLang's.
    engine_presets: Mapping[str, Mapping[str, Preset]] = field(default_factory=dict)

    def presets_for(self, kind: str | None) -> Mapping[str, Preset]:
        """The presets of preset set ``kind`` (a host's :attr:`EngineConfig.preset_set`: ``sglang``, ``vllm``,
        ``vllm-cpu``); ``None``: the words of every set some host uses, SGLang's first (a config of SGLang
        hosts only has SGLang's words)."""
        if kind is None:
            used = {host.engine.preset_set for host in self.hosts.values()}
            merged: dict[str, Preset] = dict(self.presets)
            for other, table in self.engine_presets.items():
                if other in used:
                    merged.update({word: preset for word, preset in table.items() if word not in self.presets})
            return merged
        if kind == "sglang":
            return self.presets
        return self.engine_presets.get(kind, {})

    def dataset_path(self, name: str) -> str:
        """The file behind a dataset name; ConfigError naming the configured ones otherwise."""
        try:
            return self.datasets[name]
        except KeyError:
            known = ", ".join(sorted(self.datasets)) or "none configured"
            raise ConfigError(f"unknown dataset {name!r} (datasets: {known}; add it under [datasets])") from None

    def host(self, name: str | None) -> HostConfig:
        """The named host, or the default one; ConfigError for an unknown name."""
        key = name or self.default_host
        try:
            return self.hosts[key]
        except KeyError:
            raise ConfigError(f"unknown host {key!r}") from None


# --------------------------------------------------------------------------- the embedded default

#: The seed's presets: what the team tried on 8 x RTX PRO 6000 (SM120) with Qwen3.5-397B NVFP4.
SEED_PRESETS_TOML = """
[presets.cutlass]
description = "MoE runner flashinfer_cutlass (the one that works on SM120)"
group = "moe"
flags = { "--moe-runner-backend" = "flashinfer_cutlass" }

[presets.cutedsl]
description = "MoE runner flashinfer_cutedsl (loads on SM120 but answers !!!!)"
group = "moe"
flags = { "--moe-runner-backend" = "flashinfer_cutedsl" }

[presets.trtllm]
description = "MoE runner flashinfer_trtllm (SM100 and, from FlashInfer 0.6.7 = SGLang 0.5.10, SM120; dies on SM120 with 0.5.9)"
group = "moe"
flags = { "--moe-runner-backend" = "flashinfer_trtllm" }

[presets.cudnn]
description = "FP4 GEMM flashinfer_cudnn (avoids the cutlass FP4 NaN race on SM120)"
group = "fp4"
flags = { "--fp4-gemm-backend" = "flashinfer_cudnn" }

[presets.fp4-cutlass]
description = "FP4 GEMM flashinfer_cutlass"
group = "fp4"
flags = { "--fp4-gemm-backend" = "flashinfer_cutlass" }

[presets.nextn]
description = "NEXTN (MTP) speculative decoding 3/1/4 with spec v2 and the mamba extra_buffer"
env = { SGLANG_ENABLE_SPEC_V2 = "1" }

[presets.nextn.flags]
"--speculative-algorithm" = "NEXTN"
"--speculative-num-steps" = 3
"--speculative-eagle-topk" = 1
"--speculative-num-draft-tokens" = 4
"--mamba-scheduler-strategy" = "extra_buffer"

# Read from the recorded wheels (workers/engines/contracts/sglang-*.json): --mamba-radix-cache-strategy
# appears in 0.5.14 and --mamba-scheduler-strategy is gone from 0.5.20. SGLANG_ENABLE_SPEC_V2 is read by
# 0.5.9-0.5.13 (off by default before 0.5.11); 0.5.14-0.5.20 only warn that it was removed, 0.5.21+ ignore it.
# On a host whose version benchbot cannot learn, the base flag is refused (0.5.20+ reject it), not guessed.
[presets.nextn.versions.">=0.5.14"]
remove = ["--mamba-scheduler-strategy"]
flags = { "--mamba-radix-cache-strategy" = "extra_buffer" }

[presets.customar]
description = "custom all-reduce on (removes --disable-custom-all-reduce)"
remove = ["--disable-custom-all-reduce"]

[presets.mscclpp]
description = "MSCCL++ for small all-reduce messages"
flags = { "--enable-mscclpp" = true }
"""

EMBEDDED_TOML = (
    """
default_host = "sim"

[engine]
kind = "sglang"
command = ["{python}", "-m", "workers.sim.sglang"]
model = "nvidia/Qwen3.5-397B-A17B-NVFP4"
flags = { "--tp-size" = 8, "--quantization" = "modelopt_fp4", "--disable-custom-all-reduce" = true }
launch_timeout_s = 120
# The simulator's settings, when the worker has them (an engine sees only the env its config names).
pass_env = ["BENCHBOT_SIM_STARTUP_S", "BENCHBOT_SIM_STATE_DIR", "BENCHBOT_SIM_SEED", "BENCHBOT_SIM_TIMING",
            "BENCHBOT_SIM_TTFT_MS", "BENCHBOT_SIM_ITL_MS", "BENCHBOT_SIM_PROFILE", "BENCHBOT_SIM_TIMESTAMPS",
            "BENCHBOT_SIM_NATURAL_EOS", "BENCHBOT_SIM_SGLANG_VERSION", "BENCHBOT_SIM_LOAD_S"]

[hosts.sim]
transport = "local"
port = 30000
gpus = 8
nvidia_smi = ["{python}", "-m", "workers.sim.nvidia_smi"]
description = "simulated 8 x RTX PRO 6000 Blackwell (SM120, PCIe)"

# The second engine: the same simulated box, served by vLLM (its presets: workers/engines/vllm/presets.toml).
[hosts.sim-vllm]
transport = "local"
port = 8000
gpus = 8
nvidia_smi = ["{python}", "-m", "workers.sim.nvidia_smi"]
description = "vLLM on a simulated 8 x RTX PRO 6000 Blackwell (SM120, PCIe)"
[hosts.sim-vllm.engine]
kind = "vllm"
command = ["{python}", "-m", "workers.sim.vllm", "serve"]
flags = { "--tensor-parallel-size" = 8, "--quantization" = "modelopt_fp4" }
pass_env = ["BENCHBOT_SIM_STARTUP_S", "BENCHBOT_SIM_STATE_DIR", "BENCHBOT_SIM_VLLM_VERSION"]
"""
    + SEED_PRESETS_TOML
)


# --------------------------------------------------------------------------- loading


def find_config_path(cli_path: str | None = None) -> Path | None:
    """``--config``, then ``BENCHBOT_CONFIG``, then ``./benchbot.toml``; None means the embedded default."""
    for candidate in (cli_path, os.environ.get("BENCHBOT_CONFIG")):
        if candidate:
            path = Path(candidate).expanduser()
            if not path.is_file():
                raise ConfigError(f"config file {path} does not exist")
            return path
    local = Path("benchbot.toml")
    return local if local.is_file() else None


EMBEDDED_PORT_FILE = "sim-port"
#: The embedded vLLM host's port, kept beside the SGLang host's.
EMBEDDED_VLLM_PORT_FILE = "sim-vllm-port"


def embedded_port(directory: Path, name: str = EMBEDDED_PORT_FILE) -> int:
    """This user's port for the embedded simulated host: picked free once, then kept in the state dir.

    30000 on a shared box is someone's SGLang; a port picked per process would differ between the bot and
    its workers, and after a restart a worker would look for its engine on another port. So the first
    process picks a free one and every later one (of this user, same state dir) reads it back.
    """
    path = directory / name
    for _ in range(3):
        try:
            port = int(path.read_text().strip())
            if 1024 <= port <= 65535:
                return port
        except (OSError, ValueError):
            pass
        port = free_local_port()
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue  # another process picked first (or the file is bad: read it again, then replace)
        with os.fdopen(fd, "w") as stream:
            stream.write(f"{port}\n")
        return port
    path.unlink(missing_ok=True)
    return embedded_port(directory, name)


def embedded_toml() -> str:
    """The embedded default for this user: the simulated host on this user's own port, logging under the
    state dir (not 30000 and ``/tmp/benchbot``, which on a shared box belong to someone else)."""
    from workers.redis_conn import state_dir

    directory = state_dir()
    port = embedded_port(directory)
    vllm_port = embedded_port(directory, EMBEDDED_VLLM_PORT_FILE)
    logs = json.dumps(str(directory / "logs"))
    return (
        EMBEDDED_TOML.replace("port = 30000", f"port = {port}", 1)
        .replace("port = 8000", f"port = {vllm_port}", 1)
        .replace('description = "simulated', f'log_dir = {logs}\ndescription = "simulated', 1)
        .replace('description = "vLLM on', f'log_dir = {logs}\ndescription = "vLLM on', 1)
    )


def load_config(cli_path: str | None = None) -> Config:
    """Load and validate the configuration that applies here."""
    path = find_config_path(cli_path)
    if path is None:
        return parse_config(embedded_toml(), EMBEDDED_SOURCE)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    return parse_config(text, str(path))


def parse_config(text: str, source: str = "benchbot.toml") -> Config:
    """Parse TOML text into a validated :class:`Config`; every error names ``source`` and the key."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    return _Validator(source).config(data)


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


class _Validator:
    """Turns parsed TOML into dataclasses, collecting the key path for every message."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.source}: {key}: {problem}")

    # -- primitive checks
    def table(self, value: Any, key: str) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a table, got {type(value).__name__}")
        return value

    def only(self, table: dict[str, Any], key: str, allowed: Set[str]) -> None:
        unknown = sorted(set(table) - allowed)
        if unknown:
            raise self.fail(
                f"{key}.{unknown[0]}" if key else unknown[0], f"unknown key (allowed: {', '.join(sorted(allowed))})"
            )

    def string(self, value: Any, key: str, *, pattern: re.Pattern[str] | None = None) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(key, "expected a non-empty string")
        if pattern and not pattern.match(value):
            raise self.fail(key, f"{value!r} is not valid here")
        if any(ord(c) < 32 for c in value):
            raise self.fail(key, "contains control characters")
        return value

    def integer(self, value: Any, key: str, lo: int, hi: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"expected an integer, got {value!r}")
        if not lo <= value <= hi:
            raise self.fail(key, f"{value} is out of range {lo}..{hi}")
        return value

    def number(self, value: Any, key: str, lo: float, hi: float) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(key, f"expected a number, got {value!r}")
        if not lo <= value <= hi:
            raise self.fail(key, f"{value} is out of range {lo}..{hi}")
        return float(value)

    def lease_margin(self, t: dict[str, Any], ttl: float) -> float:
        """Above 0 and at most a third of the TTL: the heartbeat renews every TTL/3, so a larger margin
        would refuse a healthy holder between two renewals."""
        if "lease_margin_s" not in t:
            return default_margin_s(ttl)
        value = t["lease_margin_s"]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail("limits.lease_margin_s", f"expected a number, got {value!r}")
        if not 0 < value <= ttl / 3:
            raise self.fail(
                "limits.lease_margin_s",
                f"{value} must be above 0 and at most a third of limits.lease_ttl_s ({ttl:g} s / 3 = {ttl / 3:g} s)",
            )
        return float(value)

    def boolean(self, value: Any, key: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, f"expected true or false, got {value!r}")
        return value

    def strings(self, value: Any, key: str, *, pattern: re.Pattern[str] | None = None) -> tuple[str, ...]:
        if value is None:
            return ()
        if not isinstance(value, list):
            raise self.fail(key, "expected a list of strings")
        return tuple(self.string(v, f"{key}[{i}]", pattern=pattern) for i, v in enumerate(value))

    def env(self, value: Any, key: str) -> dict[str, str]:
        table = self.table(value, key)
        out: dict[str, str] = {}
        for name, val in table.items():
            if not ENV_NAME_RE.match(name):
                raise self.fail(f"{key}.{name}", "not a valid environment variable name")
            if isinstance(val, bool):
                val = "1" if val else "0"
            if isinstance(val, int | float):
                val = str(val)
            if not isinstance(val, str) or any(ord(c) < 32 for c in val):
                raise self.fail(f"{key}.{name}", "expected a string without control characters")
            out[name] = val
        return out

    def flags(self, value: Any, key: str) -> tuple[tuple[str, FlagValue], ...]:
        table = self.table(value, key)
        out: list[tuple[str, FlagValue]] = []
        for flag, val in table.items():
            fkey = f'{key}."{flag}"'
            if not FLAG_RE.match(flag):
                raise self.fail(fkey, "engine flags look like --lower-case-words")
            if val is True:
                out.append((flag, True))
            elif val is False:
                raise self.fail(fkey, "use true for a bare flag; to drop a base flag use remove = [...]")
            elif isinstance(val, int | float):
                out.append((flag, str(val)))
            elif isinstance(val, str) and val and not any(ord(c) < 32 for c in val):
                out.append((flag, val))
            else:
                raise self.fail(fkey, "expected a string, a number or true")
        return tuple(out)

    # -- sections
    def config(self, data: dict[str, Any]) -> Config:
        self.only(
            data, "", {"default_host", "engine", "engines", "hosts", "presets", "access", "limits", "datasets", "eval"}
        )
        engine_table = self.table(data.get("engine"), "engine")
        self.only(engine_table, "engine", ENGINE_KEYS)
        default_engine = self.engine(engine_table, lambda k: f"engine.{k}")
        hosts_table = self.table(data.get("hosts"), "hosts")
        if not hosts_table:
            raise self.fail("hosts", "at least one host is required, e.g. [hosts.gpu-1]")
        hosts = {
            name: self.host(name, self.table(v, f"hosts.{name}"), engine_table, default_engine)
            for name, v in hosts_table.items()
        }
        self.check_ports(hosts)
        presets = {
            name: self.preset(name, self.table(v, f"presets.{name}"))
            for name, v in self.table(data.get("presets"), "presets").items()
        }
        self.check_preset_links(presets)
        engine_presets = self.engine_presets(self.table(data.get("engines"), "engines"))
        default_host = data.get("default_host", next(iter(hosts)))
        self.string(default_host, "default_host")
        if default_host not in hosts:
            raise self.fail("default_host", f"{default_host!r} is not one of the hosts ({', '.join(hosts)})")
        return Config(
            source=self.source,
            hosts=hosts,
            default_engine=default_engine,
            presets=presets,
            access=self.access(self.table(data.get("access"), "access")),
            limits=self.limits(self.table(data.get("limits"), "limits")),
            default_host=default_host,
            datasets=self.datasets(self.table(data.get("datasets"), "datasets")),
            engine_presets=engine_presets,
            eval=self.eval(self.table(data.get("eval"), "eval")),
        )

    def _base_dir(self) -> Path:
        return Path(self.source).parent if self.source and Path(self.source).is_file() else Path.cwd()

    def eval(self, t: dict[str, Any]) -> EvalConfig:
        """``[eval]``: task, n, api, concurrency, extra_body, and ``[eval.tasks]`` (NAME = "path" or a table
        ``{ path = "...", max_tokens = 1024 }``)."""
        self.only(t, "eval", {"task", "n", "api", "concurrency", "extra_body", "tasks"})
        files: dict[str, eval_tasks.TaskFile] = {}
        for name, value in self.table(t.get("tasks"), "eval.tasks").items():
            key = f"eval.tasks.{name}"
            if isinstance(value, dict):
                self.only(value, key, {"path", "max_tokens"})
                path = Path(self.string(value.get("path"), f"{key}.path"))
                max_tokens = self.integer(
                    value.get("max_tokens", eval_tasks.JSONL_MAX_TOKENS), f"{key}.max_tokens", 1, 131072
                )
            else:
                path, max_tokens = Path(self.string(value, key)), eval_tasks.JSONL_MAX_TOKENS
            files[name] = eval_tasks.TaskFile(path if path.is_absolute() else self._base_dir() / path, max_tokens)
        try:
            files = eval_tasks.check_task_files(files)
        except eval_tasks.TaskError as exc:
            raise self.fail("eval.tasks", str(exc)) from None
        task = self.string(t.get("task", eval_tasks.BUILTIN), "eval.task")
        if task not in eval_tasks.task_names(files):
            raise self.fail("eval.task", f"{task!r} is not a task (known: {', '.join(eval_tasks.task_names(files))})")
        api = self.string(t.get("api", "chat"), "eval.api")
        if api not in eval_runner.APIS:
            raise self.fail("eval.api", f"{api!r}: use one of {', '.join(eval_runner.APIS)}")
        extra = self.table(t.get("extra_body"), "eval.extra_body")
        return EvalConfig(
            task=task,
            n=self.integer(t.get("n", eval_tasks.DEFAULT_N), "eval.n", 1, eval_tasks.MAX_N),
            api=api,
            concurrency=self.integer(
                t.get("concurrency", eval_runner.DEFAULT_CONCURRENCY),
                "eval.concurrency",
                1,
                eval_runner.MAX_CONCURRENCY,
            ),
            extra_body=dict(extra),
            files=files,
        )

    def engine_presets(self, table: dict[str, Any]) -> dict[str, dict[str, Preset]]:
        """``[engines.KIND.presets.WORD]``: presets in another engine's words (vLLM's default: its presets.toml)."""
        from workers.engines.vllm import PRESETS_FILES

        out: dict[str, dict[str, Preset]] = {}
        for kind, value in table.items():
            if kind not in OTHER_ENGINE_KINDS:
                raise self.fail(
                    f"engines.{kind}",
                    f"{kind!r} is not an engine with its own presets ({', '.join(OTHER_ENGINE_KINDS)}; SGLang's "
                    "are [presets])",
                )
            t = self.table(value, f"engines.{kind}")
            self.only(t, f"engines.{kind}", {"presets"})
            out[kind] = self.preset_table(self.table(t.get("presets"), f"engines.{kind}.presets"), f"engines.{kind}.")
        for kind, path in PRESETS_FILES.items():
            if kind not in out:
                with path.open("rb") as fh:
                    packaged = tomllib.load(fh)
                out[kind] = _Validator(str(path)).preset_table(self.table(packaged.get("presets"), "presets"), "")
        return out

    def preset_table(self, table: dict[str, Any], prefix: str) -> dict[str, Preset]:
        """One engine's ``presets`` table, validated like ``[presets]`` (keys named with ``prefix``)."""
        presets = {
            name: self.preset(name, self.table(v, f"{prefix}presets.{name}"), prefix) for name, v in table.items()
        }
        self.check_preset_links(presets, prefix)
        return presets

    def datasets(self, table: dict[str, Any]) -> dict[str, str]:
        base = Path(self.source).parent if self.source and Path(self.source).is_file() else Path.cwd()
        out = {}
        for name, value in table.items():
            self.string(name, "datasets", pattern=DATASET_NAME_RE)
            path = Path(self.string(value, f"datasets.{name}"))
            out[name] = str(path if path.is_absolute() else base / path)
        return out

    def host_engine(self, key: str, value: Any, default_table: dict[str, Any], default: EngineConfig) -> EngineConfig:
        """``[hosts.NAME.engine]``: the default engine with each key this table gives replaced whole.

        Key by key, not deeper: a host's ``flags`` or ``env`` is that host's complete table, since a
        simulated host and a real one rarely share a base flag. Errors name the table the bad value
        came from (``hosts.NAME.engine.KEY`` or ``engine.KEY``).
        """
        own = self.table(value, f"{key}.engine")
        if not own:
            return default
        self.only(own, f"{key}.engine", ENGINE_KEYS)
        if own.get("kind", default.kind) != default.kind:
            # Another engine than [engine]'s: its command and flags mean nothing here. Only the model (and
            # the launch timeout) carry over; everything else is this table's or the engine's default.
            base: dict[str, Any] = {k: default_table[k] for k in ("model", "launch_timeout_s") if k in default_table}
            return self.engine({**base, **own}, lambda k: f"{key}.engine.{k}" if k in own else f"engine.{k}")
        return self.engine({**default_table, **own}, lambda k: f"{key}.engine.{k}" if k in own else f"engine.{k}")

    def engine(self, t: dict[str, Any], where: Callable[[str], str]) -> EngineConfig:
        """An engine table already checked for unknown keys; ``where(key)`` names a key in messages."""
        kind = self.string(t.get("kind", "sglang"), where("kind"))
        if kind not in DEFAULT_COMMANDS:
            raise self.fail(where("kind"), f"{kind!r} is not supported (supported: {', '.join(DEFAULT_COMMANDS)})")
        command = self.strings(t.get("command", list(DEFAULT_COMMANDS[kind])), where("command"))
        if not command:
            raise self.fail(where("command"), "must name the program to run")
        api_key_env = t.get("api_key_env")
        if api_key_env is not None:
            self.string(api_key_env, where("api_key_env"), pattern=ENV_NAME_RE)
        device = self.string(t.get("device", "cuda"), where("device"))
        if device not in DEVICES[kind]:
            raise self.fail(
                where("device"), f"{device!r} is not a device {kind} runs on here (one of {', '.join(DEVICES[kind])})"
            )
        return EngineConfig(
            device=device,
            kind=kind,
            command=expand_python(command),
            model=self.string(t.get("model", EngineConfig.model), where("model")),
            flags=self.flags(t.get("flags"), where("flags")),
            env=self.env(t.get("env"), where("env")),
            api_key_env=api_key_env,
            launch_timeout_s=self.number(t.get("launch_timeout_s", 900), where("launch_timeout_s"), 1, 7200),
            pass_env=self.pass_env(t.get("pass_env"), api_key_env, where),
            version_command=expand_python(self.strings(t["version_command"], where("version_command")))
            if t.get("version_command") is not None
            else None,
        )

    def pass_env(self, value: Any, api_key_env: str | None, where: Callable[[str], str]) -> tuple[str, ...]:
        """Names of worker env variables copied to the engine; never the bot's or Redis's secrets."""
        names = self.strings(value, where("pass_env"), pattern=ENV_NAME_RE)
        for i, name in enumerate(names):
            key = f"{where('pass_env')}[{i}]"
            if name.startswith("SLACK_") or name in ("REDIS_URL", "REDIS_PASSWORD"):
                raise self.fail(key, f"{name} is benchbot's own secret: the engine never gets it")
            if name == api_key_env:
                raise self.fail(
                    key,
                    f"{name} holds the engine's API key, which reaches it through a private "
                    f"file ({where('api_key_env')}), never through its environment",
                )
        return tuple(dict.fromkeys(names))

    def host(
        self, name: str, t: dict[str, Any], engine_table: dict[str, Any], default_engine: EngineConfig
    ) -> HostConfig:
        key = f"hosts.{name}"
        if not NAME_RE.match(name):
            raise self.fail(key, "host names are lower-case letters, digits, '-', '_' or '.'")
        self.only(
            t,
            key,
            {
                "transport",
                "ssh_target",
                "ssh_port",
                "ssh_user",
                "ssh_key",
                "ssh_known_hosts",
                "ssh_insecure_no_host_check",
                "port",
                "gpus",
                "bind",
                "http_host",
                "env",
                "nvidia_smi",
                "log_dir",
                "description",
                "engine",
            },
        )
        transport = t.get("transport", "local")
        if transport not in ("local", "ssh"):
            raise self.fail(f"{key}.transport", f"{transport!r} is not 'local' or 'ssh'")
        ssh_target = t.get("ssh_target")
        if transport == "ssh":
            ssh_target = self.string(ssh_target, f"{key}.ssh_target")
        elif ssh_target is not None:
            raise self.fail(f"{key}.ssh_target", "only used with transport = 'ssh'")
        optional = {
            k: self.string(t[k], f"{key}.{k}")
            for k in ("ssh_user", "ssh_key", "ssh_known_hosts")
            if t.get(k) is not None
        }
        default_http = ssh_target if transport == "ssh" else "127.0.0.1"
        return HostConfig(
            name=name,
            transport=transport,
            ssh_target=ssh_target,
            ssh_port=self.integer(t.get("ssh_port", 22), f"{key}.ssh_port", 1, 65535),
            ssh_insecure_no_host_check=self.boolean(
                t.get("ssh_insecure_no_host_check", False), f"{key}.ssh_insecure_no_host_check"
            ),
            port=self.integer(t.get("port", 30000), f"{key}.port", 1, 65535),
            gpus=self.integer(t.get("gpus", 8), f"{key}.gpus", 0, 1024),  # 0: a CPU box (vLLM's CPU build)
            bind=self.string(t.get("bind", "127.0.0.1"), f"{key}.bind"),
            http_host=self.string(t.get("http_host", default_http), f"{key}.http_host"),
            env=self.env(t.get("env"), f"{key}.env"),
            nvidia_smi=expand_python(self.strings(t.get("nvidia_smi", ["nvidia-smi"]), f"{key}.nvidia_smi")),
            log_dir=self.string(t.get("log_dir", "/tmp/benchbot"), f"{key}.log_dir"),
            description=str(t.get("description", "")),
            engine=self.host_engine(key, t.get("engine"), engine_table, default_engine),
            **optional,
        )

    def check_ports(self, hosts: Mapping[str, HostConfig]) -> None:
        """Two hosts on one machine cannot share an engine port (issue 25 item 4).

        Each host's launch first stops whatever engine owns its port, so the second host's launch would
        stop the first one's engine mid-bench. One machine: every ``local`` host, and every ``ssh`` host
        with the same target (``user@`` ignored; ``localhost``/``127.0.0.1``/``::1`` count as local).
        """
        seen: dict[tuple[str, int], str] = {}
        for name, host in hosts.items():
            machine = machine_of(host)
            other = seen.setdefault((machine, host.port), name)
            if other != name:
                where = "this machine (local)" if machine == LOCAL_MACHINE else f"the same machine ({machine})"
                raise self.fail(
                    f"hosts.{name}.port",
                    f"{host.port} is also the engine port of host {other!r} on {where}: a launch on one would "
                    "stop the other's engine. Give each host on one machine its own port",
                )

    def preset(self, name: str, t: dict[str, Any], prefix: str = "") -> Preset:
        key = f"{prefix}presets.{name}"
        if not NAME_RE.match(name):
            raise self.fail(key, "preset names are lower-case words (letters, digits, '-', '_', '.')")
        self.only(t, key, {"description", "flags", "remove", "env", "group", "conflicts", "requires", "versions"})
        group = t.get("group")
        if group is not None:
            self.string(group, f"{key}.group", pattern=NAME_RE)
        remove = self.removals(t.get("remove"), f"{key}.remove")
        versions = tuple(
            self.preset_version(spec, v, f'{key}.versions."{spec}"')
            for spec, v in self.table(t.get("versions"), f"{key}.versions").items()
        )
        preset = Preset(
            name=name,
            description=str(t.get("description", "")),
            flags=self.flags(t.get("flags"), f"{key}.flags"),
            remove=remove,
            env=self.env(t.get("env"), f"{key}.env"),
            group=group,
            conflicts=self.strings(t.get("conflicts"), f"{key}.conflicts", pattern=NAME_RE),
            requires=self.strings(t.get("requires"), f"{key}.requires", pattern=NAME_RE),
            versions=versions,
        )
        if not (preset.flags or preset.remove or preset.env):
            raise self.fail(key, "a preset must set flags, remove flags or set env")
        return preset

    def removals(self, value: Any, key: str) -> tuple[str, ...]:
        remove = self.strings(value, key)
        for i, flag in enumerate(remove):
            if not FLAG_RE.match(flag):
                raise self.fail(f"{key}[{i}]", "engine flags look like --lower-case-words")
        return remove

    def preset_version(self, spec: str, value: Any, key: str) -> PresetVersion:
        """``[presets.WORD.versions.">=0.5.15"]``: a version range and what the preset emits there."""
        try:
            check_version_spec(spec)
        except ValueError as exc:
            raise self.fail(key, str(exc)) from None
        t = self.table(value, key)
        self.only(t, key, {"flags", "remove", "env"})
        block = PresetVersion(
            spec=spec,
            flags=self.flags(t.get("flags"), f"{key}.flags"),
            remove=self.removals(t.get("remove"), f"{key}.remove"),
            env=self.env(t.get("env"), f"{key}.env"),
        )
        if not (block.flags or block.remove or block.env):
            raise self.fail(key, "a versions block must set flags, remove flags or set env")
        return block

    def check_preset_links(self, presets: dict[str, Preset], prefix: str = "") -> None:
        for preset in presets.values():
            for kind in ("conflicts", "requires"):
                for other in getattr(preset, kind):
                    if other not in presets:
                        raise self.fail(f"{prefix}presets.{preset.name}.{kind}", f"{other!r} is not a preset")
                    if other == preset.name:
                        raise self.fail(f"{prefix}presets.{preset.name}.{kind}", "a preset cannot name itself")

    def access(self, t: dict[str, Any]) -> AccessConfig:
        self.only(t, "access", {"users", "channels", "admins", "commands"})
        commands = {}
        for cmd, users in self.table(t.get("commands"), "access.commands").items():
            commands[cmd] = self.strings(users, f"access.commands.{cmd}", pattern=USER_RE)
        return AccessConfig(
            users=self.strings(t.get("users"), "access.users", pattern=USER_RE),
            channels=self.strings(t.get("channels"), "access.channels", pattern=USER_RE),
            admins=self.strings(t.get("admins"), "access.admins", pattern=USER_RE),
            commands=commands,
        )

    def limits(self, t: dict[str, Any]) -> Limits:
        d = Limits()
        self.only(t, "limits", set(Limits.__dataclass_fields__))
        ttl = self.number(t.get("lease_ttl_s", d.lease_ttl_s), "limits.lease_ttl_s", 1, 3600)
        return Limits(
            max_levels=self.integer(t.get("max_levels", d.max_levels), "limits.max_levels", 1, 64),
            max_concurrency=self.integer(
                t.get("max_concurrency", d.max_concurrency), "limits.max_concurrency", 1, 100000
            ),
            max_requests=self.integer(t.get("max_requests", d.max_requests), "limits.max_requests", 1, 10**7),
            max_tokens=self.integer(t.get("max_tokens", d.max_tokens), "limits.max_tokens", 1, 10**7),
            max_queued_per_user=self.integer(
                t.get("max_queued_per_user", d.max_queued_per_user), "limits.max_queued_per_user", 1, 10000
            ),
            max_command_length=self.integer(
                t.get("max_command_length", d.max_command_length), "limits.max_command_length", 20, 100000
            ),
            max_sweep_configs=self.integer(
                t.get("max_sweep_configs", d.max_sweep_configs), "limits.max_sweep_configs", 1, 64
            ),
            job_timeout_s=self.integer(t.get("job_timeout_s", d.job_timeout_s), "limits.job_timeout_s", 10, 7 * 86400),
            lease_ttl_s=ttl,
            lease_margin_s=self.lease_margin(t, ttl),
            cancel_grace_s=self.number(t.get("cancel_grace_s", d.cancel_grace_s), "limits.cancel_grace_s", 0, 3600),
        )
