"""systemd units for benchbot: the Slack app and one templated worker per GPU host.

Hardened as far as a worker that drives GPUs over SSH allows (its keys, device nodes and engine caches stay
reachable); the worker unit unsets the Slack secrets so an engine it starts never inherits them.
"""

from __future__ import annotations

from ops.defaults import (
    BOT_UNIT,
    DEFAULT_CONFIG_PATH,
    DEFAULT_ENV_FILE,
    DEFAULT_INSTALL_DIR,
    DEFAULT_STATE_DIR,
    DEFAULT_USER,
    GENERATED,
    PATH_RE,
    SLACK_SECRETS,
    USER_RE,
    WORKER_UNIT,
    check,
)
from workers.config import Config


def _unit(sections: list[tuple[str, list[tuple[str, str]]]], comment: str) -> str:
    lines = [f"# {line}".rstrip() for line in comment.splitlines()]
    for name, entries in sections:
        lines += ["", f"[{name}]"]
        for key, value in entries:
            if key.startswith("#"):
                lines.append(f"# {value}")
            else:
                lines.append(f"{key}={value}")
    return "\n".join(lines) + "\n"


def _hardening(*, private_tmp: bool, protect_home: bool) -> list[tuple[str, str]]:
    """Hardening that leaves SSH keys, GPU device nodes and engine caches reachable."""
    entries = [("NoNewPrivileges", "yes"), ("ProtectSystem", "full")]
    if protect_home:
        entries.append(("ProtectHome", "read-only"))
    entries += [
        ("PrivateTmp", "yes" if private_tmp else "no"),
        ("ProtectKernelTunables", "yes"),
        ("ProtectKernelModules", "yes"),
        ("ProtectControlGroups", "yes"),
        ("RestrictSUIDSGID", "yes"),
        ("LockPersonality", "yes"),
        ("UMask", "0027"),
    ]
    return entries


def render_systemd(
    config: Config,
    *,
    install_dir: str = DEFAULT_INSTALL_DIR,
    user: str = DEFAULT_USER,
    env_file: str = DEFAULT_ENV_FILE,
    config_path: str = DEFAULT_CONFIG_PATH,
    state_dir: str = DEFAULT_STATE_DIR,
) -> dict[str, str]:
    """``benchbot-bot.service`` and the ``benchbot-worker@.service`` template (instance = host name).

    ``install_dir`` holds the virtualenv (``.venv/bin/benchbot``). The env file is optional ('-'), so
    a worker box needs only what its unit sets; values in it override the unit's defaults.
    """
    check(install_dir, PATH_RE, "install_dir", DEFAULT_INSTALL_DIR)
    check(user, USER_RE, "user", DEFAULT_USER)
    check(env_file, PATH_RE, "env_file", DEFAULT_ENV_FILE)
    check(config_path, PATH_RE, "config_path", DEFAULT_CONFIG_PATH)
    check(state_dir, PATH_RE, "state_dir", DEFAULT_STATE_DIR)
    exe = f"{install_dir.rstrip('/')}/.venv/bin/benchbot"
    state_name = state_dir.rstrip("/").removeprefix("/var/lib/")
    state = (
        [("StateDirectory", state_name), ("StateDirectoryMode", "0750")]
        if state_dir.startswith("/var/lib/") and state_name
        else [("ReadWritePaths", state_dir)]
    )
    common = [
        ("User", user),
        ("Group", user),
        ("WorkingDirectory", state_dir),
        ("Environment", f"BENCHBOT_CONFIG={config_path}"),
        ("Environment", f"BENCHBOT_STATE_DIR={state_dir}"),
        ("Environment", "PYTHONUNBUFFERED=1"),
        ("Environment", f"MPLCONFIGDIR={state_dir.rstrip('/')}/.matplotlib"),  # the plots' font cache
        ("EnvironmentFile", f"-{env_file}"),
    ]
    hosts = " ".join(f"benchbot-worker@{name}" for name in config.hosts)
    bot = _unit(
        [
            (
                "Unit",
                [
                    ("Description", "benchbot Slack app: takes commands, queues jobs, posts results"),
                    ("Wants", "network-online.target"),
                    ("After", "network-online.target redis-server.service redis.service"),
                ],
            ),
            (
                "Service",
                [
                    ("Type", "simple"),
                    *common,
                    ("ExecStart", f"{exe} slack"),
                    ("Restart", "on-failure"),
                    ("RestartSec", "5"),
                    *state,
                    *_hardening(private_tmp=True, protect_home=True),
                ],
            ),
            ("Install", [("WantedBy", "multi-user.target")]),
        ],
        f"{BOT_UNIT}: the Slack app (Socket Mode with SLACK_APP_TOKEN, else HTTP on port 3000) and its\n"
        f"notifier. One per team; it needs Redis and the Slack secrets in {env_file}.\n"
        f"{GENERATED}\n"
        f"Install: cp {BOT_UNIT} /etc/systemd/system/ && systemctl daemon-reload\n"
        f"         && systemctl enable --now benchbot-bot",
    )
    worker = _unit(
        [
            (
                "Unit",
                [
                    ("Description", "benchbot worker for GPU host %i"),
                    ("Wants", "network-online.target"),
                    ("After", "network-online.target redis-server.service redis.service"),
                ],
            ),
            (
                "Service",
                [
                    ("Type", "simple"),
                    *common,
                    ("UnsetEnvironment", " ".join(SLACK_SECRETS)),
                    ("ExecStart", f"{exe} worker --host %i"),
                    ("Restart", "on-failure"),
                    ("RestartSec", "5"),
                    ("#", "Stop only the worker: RQ's warm shutdown lets the running job end, and an engine it"),
                    ("#", "launched (transport=local) keeps serving the team; /stop ends that, not a restart."),
                    ("KillMode", "process"),
                    ("TimeoutStopSec", str(int(config.limits.cancel_grace_s) + 60)),
                    *state,
                    ("#", "No PrivateTmp/ProtectHome/PrivateDevices: engine logs under /tmp or /var/tmp must"),
                    ("#", "outlive a worker restart, ~/.ssh holds the SSH key, and a local engine needs the GPUs."),
                    *_hardening(private_tmp=False, protect_home=False),
                ],
            ),
            ("Install", [("WantedBy", "multi-user.target")]),
        ],
        f"{WORKER_UNIT}: one RQ worker per GPU host named in the config (the instance name).\n"
        f'Run it on the GPU box (transport = "local") or on a jump box (transport = "ssh").\n'
        f"{GENERATED}\n"
        f"Hosts in this config: {', '.join(config.hosts)}. Enable each where its worker should run:\n"
        f"  systemctl enable --now {hosts}",
    )
    return {BOT_UNIT: bot, WORKER_UNIT: worker}
