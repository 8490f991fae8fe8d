"""TensorRT-LLM's ``trtllm-serve`` behind the engine interface (:class:`workers.engines.interface.EngineDriver`).

The pieces live beside it, one noun per module: :mod:`.flags` (its command line, the ``--config`` settings,
requested and observed args), :mod:`.readiness` (the wait and the smoke request), :mod:`.diagnosis` (its rules
on its recorded texts) and :mod:`.observation` (what the server reports, its fingerprint and label).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from workers.engines.args import ArgValues, FlagValue
from workers.engines.contract import Contract
from workers.engines.interface import EngineDriver, ServerReport, ServerView
from workers.engines.trtllm import flags, observation, processes, readiness
from workers.engines.trtllm.diagnosis import RULES, SMOKE_HINT


class TrtllmDriver(EngineDriver):
    """TensorRT-LLM: ``trtllm-serve serve MODEL``; observation from argv, its ``--config`` file, ``/version`` and
    ``/v1/models``."""

    kind = processes.KIND
    name = readiness.NAME
    default_bench_api = "completions"  # the OpenAI APIs; no SGLang-style /generate
    # observed_renames, equivalent_values, env_hints: none (the base's); args are read by the recorded options
    rules = RULES
    ready_line = readiness.READY_LINE
    smoke = readiness.SMOKE
    smoke_hint = SMOKE_HINT
    fingerprint_dropped_args = observation.FINGERPRINT_DROPPED_ARGS
    profile_refusal = (
        "trtllm-serve has no profiling endpoint: profile TensorRT-LLM with nsys around the server "
        "(TLLM_PROFILE_START_STOP) instead of profile="
    )

    # ---- compiling a launch, reading a process

    def flag_key(self, flag: str) -> str:
        return flags.flag_key(flag)

    def requested_args(self, given: Mapping[str, FlagValue], contract: Contract | None) -> ArgValues:
        return flags.requested_args(given, contract)

    def serve_args(self, argv: Sequence[str]) -> list[str] | None:
        return processes.serve_args(argv)

    def redact_argv(self, argv: Sequence[str]) -> list[str]:
        return flags.redact_argv(argv)

    # ---- observation

    async def report(
        self, base_url: str, api_key: str | None, timeout_s: float, argv: Sequence[str] | None
    ) -> ServerReport:
        return await observation.report(base_url, api_key, timeout_s, argv)

    # fingerprint: the base's, over the args read from the process and its ``--config`` file

    def describe(self, view: ServerView, launch_args: ArgValues) -> str:
        return observation.describe(view)

    # spec_decode: none (the base's): trtllm-serve's /metrics is a JSON list of iteration stats (drained as it
    # is read), no counters


DRIVER = TrtllmDriver()
