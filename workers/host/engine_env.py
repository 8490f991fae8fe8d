"""What an engine process gets from benchbot: the env its config names, and its API key in a private file.

The worker's own environment holds Slack tokens, ``REDIS_URL`` and the engine's key, and an engine
that inherited it would hand them to every plugin and crash dump. So the engine's env is built from
names only: the host's ``env``, its engine's and the presets' ``env``, and the variables its
engine's ``pass_env`` lists, copied from the worker (plus PATH/HOME-like basics the host side adds:
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

from workers.config import EngineConfig, HostConfig
from workers.host.simulated import sim_engine_env
from workers.host.transport import HostFence
from workers.presets import LaunchSpec
from workers.secrets import SECRET_KEY_RE


def engine_env(host: HostConfig, spec: LaunchSpec, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The engine's env: its ``pass_env`` from the worker, a simulated host's own state dir, then host env,
    then engine/preset env (wins)."""
    return {**_passed(host.engine, environ), **sim_engine_env(host, environ), **dict(host.env), **dict(spec.env)}


def _passed(engine: EngineConfig, environ: Mapping[str, str] | None) -> dict[str, str]:
    """The worker variables ``engine.pass_env`` names that the worker has."""
    environ = os.environ if environ is None else environ
    return {name: environ[name] for name in engine.pass_env if name in environ}


def private_options(engine: EngineConfig) -> dict[str, Any] | None:
    """Options that must not be on argv (the API key), for the engine's private ``--config`` file."""
    key = engine.api_key()
    return {"api-key": key} if key else None


def engine_argv(spec: LaunchSpec, fence: HostFence, options: Mapping[str, Any] | None) -> list[str]:
    """The argv to start: the spec's, plus ``--config PATH`` when there are private options."""
    return [*spec.argv, "--config", fence.engine_config_path] if options else list(spec.argv)


def log_secrets(engine: EngineConfig, environ: Mapping[str, str] | None = None) -> list[str]:
    """Values the log scrubber hides besides the private options: passed variables named like secrets."""
    environ = os.environ if environ is None else environ
    return [environ[name] for name in engine.pass_env if SECRET_KEY_RE.search(name) and len(environ.get(name, "")) >= 4]
