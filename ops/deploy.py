"""Deployment files rendered from a config: systemd units, a compose file, the image, env and Redis.

Why render instead of hand-writing them: a team's hosts live in ``benchbot.toml``, and the compose
file needs one worker service per host. Rendering keeps the two in step, and a test renders the
committed ``deploy/`` files from ``deploy/benchbot.example.toml`` so they cannot drift.

No YAML library is installed, so the compose file is emitted by :func:`to_yaml`, a deliberately small
emitter: every string is a JSON-style double-quoted scalar (valid YAML), keys are plain words, and
nothing else (anchors, multi-line strings, tags) is ever produced. Secrets never appear in any file:
they come from the environment (``.env`` / the systemd ``EnvironmentFile``), and the compose file
refers to them only by ``${NAME}``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ops import prometheus
from ops.compose import compose_data, compose_document, render_compose
from ops.defaults import (
    CONTAINER_UID,
    DEFAULT_API_KEY_ENV,
    DEFAULT_CONFIG_FILE,
    DEFAULT_CONFIG_PATH,
    DEFAULT_ENV_FILE,
    DEFAULT_IMAGE,
    DEFAULT_INSTALL_DIR,
    DEFAULT_STATE_DIR,
    DEFAULT_USER,
    GENERATED,
    SLACK_SECRETS,
    api_key_envs,
    pass_env,
)
from ops.systemd import render_systemd
from ops.yaml_emit import Commented, to_yaml
from workers.config import Config, load_config
from workers.errors import BenchbotError

#: The renderers' names as this module has always offered them (tests and ``benchbot deploy`` use them).
__all__ = [
    "DEFAULT_API_KEY_ENV",
    "SLACK_SECRETS",
    "Commented",
    "compose_data",
    "compose_document",
    "main",
    "render_all",
    "render_compose",
    "render_dockerfile",
    "render_dockerignore",
    "render_env_example",
    "render_redis_conf",
    "render_systemd",
    "to_yaml",
    "write_deploy_files",
]


# --------------------------------------------------------------------------- env, redis, image


def render_env_example(config: Config) -> str:
    """``.env.example``: every variable benchbot reads, with placeholders only."""
    key_lines = [f"{name}=REPLACE-ME" for name in api_key_envs(config)] or [
        f'# {DEFAULT_API_KEY_ENV}=REPLACE-ME   (set engine.api_key_env = "{DEFAULT_API_KEY_ENV}")'
    ]
    return "\n".join(
        [
            "# benchbot environment. Placeholders only: real values never go into git.",
            f"# systemd: install as {DEFAULT_ENV_FILE} (owner root, group benchbot, mode 0640).",
            "# compose: copy to .env next to compose.yaml. One assignment per line; no comments after a value.",
            "",
            "# --- Slack: the bot only (the worker unit unsets them). Socket Mode when SLACK_APP_TOKEN is set.",
            "SLACK_BOT_TOKEN=xoxb-REPLACE-ME",
            "SLACK_APP_TOKEN=xapp-REPLACE-ME",
            "# HTTP mode instead: drop SLACK_APP_TOKEN, set the signing secret, route https://HOST/slack/events"
            " to :3000.",
            "SLACK_SIGNING_SECRET=REPLACE-ME",
            "# Another Slack Web API base URL (a proxy or a stand-in); empty means Slack itself.",
            "SLACK_API_URL=",
            "# Channel id where jobs queued outside Slack (benchbot say / console) are posted.",
            "# BENCHBOT_SLACK_CHANNEL=C0123456789",
            "# HTTP mode bind address (default 0.0.0.0).",
            "# BENCHBOT_SLACK_BIND=127.0.0.1",
            "",
            "# --- Redis. systemd: where the shared server is (add :PASSWORD@ if it has requirepass).",
            "# compose ignores REDIS_URL (it sets its own) and uses REDIS_PASSWORD for its server.",
            "REDIS_URL=redis://127.0.0.1:6379/0",
            "REDIS_PASSWORD=REPLACE-ME",
            "",
            "# --- benchbot",
            f"BENCHBOT_CONFIG={DEFAULT_CONFIG_PATH}",
            f"BENCHBOT_STATE_DIR={DEFAULT_STATE_DIR}",
            "# `benchbot demo --real` only: the venv with vLLM's CPU build (default .venv-real in the checkout).",
            "# BENCHBOT_REAL_VENV=.venv-real",
            "",
            "# --- the engine's --api-key, read by the worker from the variable engine.api_key_env names",
            "# (or the one a host's own [hosts.NAME.engine] names: one line per variable below).",
            *key_lines,
            "",
            *_pass_env_lines(config),
        ]
    )


def _pass_env_lines(config: Config) -> list[str]:
    """Placeholders for the variables the hosts' ``engine.pass_env`` copy from the worker to the engine."""
    names = pass_env(config)
    if not names:
        return []
    return [
        "# --- copied from the worker to the engine (engine.pass_env); nothing else of this file reaches it.",
        *(f"{name}=" for name in names),
        "",
    ]


def render_redis_conf() -> str:
    """``redis.conf``: durable (AOF every second) and reachable only where it should be."""
    return "\n".join(
        [
            "# redis.conf for benchbot: queues, leases, events and the run history must survive a restart.",
            "# systemd: `include /etc/redis/benchbot.conf` at the end of the distro's redis.conf (which keeps",
            "# its dir, logfile and service settings). compose: the whole config, with --dir/--bind/--requirepass.",
            f"# {GENERATED}",
            "",
            "# Loopback only. Workers on other hosts: add this host's private address (never a public one),",
            "# e.g. `bind 127.0.0.1 -::1 10.0.0.5`, and set a password (below).",
            "bind 127.0.0.1 -::1",
            "protected-mode yes",
            "port 6379",
            "",
            "# Append-only file, fsync once a second: at most a second of jobs and events lost on a crash.",
            "appendonly yes",
            "appendfsync everysec",
            "aof-use-rdb-preamble yes",
            "auto-aof-rewrite-percentage 100",
            "auto-aof-rewrite-min-size 64mb",
            "# Snapshots as well, for backups (copy dump.rdb and the appendonlydir elsewhere).",
            "save 3600 1 300 100",
            "",
            "# Never evict: a dropped lease or queued job would be a silent bug, so fail writes instead.",
            "maxmemory-policy noeviction",
            "",
            "# A password keeps other tenants of the network out. It is a secret: keep it out of this file,",
            "# in a root-only file included here (`requirepass ...`), and put it into REDIS_URL as",
            "# redis://:PASSWORD@host:6379/0.",
            "# include /etc/redis/benchbot-auth.conf",
            "",
        ]
    )


def render_dockerfile() -> str:
    """The image: python:3.11-slim, the package, ssh for the SSH transport, a non-root user."""
    return "\n".join(
        [
            "# benchbot image: the Slack app and workers that drive GPU hosts over SSH.",
            "# Build from the repository root: docker build -f deploy/Dockerfile -t benchbot .",
            f"# {GENERATED}",
            "FROM python:3.11-slim",
            "",
            "ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1",
            "",
            "# openssh-client: ssh-keyscan and ssh for people debugging the SSH transport from inside.",
            "RUN apt-get update \\",
            " && apt-get install -y --no-install-recommends openssh-client \\",
            " && rm -rf /var/lib/apt/lists/*",
            "",
            f"RUN groupadd --system --gid {CONTAINER_UID} benchbot \\",
            f" && useradd --system --uid {CONTAINER_UID} --gid benchbot --create-home --home-dir /home/benchbot "
            "--shell /usr/sbin/nologin benchbot \\",
            f" && install -d -o benchbot -g benchbot -m 0750 {DEFAULT_STATE_DIR} /home/benchbot/.ssh \\",
            " && install -d -m 0755 /etc/benchbot",
            "",
            "WORKDIR /opt/benchbot",
            "COPY pyproject.toml README.md ./",
            "COPY bot ./bot",
            "COPY workers ./workers",
            "RUN pip install . && rm -rf build",
            "",
            "USER benchbot",
            f"ENV BENCHBOT_CONFIG={DEFAULT_CONFIG_PATH} BENCHBOT_STATE_DIR={DEFAULT_STATE_DIR}",
            f"WORKDIR {DEFAULT_STATE_DIR}",
            f'VOLUME ["{DEFAULT_STATE_DIR}"]',
            'ENTRYPOINT ["benchbot"]',
            'CMD ["slack"]',
            "",
        ]
    )


def render_dockerignore() -> str:
    """``Dockerfile.dockerignore``: keep the virtualenv, git and outputs out of the build context."""
    return "\n".join(
        [
            "# The build context is the repository root; send only what the Dockerfile copies.",
            "**",
            "!pyproject.toml",
            "!README.md",
            "!bot/**",
            "!workers/**",
            "**/__pycache__",
            "**/*.pyc",
            "",
        ]
    )


# --------------------------------------------------------------------------- everything at once


def render_all(
    config: Config,
    *,
    install_dir: str = DEFAULT_INSTALL_DIR,
    user: str = DEFAULT_USER,
    env_file: str = DEFAULT_ENV_FILE,
    image: str = DEFAULT_IMAGE,
    **compose_paths: str,
) -> dict[str, str]:
    """Every deployment file, by file name (``compose_paths``: see :func:`compose_document`)."""
    files = render_systemd(config, install_dir=install_dir, user=user, env_file=env_file)
    files["compose.yaml"] = render_compose(config, image=image, **compose_paths)
    files["Dockerfile"] = render_dockerfile()
    files["Dockerfile.dockerignore"] = render_dockerignore()
    files[".env.example"] = render_env_example(config)
    files["redis.conf"] = render_redis_conf()
    scrape = prometheus.render_prometheus_yml(config)
    if scrape is not None:
        files[prometheus.PROMETHEUS_FILE] = scrape
    return files


def source_root() -> Path | None:
    """The repository benchbot runs from (the image's build context), or None for an installed wheel."""
    root = Path(__file__).resolve().parents[1]
    return root if (root / "pyproject.toml").is_file() and (root / "workers").is_dir() else None


def compose_paths_for(config: Config, out_dir: Path) -> dict[str, str]:
    """Build context and Dockerfile, relative to a compose file written into ``out_dir``."""
    out = out_dir.resolve()
    paths: dict[str, str] = {}
    root = source_root()
    if root is not None:
        paths["build_context"] = os.path.relpath(root, out)
        paths["dockerfile"] = os.path.relpath(out / "Dockerfile", root)
    return paths


def _copy_config(config: Config, out: Path) -> Path | None:
    """``out/benchbot.toml``, the config the files were rendered from, for compose to mount; never over one
    that is there (it may hold the operator's edits) and never from the embedded default (no file)."""
    source = Path(config.source)
    target = out / DEFAULT_CONFIG_FILE.removeprefix("./")
    if not source.is_file() or target.exists():
        return None
    target.write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
    return target


def write_deploy_files(
    config: Config,
    out_dir: Path | str,
    *,
    install_dir: str = DEFAULT_INSTALL_DIR,
    user: str = DEFAULT_USER,
    env_file: str = DEFAULT_ENV_FILE,
    image: str = DEFAULT_IMAGE,
) -> list[Path]:
    """Render every file into ``out_dir`` (created if needed); return the paths written, sorted.

    Everything is rendered before anything is written, so bad options change nothing on disk. The
    compose file works from ``out_dir`` wherever it is: its build context and Dockerfile are given
    relative to it (see :func:`compose_paths_for`), and it mounts the config it was rendered from.
    """
    out = Path(out_dir)
    files = render_all(
        config, install_dir=install_dir, user=user, env_file=env_file, image=image, **compose_paths_for(config, out)
    )
    try:
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        for name, text in sorted(files.items()):
            path = out / name
            path.write_text(text, encoding="utf-8")
            paths.append(path)
        copied = _copy_config(config, out)
        if copied is not None:
            paths.append(copied)
    except OSError as exc:
        raise BenchbotError(f"cannot write deployment files to {out}: {exc.strerror}") from None
    return paths


def main(argv: list[str] | None = None) -> int:
    """``python -m ops.deploy CONFIG OUT_DIR``: what ``benchbot deploy render`` does, without the CLI."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m ops.deploy CONFIG OUT_DIR", file=sys.stderr)
        return 2
    try:
        for path in write_deploy_files(load_config(args[0]), args[1]):
            print(path)
    except BenchbotError as exc:
        print(f"benchbot: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
