"""SGLang behind the engine interface (:class:`workers.engines.interface.EngineDriver`).

A thin layer: every call goes to the folder's modules that do the work (``flags``, ``readiness``,
``diagnosis``, ``server_info``, ``observation``, ``profile``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence

from workers.engines import readiness as shared_readiness
from workers.engines.args import ArgValues, FlagValue, parse_argv
from workers.engines.contract import Contract
from workers.engines.diagnosis import Diagnosis
from workers.engines.interface import ServerReport, ServerView, SpecDecodeCounters
from workers.engines.profiling import ProfileCall
from workers.engines.readiness import ReadyResult, SmokeResult
from workers.engines.sglang import diagnosis, flags, profile, readiness
from workers.engines.sglang.observation import config_fingerprint, describe_config, server_info, server_view
from workers.engines.sglang.server_info import parse_server_info


class SglangDriver:
    """SGLang: ``/server_info`` says what runs, ``/health`` whether it serves yet; spec acceptance comes per
    request in ``meta_info``."""

    kind = "sglang"
    name = "SGLang"
    default_bench_api = "generate"
    observed_renames = flags.OBSERVED_RENAMES
    equivalent_values = flags.EQUIVALENT_VALUES
    env_hints = diagnosis.ENV_HINTS

    def fixed_flags(self, model: str, bind: str, port: int) -> list[tuple[str, FlagValue]]:
        return [("--model-path", model), ("--host", bind), ("--port", str(port))]

    def positionals(self, model: str) -> list[str]:
        return []

    def flag_key(self, flag: str) -> str:
        return flags.flag_to_arg(flag)

    def requested_args(self, given: Mapping[str, FlagValue], contract: Contract | None) -> ArgValues:
        return flags.requested_args(dict(given))

    def launch_args(self, argv: Sequence[str]) -> ArgValues:
        return dict(parse_argv(flags.server_argv(argv)))

    def redact_argv(self, argv: Sequence[str]) -> list[str]:
        return flags.redact_argv(argv)

    async def wait_ready(
        self,
        base_url: str,
        *,
        deadline_s: float,
        is_alive: Callable[[], Awaitable[bool]],
        read_new_log: Callable[[], Awaitable[str]],
        api_key: str | None,
        gate: Callable[[], None] | None,
        foreign_listener: Callable[[], Awaitable[str | None]] | None,
        contract: Contract | None,
    ) -> ReadyResult | Diagnosis:
        return await readiness.wait_ready(
            base_url,
            deadline_s=deadline_s,
            is_alive=is_alive,
            read_new_log=read_new_log,
            api_key=api_key,
            gate=gate,
            foreign_listener=foreign_listener,
            contract=contract,
        )

    async def smoke_test(self, base_url: str, api_key: str | None) -> SmokeResult:
        return await readiness.smoke_test(base_url, api_key=api_key)

    def smoke_diagnosis(self, result: SmokeResult, log_text: str) -> Diagnosis:
        return diagnosis.smoke_diagnosis(result, log_text)

    def diagnose(self, log_text: str, *, exited: bool, timed_out: bool, contract: Contract | None) -> Diagnosis:
        return diagnosis.diagnose(log_text, exited=exited, returncode=None, timed_out=timed_out, contract=contract)

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

    async def spec_decode(self, base_url: str, api_key: str | None) -> SpecDecodeCounters | None:
        return None  # SGLang reports spec_accept_length per request (meta_info): the bench client reads it

    def profile_call(
        self, steps: int, profile_id: str, output_dir: str, launch_args: Mapping[str, object]
    ) -> ProfileCall:
        return profile.profile_call(steps, profile_id, output_dir)


DRIVER = SglangDriver()
