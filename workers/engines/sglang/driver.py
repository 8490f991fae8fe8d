"""SGLang behind the engine interface (:class:`workers.engines.interface.EngineDriver`).

A thin layer: the shared flow is the base class's; the data and the hooks come from the folder's modules
that do the work (``flags``, ``readiness``, ``diagnosis``, ``server_info``, ``observation``, ``profile``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from workers.engines import readiness as shared_readiness
from workers.engines.args import ArgValues, FlagValue
from workers.engines.contract import Contract
from workers.engines.interface import EngineDriver, ServerReport, ServerView
from workers.engines.profiling import ProfileCall
from workers.engines.sglang import diagnosis, flags, profile, readiness
from workers.engines.sglang.observation import config_fingerprint, describe_config, server_info, server_view
from workers.engines.sglang.server_info import parse_server_info


class SglangDriver(EngineDriver):
    """SGLang: ``/server_info`` says what runs, ``/health`` whether it serves yet; spec acceptance comes per
    request in ``meta_info``."""

    kind = "sglang"
    name = "SGLang"
    default_bench_api = "generate"
    observed_renames = flags.OBSERVED_RENAMES
    equivalent_values = flags.EQUIVALENT_VALUES
    env_hints = diagnosis.ENV_HINTS
    rules = diagnosis.RULES
    ready_line = readiness.READY_LINE
    smoke = readiness.SMOKE
    smoke_hint = diagnosis.SMOKE_HINT
    fit_hint = staticmethod(diagnosis.fit_hint)
    model_flag = "--model-path"

    def flag_key(self, flag: str) -> str:
        return flags.flag_to_arg(flag)

    def requested_args(self, given: Mapping[str, FlagValue], contract: Contract | None) -> ArgValues:
        return flags.requested_args(dict(given))

    def serve_args(self, argv: Sequence[str]) -> list[str]:
        return flags.server_argv(argv)

    def redact_argv(self, argv: Sequence[str]) -> list[str]:
        return flags.redact_argv(argv)

    async def report(
        self, base_url: str, api_key: str | None, timeout_s: float, argv: Sequence[str] | None
    ) -> ServerReport:
        # Both at once: SGLang's /health generates a token (about a second), /server_info is a read.
        (outcome, data, detail), (health, why) = await asyncio.gather(
            server_info(base_url, api_key, timeout_s), shared_readiness.health_status(base_url, api_key, timeout_s)
        )
        if outcome != "ok":
            return ServerReport(outcome, None, detail)
        view = server_view(parse_server_info(data))
        if health == 503:  # warming up (or shutting down): it answers, it does not serve yet
            return ServerReport(
                "warming",
                view,
                "warming up: /server_info answers, GET /health says 503",
            )
        if health != 200:
            return ServerReport("error", None, why or f"/server_info answers but GET /health: HTTP {health}")
        return ServerReport("ok", view, "")

    def fingerprint(self, view: ServerView) -> str:
        return config_fingerprint(view.args, view.model_path, view.version)

    def describe(self, view: ServerView, launch_args: ArgValues) -> str:
        return describe_config(view.args, launch_args, flags.contract_for(view.version))

    # spec_decode: none (the base's): SGLang reports spec_accept_length per request (meta_info), the bench
    # client reads it

    def profile_call(
        self, steps: int, profile_id: str, output_dir: str, launch_args: Mapping[str, object]
    ) -> ProfileCall:
        return profile.profile_call(steps, profile_id, output_dir)


DRIVER = SglangDriver()
