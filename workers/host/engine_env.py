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

An engine that takes some settings from a file only (its folder's ``settings_file``: TensorRT-LLM's LLM API
settings) gets them the same way. No server reports them back, so a file that holds no secret is kept
(``HostFence.engine_settings_path``) while the server runs, for the observation to read back, and removed
when benchbot stops it (:mod:`workers.host.engine_stop`). Settings beside an API key, or any setting named
like a secret, share the API key's file instead, and are removed with it: then they go unverified (the
observation says so) rather than leave a secret on disk.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from workers.config import EngineConfig, HostConfig
from workers.host.simulated import sim_engine_env
from workers.host.transport import HostFence
from workers.presets import LaunchSpec
from workers.secrets import SECRET_KEY_RE, is_secret_name


def engine_env(host: HostConfig, spec: LaunchSpec, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The engine's env: its ``pass_env`` from the worker, a simulated host's own state dir, then host env,
    then engine/preset env (wins)."""
    return {**_passed(host.engine, environ), **sim_engine_env(host, environ), **dict(host.env), **dict(spec.env)}


def _passed(engine: EngineConfig, environ: Mapping[str, str] | None) -> dict[str, str]:
    """The worker variables ``engine.pass_env`` names that the worker has."""
    environ = os.environ if environ is None else environ
    return {name: environ[name] for name in engine.pass_env if name in environ}


def _secret_settings(settings: Mapping[str, object]) -> bool:
    """True when a setting (at any depth) is named like a secret: such a file is never kept."""
    return any(
        is_secret_name(str(name)) or (isinstance(value, Mapping) and _secret_settings(value))
        for name, value in settings.items()
    )


def private_options(engine: EngineConfig, spec: LaunchSpec | None = None) -> dict[str, Any] | None:
    """Options that must not be on argv (the API key), for the engine's private ``--config`` file, removed once
    the engine has read it; the launch's settings join them when there is a key or a secret among them."""
    key = engine.api_key()
    settings = dict(spec.settings) if spec is not None else {}
    if settings and (key or _secret_settings(settings)):
        return {**settings, **({"api-key": key} if key else {})}
    return {"api-key": key} if key else None


def kept_settings(spec: LaunchSpec, private: Mapping[str, object] | None) -> dict[str, object] | None:
    """The launch's settings file when it holds no secret (kept while the server runs), else None."""
    return dict(spec.settings) if spec.settings and not private else None


def engine_argv(spec: LaunchSpec, fence: HostFence, options: Mapping[str, Any] | None) -> list[str]:
    """The argv to start: the spec's, plus ``--config PATH`` naming the private options' file, or the kept
    settings file when there are settings but no private options."""
    if options:
        return [*spec.argv, "--config", fence.engine_config_path]
    if spec.settings:
        return [*spec.argv, "--config", fence.engine_settings_path]
    return list(spec.argv)


def log_secrets(engine: EngineConfig, environ: Mapping[str, str] | None = None) -> list[str]:
    """Values the log scrubber hides besides the private options: passed variables named like secrets."""
    environ = os.environ if environ is None else environ
    return [environ[name] for name in engine.pass_env if SECRET_KEY_RE.search(name) and len(environ.get(name, "")) >= 4]
