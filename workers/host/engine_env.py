"""What an engine process gets from benchbot: the env its config names, and its API key in a private file.

The worker's own environment holds Slack tokens, ``REDIS_URL`` and the engine's key, and an engine
that inherited it would hand them to every plugin and crash dump. So the engine's env is built from
names only: the host's ``env``, the engine's and the presets' ``env``, and the variables
``engine.pass_env`` lists, copied from the worker (plus PATH/HOME-like basics the host side adds:
:data:`workers.host.transport.ENGINE_BASE_ENV`).

SGLang has no environment variable for its API key, and argv is world-readable (``ps``). It does merge
``--config FILE.yaml`` in-process (``sglang/srt/server_args_config_parser.py``; config first, the
command line wins), so the key goes into a 0600 file the host-side actuator writes from stdin, and
argv carries only ``--config PATH``; the file is removed once the engine is ready or dead.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from workers.config import Config, HostConfig
from workers.host.transport import HostFence
from workers.observer import engine_api_key
from workers.presets import LaunchSpec
from workers.secrets import SECRET_KEY_RE


def engine_env(
    config: Config, host: HostConfig, spec: LaunchSpec, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The engine's env: ``engine.pass_env`` from the worker, then host env, then engine/preset env (wins)."""
    environ = os.environ if environ is None else environ
    passed = {name: environ[name] for name in config.engine.pass_env if name in environ}
    return {**passed, **dict(host.env), **dict(spec.env)}


def private_options(config: Config) -> dict[str, Any] | None:
    """Options that must not be on argv (the API key), for the engine's private ``--config`` file."""
    key = engine_api_key(config)
    return {"api-key": key} if key else None


def engine_argv(spec: LaunchSpec, fence: HostFence, options: Mapping[str, Any] | None) -> list[str]:
    """The argv to start: the spec's, plus ``--config PATH`` when there are private options."""
    return [*spec.argv, "--config", fence.engine_config_path] if options else list(spec.argv)


def log_secrets(config: Config, environ: Mapping[str, str] | None = None) -> list[str]:
    """Values the log scrubber hides besides the private options: passed variables named like secrets."""
    environ = os.environ if environ is None else environ
    return [
        environ[name]
        for name in config.engine.pass_env
        if SECRET_KEY_RE.search(name) and len(environ.get(name, "")) >= 4
    ]
