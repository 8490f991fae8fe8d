"""The compose file: redis (AOF on a volume), the Slack app, one worker per host, and Prometheus with ``[metrics]``.

Built as data (:func:`compose_document`) and written by :mod:`ops.yaml_emit`; secrets appear only as
``${NAME}`` from ``.env``.
"""

from __future__ import annotations

from ops import prometheus
from ops.defaults import (
    CONTAINER_UID,
    DEFAULT_BUILD_CONTEXT,
    DEFAULT_CONFIG_FILE,
    DEFAULT_CONFIG_PATH,
    DEFAULT_DOCKERFILE,
    DEFAULT_IMAGE,
    DEFAULT_STATE_DIR,
    GENERATED,
    IMAGE_RE,
    check,
)
from ops.yaml_emit import Commented, Yaml, plain, to_yaml
from workers.config import Config
from workers.engines.probe import is_simulator


def _redis_password_ref() -> str:
    return "${REDIS_PASSWORD:?set REDIS_PASSWORD in .env}"


def compose_document(
    config: Config,
    *,
    image: str = DEFAULT_IMAGE,
    build_context: str = DEFAULT_BUILD_CONTEXT,
    dockerfile: str = DEFAULT_DOCKERFILE,
    config_file: str = DEFAULT_CONFIG_FILE,
) -> dict[str, Yaml]:
    """The compose file as data: redis (AOF on a volume), the bot, and one worker per host.

    ``build_context`` (relative to the compose file) is the repository root, ``dockerfile`` (relative to
    that) the rendered Dockerfile, ``config_file`` the config mounted when ``BENCHBOT_CONFIG_FILE`` is unset.
    """
    check(image, IMAGE_RE, "image", DEFAULT_IMAGE)
    redis_url = "redis://:${REDIS_PASSWORD}@redis:6379/0"
    build = {"context": build_context, "dockerfile": dockerfile}
    base_env = {
        "REDIS_URL": redis_url,
        "BENCHBOT_CONFIG": DEFAULT_CONFIG_PATH,
        "BENCHBOT_STATE_DIR": DEFAULT_STATE_DIR,
    }
    config_mount = f"${{BENCHBOT_CONFIG_FILE:-{config_file}}}:{DEFAULT_CONFIG_PATH}:ro"
    depends = {"redis": {"condition": "service_healthy"}}
    services: dict[str, Commented] = {
        "redis": Commented(
            {
                "image": "redis:7.2-alpine",
                "command": [
                    "sh",
                    "-c",
                    "exec redis-server /usr/local/etc/redis/redis.conf --dir /data "
                    '--bind 0.0.0.0 --requirepass "$$REDIS_PASSWORD"',
                ],
                "environment": {"REDIS_PASSWORD": _redis_password_ref()},
                "volumes": ["./redis.conf:/usr/local/etc/redis/redis.conf:ro", "redis-data:/data"],
                "healthcheck": {
                    "test": ["CMD-SHELL", 'redis-cli --no-auth-warning -a "$$REDIS_PASSWORD" ping | grep -q PONG'],
                    "interval": "5s",
                    "timeout": "3s",
                    "retries": 20,
                },
                "restart": "unless-stopped",
            },
            "Queues, leases, events and the run history. AOF on a named volume; no port is published:\n"
            "only services on this compose network reach it, with the password from .env.",
        ),
        "bot": Commented(
            {
                "image": image,
                "build": build,
                "command": ["slack"],
                "env_file": [".env"],
                "environment": {**base_env, **prometheus.bind_env(config, "bot")},
                "volumes": [config_mount, f"bot-state:{DEFAULT_STATE_DIR}"],
                "ports": ["3000:3000"],
                "depends_on": depends,
                "restart": "unless-stopped",
            },
            "The Slack app. Socket Mode (SLACK_APP_TOKEN set) needs no inbound port; HTTP mode listens\n"
            "on 3000 behind your TLS proxy.",
        ),
    }
    for name, host in config.hosts.items():
        env = dict(base_env)
        key_env = host.engine.api_key_env  # each host's engine may name its own key variable
        if key_env:
            env[key_env] = f"${{{key_env}:-}}"
        for variable in host.engine.pass_env:  # the engine sees them only if its worker has them
            env.setdefault(variable, f"${{{variable}:-}}")
        env.update(prometheus.bind_env(config, f"worker-{name}"))  # reachable from Prometheus with [metrics]
        volumes_of: list[Yaml] = [config_mount]
        service: dict[str, Yaml] = {
            "image": image,
            "build": build,
            "command": ["worker", "--host", name],
            "environment": env,
            "volumes": volumes_of,
            "depends_on": depends,
            "restart": "unless-stopped",
        }
        if host.transport == "ssh":
            volumes_of.append("${BENCHBOT_SSH_DIR:-./ssh}:/home/benchbot/.ssh:ro")
            comment = (
                f"Worker for {name} over SSH ({host.ssh_target}): the engine runs there; the key and\n"
                f"known_hosts come from ./ssh (readable by uid {CONTAINER_UID})."
            )
        elif is_simulator(host.engine.command):
            comment = (
                f"Worker for {name}, a simulated host: its engine is benchbot's simulator, run inside\n"
                f"this container (the image has it); no GPU needed."
            )
        else:
            service["ipc"] = "host"
            service["deploy"] = {
                "resources": {
                    "reservations": {"devices": [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]}
                }
            }
            comment = (
                f"Worker for {name} with transport=local: the engine runs inside this container, so\n"
                f"this only works on the GPU box with an image that also has the engine (FROM your\n"
                f"SGLang image); usually run this worker with systemd there instead."
            )
        services[f"worker-{name}"] = Commented(service, comment)
    volumes: dict[str, Yaml] = {"redis-data": {}, "bot-state": {}}
    prometheus_service = prometheus.prometheus_service(config)  # with [metrics] only (ops/prometheus.py)
    if prometheus_service is not None:
        services["prometheus"] = Commented(prometheus_service, prometheus.SERVICE_COMMENT)
        volumes[prometheus.VOLUME] = {}
    return {"name": "benchbot", "services": services, "volumes": volumes}


def render_compose(config: Config, *, image: str = DEFAULT_IMAGE, **paths: str) -> str:
    """compose.yaml text (see :func:`compose_document` for ``paths``); secrets only as ``${NAME}`` from ``.env``."""
    config_file = paths.get("config_file", DEFAULT_CONFIG_FILE)
    header = (
        "benchbot with docker compose: redis, the Slack app and one worker per host.\n"
        f"{GENERATED}\n"
        "Use, in this directory: cp .env.example .env (fill it in), then docker compose up -d --build.\n"
        f"The config mounted is {config_file} (`deploy render` writes a copy of the config it rendered\n"
        "from there if there is none; BENCHBOT_CONFIG_FILE=/path in .env mounts another);\n"
        "SSH workers read their key and known_hosts from ./ssh (BENCHBOT_SSH_DIR)."
    )
    return to_yaml(compose_document(config, image=image, **paths), header)


def compose_data(config: Config, **options: str) -> Yaml:
    """:func:`compose_document` as plain dicts and lists, for checks and tests."""
    return plain(compose_document(config, **options))
