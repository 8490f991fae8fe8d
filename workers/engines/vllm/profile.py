"""vLLM's bounded profile: ``POST /start_profile`` with ``max_iterations``, on a server started to allow it.

Read from the vLLM 0.32 wheel the real tier installs (``entrypoints/serve/profile/api_router.py``,
``config/profiler.py``, ``v1/engine/async_llm.py``). The ``/start_profile`` and ``/stop_profile`` routes
are mounted only when the server was started with ``--profiler-config`` naming a profiler
(``{"profiler": "torch", "torch_profiler_dir": "/abs/dir"}``); otherwise they answer 404. The request
body may carry ``profile_prefix``, ``delay_iterations`` and ``max_iterations`` (0 means unlimited:
benchbot always sends a bound). Traces go to the server's ``torch_profiler_dir``, which a request cannot
change, named ``<profile_prefix>_<worker>...``; the prefix is 1-128 characters of ``[A-Za-z0-9._-]``
starting with a letter or digit. A session stays open until ``/stop_profile`` even after
``max_iterations``, so benchbot always sends it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from workers.engines.profiling import ProfileCall
from workers.errors import BenchbotError


def profiler_settings(launch_args: Mapping[str, object]) -> dict[str, object] | None:
    """The server's ``--profiler-config`` (JSON, or dotted ``--profiler-config.KEY``), None when absent."""
    settings: dict[str, object] = {}
    raw = launch_args.get("--profiler-config")
    if isinstance(raw, str):
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict):
            settings.update(parsed)
    elif isinstance(raw, Mapping):
        settings.update(raw)
    for flag, value in launch_args.items():
        if flag.startswith("--profiler-config."):
            settings[flag.removeprefix("--profiler-config.").replace("-", "_")] = value
    return settings or None


def profile_call(steps: int, profile_id: str, launch_args: Mapping[str, object]) -> ProfileCall:
    """``steps`` engine iterations, or a friendly refusal when the server cannot profile."""
    settings = profiler_settings(launch_args)
    if not settings or not settings.get("profiler"):
        raise BenchbotError(
            "this vLLM server was not started with a profiler, so it has no /start_profile: launch it with "
            '--profiler-config \'{"profiler": "torch", "torch_profiler_dir": "/abs/dir"}\' (a preset flag) '
            "and bench again with profile="
        )
    trace_dir = settings.get("torch_profiler_dir") or None
    return ProfileCall(
        start_path="/start_profile",
        start_body={"max_iterations": steps, "profile_prefix": profile_id},
        stop_path="/stop_profile",
        trace_dir=str(trace_dir) if trace_dir else None,
        file_prefix=profile_id,
    )
