"""Validation by section: ``[engine]``, ``[hosts.*]``, ``[presets.*]``, ``[access]``, ``[limits]``, ``[eval]``,
``[metrics]``, ``[groups.*]`` (:mod:`workers.config.groups`).

Raw TOML (the one place it is untyped) goes in; a :class:`Config` or a ConfigError naming the key comes out.
"""

from __future__ import annotations

import ipaddress
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from workers.config.checks import RawTable, _Checks
from workers.config.groups import groups_section
from workers.config.schema import (
    DATASET_NAME_RE,
    DEFAULT_COMMANDS,
    DEVICES,
    ENGINE_KEYS,
    ENV_NAME_RE,
    FLAG_RE,
    LOCAL_MACHINE,
    NAME_RE,
    USER_RE,
    AccessConfig,
    Config,
    EngineConfig,
    EvalConfig,
    HostConfig,
    Limits,
    MetricsConfig,
    Preset,
    PresetVersion,
    expand_python,
    machine_of,
)
from workers.config.tune_section import tune_section
from workers.engines import registry
from workers.engines.contract import check_version_spec
from workers.evaluation import runner as eval_runner
from workers.evaluation import tasks as eval_tasks


def metrics_section(checks: _Checks, t: RawTable, hosts: Mapping[str, HostConfig]) -> MetricsConfig:
    """``[metrics]``: ``bind``, ``bot_port`` and ``worker_ports = { HOST = PORT }``; every port distinct.

    Two endpoints on one port would leave the second process unable to start its server, so the
    collision is refused here, naming both, rather than at 3 a.m. in a worker's log.
    """
    checks.only(t, "metrics", {"bind", "bot_port", "worker_ports"})
    bind = checks.string(t.get("bind", MetricsConfig.bind), "metrics.bind")
    try:
        ipaddress.ip_address(bind)
    except ValueError:
        raise checks.fail(
            "metrics.bind", f"{bind!r} is not an IP address to listen on (127.0.0.1, the default; 0.0.0.0 for all)"
        ) from None
    bot_port = checks.integer(t["bot_port"], "metrics.bot_port", 1, 65535) if "bot_port" in t else None
    used: dict[int, str] = {bot_port: "metrics.bot_port"} if bot_port is not None else {}
    ports: dict[str, int] = {}
    for name, value in checks.table(t.get("worker_ports"), "metrics.worker_ports").items():
        key = f"metrics.worker_ports.{name}"
        if name not in hosts:
            raise checks.fail(key, f"{name!r} is not one of the hosts ({', '.join(hosts)})")
        port = checks.integer(value, key, 1, 65535)
        if port in used:
            raise checks.fail(key, f"{port} is also {used[port]}: each metrics endpoint needs its own port")
        used[port] = key
        ports[name] = port
    return MetricsConfig(bind=bind, bot_port=bot_port, worker_ports=ports)


def engine_table_over(
    own: Mapping[str, object], default_table: Mapping[str, object], default_kind: str
) -> dict[str, object]:
    """A host's raw engine table: ``[engine]`` with ``own``'s keys over it.

    Another engine than ``[engine]``'s: its command and flags mean nothing here. Only the model (and the
    launch timeout) carry over; everything else is ``own``'s or the engine's default.
    """
    if own.get("kind", default_kind) != default_kind:
        base = {k: default_table[k] for k in ("model", "launch_timeout_s") if k in default_table}
        return {**base, **own}
    return {**default_table, **own}


class _Validator(_Checks):
    """Each section's check is one method; :meth:`config` calls them in turn."""

    def config(self, data: RawTable) -> Config:
        self.only(
            data,
            "",
            {
                "default_host",
                "engine",
                "engines",
                "hosts",
                "presets",
                "access",
                "limits",
                "datasets",
                "eval",
                "metrics",
                "groups",
                "tune",
            },
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
            metrics=metrics_section(self, self.table(data.get("metrics"), "metrics"), hosts),
            groups=groups_section(
                self,
                self.table(data.get("groups"), "groups"),
                hosts,
                {
                    name: engine_table_over(self.table(raw.get("engine"), name), engine_table, default_engine.kind)
                    for name, raw in hosts_table.items()
                },
                self.engine,
            ),
            tune=tune_section(self, self.table(data.get("tune"), "tune")),
        )

    def _base_dir(self) -> Path:
        return Path(self.source).parent if self.source and Path(self.source).is_file() else Path.cwd()

    def eval(self, t: RawTable) -> EvalConfig:
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

    def engine_presets(self, table: RawTable) -> dict[str, dict[str, Preset]]:
        """``[engines.SET.presets.WORD]``: presets in another engine's words (default: the engine folder's
        packaged presets, e.g. vLLM's presets.toml)."""
        packaged = registry.packaged_preset_files()
        out: dict[str, dict[str, Preset]] = {}
        for kind, value in table.items():
            if kind not in packaged:
                raise self.fail(
                    f"engines.{kind}",
                    f"{kind!r} is not an engine with its own presets ({', '.join(packaged)}; "
                    f"{registry.display_name(registry.DEFAULT_KIND)}'s are [presets])",
                )
            t = self.table(value, f"engines.{kind}")
            self.only(t, f"engines.{kind}", {"presets"})
            out[kind] = self.preset_table(self.table(t.get("presets"), f"engines.{kind}.presets"), f"engines.{kind}.")
        for kind, path in packaged.items():
            if kind not in out:
                with path.open("rb") as fh:
                    data = tomllib.load(fh)
                out[kind] = _Validator(str(path)).preset_table(self.table(data.get("presets"), "presets"), "")
        return out

    def preset_table(self, table: RawTable, prefix: str) -> dict[str, Preset]:
        """One engine's ``presets`` table, validated like ``[presets]`` (keys named with ``prefix``)."""
        presets = {
            name: self.preset(name, self.table(v, f"{prefix}presets.{name}"), prefix) for name, v in table.items()
        }
        self.check_preset_links(presets, prefix)
        return presets

    def datasets(self, table: RawTable) -> dict[str, str]:
        base = Path(self.source).parent if self.source and Path(self.source).is_file() else Path.cwd()
        out = {}
        for name, value in table.items():
            self.string(name, "datasets", pattern=DATASET_NAME_RE)
            path = Path(self.string(value, f"datasets.{name}"))
            out[name] = str(path if path.is_absolute() else base / path)
        return out

    def host_engine(self, key: str, value: Any, default_table: RawTable, default: EngineConfig) -> EngineConfig:
        """``[hosts.NAME.engine]``: the default engine with each key this table gives replaced whole.

        Key by key, not deeper: a host's ``flags`` or ``env`` is that host's complete table, since a
        simulated host and a real one rarely share a base flag. Errors name the table the bad value
        came from (``hosts.NAME.engine.KEY`` or ``engine.KEY``).
        """
        own = self.table(value, f"{key}.engine")
        if not own:
            return default
        self.only(own, f"{key}.engine", ENGINE_KEYS)
        return self.engine(
            engine_table_over(own, default_table, default.kind),
            lambda k: f"{key}.engine.{k}" if k in own else f"engine.{k}",
        )

    def engine(self, t: RawTable, where: Callable[[str], str]) -> EngineConfig:
        """An engine table already checked for unknown keys; ``where(key)`` names a key in messages."""
        kind = self.string(t.get("kind", registry.DEFAULT_KIND), where("kind"))
        if kind not in DEFAULT_COMMANDS:
            raise self.fail(where("kind"), f"{kind!r} is not supported (supported: {', '.join(DEFAULT_COMMANDS)})")
        command = self.strings(t.get("command", list(DEFAULT_COMMANDS[kind])), where("command"))
        if not command:
            raise self.fail(where("command"), "must name the program to run")
        api_key_env = t.get("api_key_env")
        if api_key_env is not None:
            self.string(api_key_env, where("api_key_env"), pattern=ENV_NAME_RE)
            engine = registry.engine(kind)
            if not engine.checks_api_key:
                raise self.fail(
                    where("api_key_env"),
                    f"{engine.name}'s server checks no API key, so a key would protect nothing: leave api_key_env "
                    f"out of a {kind} host",
                )
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

    def host(self, name: str, t: RawTable, engine_table: RawTable, default_engine: EngineConfig) -> HostConfig:
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
        engine = self.host_engine(key, t.get("engine"), engine_table, default_engine)
        # Unset, the port is the engine's own default (SGLang 30000, vLLM and TensorRT-LLM 8000): where a teammate's
        # hand-started server listens, so /status and a launch's port check look where it is.
        default_port = registry.DEFAULT_PORTS[registry.family(engine.kind)]
        return HostConfig(
            name=name,
            transport=transport,
            ssh_target=ssh_target,
            ssh_port=self.integer(t.get("ssh_port", 22), f"{key}.ssh_port", 1, 65535),
            ssh_insecure_no_host_check=self.boolean(
                t.get("ssh_insecure_no_host_check", False), f"{key}.ssh_insecure_no_host_check"
            ),
            port=self.integer(t.get("port", default_port), f"{key}.port", 1, 65535),
            gpus=self.integer(t.get("gpus", 8), f"{key}.gpus", 0, 1024),  # 0: a CPU box (vLLM's CPU build)
            bind=self.string(t.get("bind", "127.0.0.1"), f"{key}.bind"),
            http_host=self.string(t.get("http_host", default_http), f"{key}.http_host"),
            env=self.env(t.get("env"), f"{key}.env"),
            nvidia_smi=expand_python(self.strings(t.get("nvidia_smi", ["nvidia-smi"]), f"{key}.nvidia_smi")),
            log_dir=self.string(t.get("log_dir", "/tmp/benchbot"), f"{key}.log_dir"),
            description=str(t.get("description", "")),
            engine=engine,
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

    def preset(self, name: str, t: RawTable, prefix: str = "") -> Preset:
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

    def access(self, t: RawTable) -> AccessConfig:
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

    def limits(self, t: RawTable) -> Limits:
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
            observe_every_s=self.number(t.get("observe_every_s", d.observe_every_s), "limits.observe_every_s", 1, 3600),
            observation_stale_s=self.number(
                t.get("observation_stale_s", d.observation_stale_s), "limits.observation_stale_s", 1, 86400
            ),
            status_deadline_s=self.number(
                t.get("status_deadline_s", d.status_deadline_s), "limits.status_deadline_s", 0.05, 30
            ),
        )
