"""TensorRT-LLM's ``trtllm-serve`` behind the engine interface (:class:`workers.engines.interface.EngineDriver`).

The pieces live beside it, one noun per module: :mod:`.flags` (its command line, the ``--config`` settings,
requested and observed args), :mod:`.readiness` (the wait and the smoke request), :mod:`.diagnosis` (its rules
on its recorded texts) and :mod:`.observation` (what the server reports, its fingerprint and label).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence

from workers.engines import diagnosis
from workers.engines.args import ArgValues, FlagValue, parse_argv
from workers.engines.contract import Contract
from workers.engines.interface import ServerReport, ServerView, SpecDecodeCounters
from workers.engines.profiling import ProfileCall
from workers.engines.readiness import ReadyResult, SmokeResult
from workers.engines.trtllm import flags, observation, processes, readiness
from workers.engines.trtllm.diagnosis import RULES, SMOKE_HINT
from workers.errors import BenchbotError
from workers.json_value import JsonObject


class TrtllmDriver:
    """TensorRT-LLM: ``trtllm-serve serve MODEL``; observation from argv, its ``--config`` file, ``/version`` and
    ``/v1/models``."""

    kind = processes.KIND
    name = "TensorRT-LLM"
    default_bench_api = "completions"  # the OpenAI APIs; no SGLang-style /generate
    observed_renames: Mapping[str, tuple[str, ...]] = {}  # args are read by the recorded options: its own names
    equivalent_values: Mapping[tuple[str, str, str], str] = {}
    env_hints: Mapping[str, str] = {}

    # ---- compiling a launch

    def fixed_flags(self, model: str, bind: str, port: int) -> list[tuple[str, FlagValue]]:
        return [("--host", bind), ("--port", str(port))]

    def positionals(self, model: str) -> list[str]:
        return [model]

    def flag_key(self, flag: str) -> str:
        return flags.flag_key(flag)

    def requested_args(self, given: Mapping[str, FlagValue], contract: Contract | None) -> ArgValues:
        return flags.requested_args(given, contract)

    # ---- reading a process

    def launch_args(self, argv: Sequence[str]) -> ArgValues:
        words = processes.serve_args(argv) or []
        args: JsonObject = dict(parse_argv(words))
        if words and not words[0].startswith("-"):
            args["--model"] = words[0]
        return args

    def redact_argv(self, argv: Sequence[str]) -> list[str]:
        return flags.redact_argv(argv)

    # ---- readiness

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
    ) -> ReadyResult | diagnosis.Diagnosis:
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
        return await readiness.smoke_test(base_url, api_key)

    def smoke_diagnosis(self, result: SmokeResult, log_text: str) -> diagnosis.Diagnosis:
        return diagnosis.smoke_diagnosis(result, log_text, rules=RULES, hint=SMOKE_HINT)

    def diagnose(
        self, log_text: str, *, exited: bool, timed_out: bool, contract: Contract | None
    ) -> diagnosis.Diagnosis:
        return diagnosis.diagnose(
            log_text,
            exited=exited,
            returncode=None,
            timed_out=timed_out,
            contract=contract,
            rules=RULES,
            engine=self.name,
        )

    # ---- observation

    async def report(
        self, base_url: str, api_key: str | None, timeout_s: float, argv: Sequence[str] | None
    ) -> ServerReport:
        return await observation.report(base_url, api_key, timeout_s, argv)

    def fingerprint(self, view: ServerView) -> str:
        return observation.fingerprint(view)

    def describe(self, view: ServerView, launch_args: ArgValues) -> str:
        return observation.describe(view)

    async def spec_decode(self, base_url: str, api_key: str | None) -> SpecDecodeCounters | None:
        # trtllm-serve's /metrics is a JSON list of iteration stats (drained as it is read), no counters
        return None

    def profile_call(
        self, steps: int, profile_id: str, output_dir: str, launch_args: Mapping[str, object]
    ) -> ProfileCall:
        raise BenchbotError(
            "trtllm-serve has no profiling endpoint: profile TensorRT-LLM with nsys around the server "
            "(TLLM_PROFILE_START_STOP) instead of profile="
        )


DRIVER = TrtllmDriver()
