"""SGLang engine knowledge: flag names, readiness, log diagnosis, smoke generation, server_info parsing.

Everything here is about *one* engine and is pure or talks HTTP only; process and host access live in
``workers.host.transport`` and are handed in as callables, so this module can be tested against plain HTTP
servers and reused over SSH. Facts come from ``shared/reference/sglang.md`` (sections cited inline).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import math
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from workers import secrets
from workers.engines.contract import Contract, all_contracts
from workers.secrets import is_secret_name, redact, redact_text

# ---------------------------------------------------------------------------------------------------------
# Flags and args
# ---------------------------------------------------------------------------------------------------------

#: Args that newer SGLang versions store under another name; the diff looks there when the old name
#: is missing from the observed args (reference §2.6, §2.9).
OBSERVED_RENAMES: dict[str, tuple[str, ...]] = {
    "mamba_scheduler_strategy": ("mamba_radix_cache_strategy",),
    "mamba_radix_cache_strategy": ("mamba_scheduler_strategy",),
    "cuda_graph_max_bs": ("cuda_graph_max_bs_decode",),
    "stream_output": ("incremental_streaming_output",),
}


def _dashed(flag: str) -> str:
    return "--" + flag.strip().split("=", 1)[0].lstrip("-")


@functools.lru_cache(maxsize=4096)
def _recorded_arg(dashed: str) -> str | None:
    """What the newest recorded SGLang that accepts ``dashed`` (exactly or as a unique prefix) stores it as."""
    for contract in reversed(all_contracts("sglang")):
        if contract.resolve(dashed).ok:
            return contract.server_arg(dashed)
    return None


def flag_to_arg(flag: str, contract: Contract | None = None) -> str:
    """Map an SGLang CLI flag (``--tp``, ``--fp4-gemm-backend``) to the key ``/server_info`` reports it under.

    The recorded contracts answer, as SGLang's own parser would: ``contract`` (the host's version) when
    given, else the newest recorded version that accepts the flag. Only a flag no recorded version
    accepts (unknown, or an ambiguous prefix SGLang rejects) falls back to dashes -> underscores.
    ``--foo=bar`` is accepted (the value is ignored); a bare ``foo_bar`` is returned unchanged so the
    function is idempotent on already-mapped names.
    """
    name = flag.strip().split("=", 1)[0]
    if not name.startswith("-"):
        return name.replace("-", "_")
    dashed = _dashed(name)
    if contract is not None:
        found = contract.server_arg(dashed)
        if found is not None:
            return found
    return _recorded_arg(dashed) or dashed[2:].replace("-", "_")


_INT_RE = re.compile(r"^[+-]?\d+$")
_FLOAT_RE = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+(\.\d*)?[eE][+-]?\d+)$")


def coerce_value(value: Any) -> Any:
    """Turn a CLI string into what argparse would have stored (int, float, bool, None, or the string).

    Lists are coerced element-wise (``nargs='+'`` flags). Strings that only look like other types stay
    strings when they are not numbers: argparse never turns ``"true"`` into a bool, but SGLang's JSON
    reports real bools, so ``"true"``/``"false"`` are accepted as bools here to compare both sides fairly.
    """
    if isinstance(value, (list, tuple)):
        return [coerce_value(v) for v in value]
    if not isinstance(value, str):
        return value
    text = value.strip()
    if _INT_RE.match(text):
        return int(text)
    if _FLOAT_RE.match(text):
        return float(text)
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    return text


def requested_args(flags: Mapping[str, str | bool | list[str]], contract: Contract | None = None) -> dict[str, Any]:
    """Flags as given by a person or a preset (``{"--tp": "8", "--enable-metrics": True}``) -> server args.

    ``True`` marks a store_true flag that is present; ``False`` one that is explicitly absent (the
    server should report ``False``). Later flags win, like argparse. ``contract`` is the host's SGLang
    version when known (see :func:`flag_to_arg`).
    """
    out: dict[str, Any] = {}
    for flag, value in flags.items():
        out[flag_to_arg(flag, contract)] = value if isinstance(value, bool) else coerce_value(value)
    return out


def parse_argv(argv: Iterable[str]) -> dict[str, str | bool | list[str]]:
    """Split a launch command line into ``{flag: value}``: tokens before the first ``--flag`` are dropped.

    A flag followed by another flag (or nothing) is a store_true flag (``True``); a flag followed by
    several plain tokens gets the list (``--cuda-graph-bs 1 2 4``). Used to read the argv of a process
    we did not start, never to decide what the server runs (``/server_info`` does that).
    """
    out: dict[str, str | bool | list[str]] = {}
    current: str | None = None
    values: list[str] = []

    def close() -> None:
        if current is not None:
            out[current] = True if not values else (values[0] if len(values) == 1 else list(values))

    for token in argv:
        if token.startswith("--") and len(token) > 2:
            close()
            values = []
            if "=" in token:
                name, val = token.split("=", 1)
                current = name
                values.append(val)
            else:
                current = token
        elif current is not None:
            values.append(token)
    close()
    return out


def is_secret_flag(flag: str) -> bool:
    """Does this flag (``--api-key``, or an abbreviation SGLang accepts like ``--api-k``) carry a secret?"""
    return is_secret_name(flag_to_arg(flag))


def redact_argv(argv: Iterable[str]) -> list[str]:
    """argv with the value after a secret flag (``--api-key K``, ``--api-k=K``) replaced: the secret policy
    (:func:`workers.secrets.redact_argv`) with SGLang's flag abbreviations resolved."""
    return secrets.redact_argv(argv, is_secret_flag=is_secret_flag)


# ---------------------------------------------------------------------------------------------------------
# Requested vs observed
# ---------------------------------------------------------------------------------------------------------

#: Values SGLang rewrites on purpose; (arg, requested, observed) -> why they are the same thing.
EQUIVALENT_VALUES: dict[tuple[str, str, str], str] = {
    ("speculative_algorithm", "NEXTN", "EAGLE"): "SGLang renames NEXTN to EAGLE internally",
}

#: Args that can never be compared (secrets, or things each start chooses).
UNCOMPARABLE_ARGS = frozenset({"api_key", "admin_api_key"})


@dataclass(frozen=True)
class ArgDiff:
    """One requested arg whose observed value differs (``observed`` is None when the server lacks it)."""

    arg: str
    requested: Any
    observed: Any
    note: str = ""


@dataclass(frozen=True)
class ArgComparison:
    """Result of comparing what was asked for with what the server says it runs."""

    diffs: list[ArgDiff] = field(default_factory=list)
    #: Human notes about values treated as equal though they are spelled differently (NEXTN vs EAGLE).
    notes: list[str] = field(default_factory=list)


def _values_equal(a: Any, b: Any) -> bool:
    a, b = coerce_value(a), coerce_value(b)
    if isinstance(a, bool) or isinstance(b, bool):
        # An absent store_true flag is reported as False or None depending on the version.
        return (False if a is None else a) == (False if b is None else b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_values_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, list) and len(a) == 1:
        return _values_equal(a[0], b)
    return a == b


def compare_arg(arg: str, requested: Any, observed: Any) -> tuple[bool, str]:
    """Is ``observed`` what ``requested`` asked for? Returns (equal, note); note explains equivalences."""
    if _values_equal(requested, observed):
        return True, ""
    if isinstance(requested, str) and isinstance(observed, str):
        why = EQUIVALENT_VALUES.get((arg, requested.upper(), observed.upper()))
        if why:
            return True, f"{arg}: requested {requested}, server reports {observed} ({why}); treated as equal"
        if requested.lower() == "auto":
            return True, f"{arg}: requested auto, server resolved it to {observed}"
    return False, ""


def compare_requested(requested: Mapping[str, Any], observed_args: Mapping[str, Any]) -> ArgComparison:
    """Compare only over the requested keys; a requested arg the server does not report is a diff.

    A missing key is not assumed to be fine: we only vouch for what the server told us.
    """
    diffs: list[ArgDiff] = []
    notes: list[str] = []
    for arg, want in requested.items():
        if arg in UNCOMPARABLE_ARGS:
            continue
        key = arg
        if key not in observed_args:
            key = next((k for k in OBSERVED_RENAMES.get(arg, ()) if k in observed_args), arg)
        if key not in observed_args:
            diffs.append(ArgDiff(arg, want, None, "not reported by the server"))
            continue
        got = observed_args[key]
        equal, note = compare_arg(arg, want, got)
        if equal:
            if note:
                notes.append(note)
        else:
            diffs.append(ArgDiff(arg, want, got, note))
    return ArgComparison(diffs, notes)


# ---------------------------------------------------------------------------------------------------------
# server_info
# ---------------------------------------------------------------------------------------------------------

#: Top-level ``/server_info`` keys that are not launch args (reference §1.2, both shapes).
NON_ARG_KEYS = frozenset(
    {
        "version",
        "internal_states",
        "status",
        "max_total_num_tokens",
        "max_req_input_len",
        "launch_command",
        "kv_events",
        "startup_time",
        "frontend",
        "server_args",
        "sim",  # benchbot's simulator reports its own settings here
    }
)
#: Non-arg top-level keys that describe the running server; they go to ``ServerInfo.internal``.
_INTERNAL_TOP_KEYS = ("max_total_num_tokens", "max_req_input_len", "status", "startup_time", "kv_events", "sim")


@dataclass(frozen=True)
class ServerInfo:
    """``GET /server_info`` split into launch ``args`` and what the scheduler reports (``internal``)."""

    version: str | None
    args: dict[str, Any]
    internal: dict[str, Any]
    launch_command: str | None = None


def parse_server_info(data: Mapping[str, Any]) -> ServerInfo:
    """Parse both known shapes: 0.5.9's flat object and 0.5.23's resolved args plus extras.

    ``internal`` holds scheduler facts: ``internal_states[0]`` minus the args it repeats, plus the
    top-level non-arg keys (``max_total_num_tokens``, ``status``, ``startup_time``, the simulator's
    ``sim``...). Secrets are redacted.
    """
    if not isinstance(data, Mapping):
        raise ValueError("server_info is not a JSON object")
    nested = data.get("server_args")
    source: Mapping[str, Any] = nested if isinstance(nested, Mapping) else data
    args = {k: v for k, v in source.items() if k not in NON_ARG_KEYS}
    states = data.get("internal_states")
    internal: dict[str, Any] = {}
    if isinstance(states, list) and states and isinstance(states[0], Mapping):
        internal = {k: v for k, v in states[0].items() if k not in args}
        if len(states) > 1:
            internal["dp_ranks"] = len(states)
    elif isinstance(states, Mapping):
        internal = {k: v for k, v in states.items() if k not in args}
    for key in _INTERNAL_TOP_KEYS:
        if key in data and key not in internal:
            internal[key] = data[key]
    launch = data.get("launch_command")
    version = data.get("version")
    return ServerInfo(
        version=str(version) if version is not None else None,
        args=redact(args),
        internal=redact(internal),
        launch_command=redact_text(launch) if isinstance(launch, str) else None,
    )


def looks_like_sglang(data: Any) -> bool:
    """A cheap check that a JSON answer on ``/server_info`` came from SGLang and not some other server."""
    if not isinstance(data, Mapping):
        return False
    source = data.get("server_args") if isinstance(data.get("server_args"), Mapping) else data
    return "version" in data and any(k in source for k in ("model_path", "tp_size"))


# ---------------------------------------------------------------------------------------------------------
# Log diagnosis
# ---------------------------------------------------------------------------------------------------------

CATEGORIES = (
    "oom",
    "assertion",
    "unsupported_gpu",
    "port_in_use",
    "config_error",
    "garbage_output",
    "timeout",
    "crashed",
)


@dataclass(frozen=True)
class Rule:
    """One known failure: a regex, its category, a one-sentence summary with the fix.

    ``summary`` may use ``{name}`` for named groups of ``pattern``. ``fatal`` rules end a readiness
    wait at once; non-fatal ones (generic exceptions, warnings SGLang survives) only explain a process
    that already died. ``texts`` names the recorded texts (``contracts/*.json``, key ``texts``) the
    rule is for: tests match every rule against the real text of each version that prints it.
    """

    pattern: re.Pattern[str]
    category: str
    summary: str
    fatal: bool = True
    texts: tuple[str, ...] = ()


def _r(pattern: str, category: str, summary: str, *texts: str, fatal: bool = True) -> Rule:
    return Rule(re.compile(pattern), category, summary, fatal, texts)


#: Ordered most specific first: the first rule that matches anywhere in the log wins, so a traceback
#: under "Scheduler hit an exception" is explained by its cause (OOM, ...) rather than the wrapper.
#: Every pattern is written against a text recorded from the real wheels (FlashInfer's and PyTorch's
#: from the versions each SGLang pins); see ``tools/sglang_texts.py``.
RULES: tuple[Rule, ...] = (
    # GPU support. FlashInfer's backend check (flashinfer/utils.py): "mm_fp4 does not support backend
    # 'trtllm' with capability 120" for --fp4-gemm-backend flashinfer_trtllm on SM120.
    _r(
        r"(?P<func>\w+) does not support backend '(?P<backend>[\w-]+)' with capability (?P<cc>\d+)",
        "unsupported_gpu",
        "FlashInfer's {func} has no '{backend}' kernels for compute capability {cc}; choose another backend "
        "(for the FP4 GEMM on SM120: --fp4-gemm-backend flashinfer_cudnn or flashinfer_cutlass).",
        "flashinfer_backend_unsupported",
    ),
    # The trtllm-gen MoE (--moe-runner-backend flashinfer_trtllm) is built for SM100 only: on SM120 its
    # JIT build finds no target ("No supported CUDA architectures found for major versions [10].", FlashInfer
    # 0.6.3), or, built anyway, its launcher's architecture check fails.
    _r(
        r"No supported CUDA architectures found for major versions (?P<majors>\[[\d, ]*\])"
        r"|MoE kernel requires (?:SM )?10\.x (?:or SM 12\.x )?architecture",
        "unsupported_gpu",
        "A FlashInfer kernel this launch chose (the trtllm-gen MoE) is built for SM100-class GPUs only, not "
        "this one; use --moe-runner-backend flashinfer_cutlass (or cutlass).",
        "flashinfer_no_arch",
        "flashinfer_moe_arch_check",
    ),
    _r(
        r"TRTLLM (?P<which>M[LH]A) backend (?:for (?:prefill|decode) )?(?:is only supported on|requires) "
        r"(?P<gpus>[^\n]*?GPUs(?: \([^)\n]*\))?)",
        "unsupported_gpu",
        "This SGLang runs the TRTLLM {which} attention backend only on {gpus}; use --attention-backend "
        "flashinfer or triton here.",
        "trtllm_mha_sm100",
        "trtllm_mla_blackwell",
        "trtllm_mha_prefill_gpu",
        "trtllm_mha_decode_gpu",
    ),
    _r(
        r"Current platform does not support NVFP4 quantization",
        "unsupported_gpu",
        "NVFP4 checkpoints need a Blackwell GPU; use an FP8 or BF16 checkpoint on this host.",
        "nvfp4_unsupported_platform",
    ),
    _r(
        r"no kernel image is available for execution on the device",
        "unsupported_gpu",
        "A kernel was not built for this GPU architecture; choose another backend (on SM120 avoid the trtllm ones).",
        "cuda_no_kernel_image",
    ),
    # NaN / garbage. Raised, NaN ends the server; logged as a warning, SGLang replaces the NaN and goes
    # on (see the non-fatal rule at the end).
    _r(
        r"probability tensor contains either\W+inf\W+nan",
        "garbage_output",
        "The model produced NaN/inf probabilities (on SM120 the FlashInfer CUTLASS FP4 GEMM race); use "
        "--fp4-gemm-backend flashinfer_cudnn.",
        "torch_probability_nan",
    ),
    _r(
        r"ValueError: Detected errors during sampling! NaN in the logits|NaN detected! ",
        "garbage_output",
        "SGLang stopped on NaN in the logits, so outputs would be garbage; try --fp4-gemm-backend "
        "flashinfer_cudnn or another MoE backend.",
        "nan_in_logits_raised",
        "nan_detected_async",
    ),
    # Flag combinations SGLang rejects (reference §2.5, §2.6)
    _r(
        r"Spec v2 currently only supports topk = 1",
        "config_error",
        "Spec v2 (SGLANG_ENABLE_SPEC_V2=1) only supports --speculative-eagle-topk 1; set topk to 1 or turn "
        "spec v2 off.",
        "spec_v2_topk",
    ),
    _r(
        r"not compatible with radix cache when using --mamba-scheduler-strategy no_buffer",
        "config_error",
        "Speculative decoding on this hybrid model needs --mamba-scheduler-strategy extra_buffer with "
        "SGLANG_ENABLE_SPEC_V2=1, or --disable-radix-cache.",
        "mamba_radix_no_buffer_spec",
    ),
    _r(
        r"mamba_track_interval \d+ must be greater than or equal to speculative_num_draft"
        r"|assert view\.mamba_track_interval >= view\.speculative_num_draft_tokens",
        "config_error",
        "--mamba-track-interval must be at least --speculative-num-draft-tokens; raise it or draft fewer tokens.",
        "mamba_track_interval_draft",
    ),
    _r(
        r"mamba_track_interval \d+ must be divisible by page_size"
        r"|assert view\.mamba_track_interval % view\.page_size == 0",
        "config_error",
        "--mamba-track-interval must be a multiple of --page-size; change one of them.",
        "mamba_track_interval_page",
    ),
    _r(
        r"apply_router_weight_on_input is not supported for Flashinfer",
        "assertion",
        "The FlashInfer MoE runner cannot apply router weights on input for this model; use "
        "--moe-runner-backend cutlass or triton.",
        "flashinfer_router_weight",
    ),
    # Memory (reference §4)
    _r(
        r"Not enough memory\. Please try to increase --mem-fraction-static",
        "oom",
        "No GPU memory was left for the KV cache after loading the weights; raise --mem-fraction-static "
        "or spread the model over more GPUs (--tp-size).",
        "kv_pool_too_small",
    ),
    _r(
        r"Capture cuda graph failed",
        "oom",
        "CUDA graph capture ran out of memory; lower --mem-fraction-static (e.g. 0.8) or --cuda-graph-max-bs "
        "(e.g. 16).",
        "cuda_graph_capture_failed",
    ),
    _r(
        r"CUDA out of memory|OutOfMemoryError|(?:Prefill|Decode) out of memory",
        "oom",
        "The GPU ran out of memory; lower --mem-fraction-static, --cuda-graph-max-bs or "
        "--max-running-requests, or use more GPUs (NEXTN on SGLang <= 0.5.10 also needs "
        "SGLANG_ENABLE_SPEC_V2=1).",
        "torch_cuda_oom",
        "torch_oom_error",
        "prefill_oom",
        "decode_oom",
    ),
    # Port. The HTTP port: uvicorn logs uvloop's OSError and exits. SGLang's own "port N is in use.
    # Waiting ..." lines are about internal ports and recoverable; only the end of that wait is fatal.
    _r(
        r"\[Errno 98\] (?:error while attempting to bind on address (?P<addr>\([^)\n]*\)): )?"
        r"(?i:address already in use)",
        "port_in_use",
        "Another process already listens on the engine's HTTP port; stop it (/stop stops an engine) or give "
        "the host another port in benchbot.toml.",
        "http_port_in_use",
        "http_port_in_use_reuseport",
    ),
    _r(
        r"(?P<name>\w+) at (?P<port>\d+) is not available in \d+ seconds",
        "port_in_use",
        "SGLang's internal {name} port {port} (derived from the HTTP port) stayed busy: an engine that is "
        "still shutting down, or another server, holds it; wait a minute and relaunch, or /stop what runs "
        "there.",
        "internal_port_timeout",
    ),
    # argparse and other rejected settings
    _r(
        r"unrecognized arguments: (?P<args>.+)",
        "config_error",
        "This SGLang version does not know {args}; check the flag names with --help (several were renamed in 0.5.15+).",
        "argparse_unrecognized",
    ),
    _r(
        r"error: (?P<msg>(?:argument|ambiguous option|the following arguments)[^\n]+)",
        "config_error",
        "SGLang rejected the command line: {msg}.",
        "argparse_ambiguous",
        "argparse_invalid_choice",
        "argparse_expected_one",
        "argparse_invalid_int",
        "argparse_required",
    ),
    _r(
        r"invalid device ordinal",
        "config_error",
        "The launch asks for more GPUs than this host shows (--tp-size x --pp-size, --base-gpu-id); lower "
        "--tp-size or fix CUDA_VISIBLE_DEVICES.",
        "cuda_invalid_device",
    ),
    # Generic assertions and crashes (least specific last)
    _r(
        r"device-side assert triggered|Assertion `.*` failed|Assertion '.*' failed",
        "assertion",
        "A CUDA kernel assertion fired (often NaN from an FP4 GEMM); try --fp4-gemm-backend flashinfer_cudnn "
        "and see the evidence line.",
        "cuda_device_assert",
        "cuda_assertion_failed",
    ),
    _r(
        r"AssertionError",
        "assertion",
        "SGLang stopped on a failed assertion, usually flags that cannot be combined (e.g. only some of the "
        "--speculative-* values set); see the evidence line.",
        "assert_example",
        fatal=False,
    ),
    _r(
        r"ValueError: (?P<msg>[^\n]+)",
        "config_error",
        "SGLang rejected the launch settings ({msg}); change the flags it names.",
        "value_error_example",
        fatal=False,
    ),
    _r(
        r"Scheduler hit an exception",
        "crashed",
        "The SGLang scheduler crashed; the log tail shows the exception.",
        "scheduler_exception",
    ),
    _r(
        r"Received sigquit from a child process",
        "crashed",
        "An SGLang worker process died and took the server down; the log tail shows why.",
        "child_sigquit",
    ),
    # A warning SGLang survives (it replaces the NaN): it never ends a wait, but it explains garbage
    # output or a process that died with nothing more specific in its log.
    _r(
        r"Detected errors during sampling! NaN in the logits|NaN detected in .*values were sanitized",
        "garbage_output",
        "SGLang saw NaN in the logits (and replaced it), so outputs may be garbage; try --fp4-gemm-backend "
        "flashinfer_cudnn or another MoE backend.",
        "nan_in_logits",
        "nan_sanitized_warning",
        fatal=False,
    ),
)

#: Recorded texts SGLang logs and survives: none of them may end a readiness wait.
BENIGN_TEXTS: tuple[str, ...] = (
    "ready",
    "nan_in_logits",
    "nan_sanitized_warning",
    "internal_port_wait",
    "internal_port_owner_unknown",
    "internal_port_next",
    "kv_pool_full_retract",
    "moe_auto_sm120_info",
    "spec_max_running_reset",
)

#: Flags that newer SGLang versions renamed; a diagnosis for such a host names the flag it accepts.
FLAG_RENAMES: dict[str, tuple[str, ...]] = {
    "--cuda-graph-max-bs": ("--cuda-graph-max-bs-decode",),
    "--mamba-scheduler-strategy": ("--mamba-radix-cache-strategy",),
}

#: Printed once warmup is done (reference §1; recorded as ``ready`` in every contract).
READY_LINE = "The server is fired up and ready to roll!"
LOG_TAIL_LINES = 40
_EXCEPTION_LINE_RE = re.compile(r"^\s*(?:[\w.]+\.)?\w*(?:Error|Exception)\b")


@dataclass(frozen=True)
class Diagnosis:
    """Why an engine is not usable, in words a person can act on, plus the evidence."""

    category: str
    summary: str
    evidence_line: str
    log_tail: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _line_at(text: str, pos: int) -> str:
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    return text[start : end if end >= 0 else len(text)].strip()


def _tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])


def _clip(line: str, limit: int = 300) -> str:
    return line if len(line) <= limit else line[: limit - 1] + "…"


def match_rule(text: str, *, fatal_only: bool = False) -> tuple[Rule, re.Match[str]] | None:
    """The first rule (table order) that matches anywhere in ``text``."""
    for rule in RULES:
        if fatal_only and not rule.fatal:
            continue
        m = rule.pattern.search(text)
        if m:
            return rule, m
    return None


#: A flag named in a hint (``--speculative-*`` names a family, not a flag).
SUMMARY_FLAG_RE = re.compile(r"--[a-z0-9][a-z0-9-]*[a-z0-9](?![-*\w])")


def flags_for_version(summary: str, contract: Contract | None) -> str:
    """Name, in a hint, the flags this SGLang version accepts: ``--cuda-graph-max-bs`` is ambiguous in
    0.5.23, whose hint says ``--cuda-graph-max-bs-decode`` (see :data:`FLAG_RENAMES`)."""
    if contract is None:
        return summary

    def fix(m: re.Match[str]) -> str:
        flag = m.group(0)
        if contract.resolve(flag).kind == "exact":
            return flag
        return next((new for new in FLAG_RENAMES.get(flag, ()) if contract.resolve(new).kind == "exact"), flag)

    return SUMMARY_FLAG_RE.sub(fix, summary)


def _format_summary(rule: Rule, m: re.Match[str], contract: Contract | None = None) -> str:
    groups = {k: _clip((v or "").strip().rstrip("."), 120) for k, v in m.groupdict().items()}
    return redact_text(flags_for_version(rule.summary.format(**groups), contract))


def diagnose(
    log_text: str, *, exited: bool, returncode: int | None, timed_out: bool, contract: Contract | None = None
) -> Diagnosis:
    """Explain a failed or stuck start from its log.

    Known rules win (a fatal one always; a generic one only when the process is gone). Otherwise a
    dead process is ``crashed`` with its last exception line, and a live one past its deadline is
    ``timeout``. Secrets are redacted from everything returned. With the host's ``contract`` the
    hints name the flags that version accepts.
    """
    text = log_text or ""
    tail = redact_text(_tail(text))
    found = match_rule(text, fatal_only=not exited)
    if found:
        rule, m = found
        evidence = redact_text(_clip(_line_at(text, m.start())))
        return Diagnosis(rule.category, _format_summary(rule, m, contract), evidence, tail)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    if exited:
        exc = next((ln for ln in reversed(lines) if _EXCEPTION_LINE_RE.match(ln)), last)
        if returncode in (-9, 137):
            how = "was killed (SIGKILL, possibly the host's out-of-memory killer)"
        elif returncode is None:
            how = "exited"
        else:
            how = f"exited with code {returncode}"
        summary = f"SGLang {how} without a known error; read the evidence line and the log tail."
        return Diagnosis("crashed", summary, redact_text(_clip(exc)), tail)
    if timed_out:
        return Diagnosis(
            "timeout",
            "SGLang did not become healthy before the deadline; the log tail shows how far start-up got "
            "(big models may just need a longer deadline).",
            redact_text(_clip(last)),
            tail,
        )
    return Diagnosis("crashed", "No known failure pattern in the log.", redact_text(_clip(last)), tail)


# ---------------------------------------------------------------------------------------------------------
# Readiness
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReadyResult:
    """The server answered ``GET /health`` with 200."""

    elapsed_s: float
    health_polls: int
    saw_ready_line: bool


def auth_headers(api_key: str | None) -> dict[str, str]:
    """``Authorization: Bearer`` when the server was started with ``--api-key`` (reference §1)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


#: Keep at most this much log text in memory while waiting (a long start-up can log a lot).
_MAX_LOG_CHARS = 512_000
#: After a fatal line, keep reading this long so the whole traceback is in the diagnosis.
_FATAL_GRACE_S = 1.0


async def wait_ready(
    base_url: str,
    *,
    deadline_s: float,
    is_alive: Callable[[], Awaitable[bool]],
    read_new_log: Callable[[], Awaitable[str]],
    api_key: str | None = None,
    poll_s: float = 0.5,
    gate: Callable[[], None] | None = None,
    foreign_listener: Callable[[], Awaitable[str | None]] | None = None,
    contract: Contract | None = None,
) -> ReadyResult | Diagnosis:
    """Wait until ``/health`` answers 200, or return a :class:`Diagnosis` as soon as start-up has failed.

    Each round: read the new log text (a fatal line ends the wait at once), check the process is alive
    (a dead one ends it at once), then probe ``/health`` (503 or no connection means still starting).
    The deadline ends the wait with a ``timeout`` diagnosis. ``gate()`` runs before each probe (a job's
    fence check). A 200 counts only if ``foreign_listener()`` returns None: it names the process that
    listens on the port when that is not the one we started, and a 200 from someone else is a
    ``port_in_use`` diagnosis, never readiness.
    """
    poll_s = min(max(poll_s, 0.01), 0.5)
    started = time.monotonic()
    deadline = started + deadline_s
    log = ""
    polls = 0
    saw_ready = False

    async def drain() -> None:
        nonlocal log, saw_ready
        try:
            new = await read_new_log()
        except FileNotFoundError:
            new = ""  # the log file is created by the launch; it may not exist for a moment
        if new:
            log = (log + new)[-_MAX_LOG_CHARS:]
            saw_ready = saw_ready or READY_LINE in log

    async def finish_fatal() -> Diagnosis:
        # The line that names the failure often comes a moment after the wrapper line; collect it.
        grace_end = time.monotonic() + _FATAL_GRACE_S
        quiet = 0
        while time.monotonic() < grace_end and quiet < 3:
            await asyncio.sleep(0.1)
            before = len(log)
            await drain()
            quiet = quiet + 1 if len(log) == before else 0
            if quiet and not await is_alive():
                break
        alive = await is_alive()
        return diagnose(log, exited=not alive, returncode=None, timed_out=False, contract=contract)

    url = base_url.rstrip("/") + "/health"
    probe: asyncio.Task[httpx.Response] | None = None
    async with httpx.AsyncClient(headers=auth_headers(api_key)) as client:
        try:
            while True:
                round_start = time.monotonic()
                await drain()
                if match_rule(log, fatal_only=True):
                    return await finish_fatal()
                if not await is_alive():
                    await drain()
                    return diagnose(log, exited=True, returncode=None, timed_out=False, contract=contract)
                remaining = deadline - round_start
                if remaining <= 0:
                    return diagnose(log, exited=False, returncode=None, timed_out=True, contract=contract)
                if probe is None:
                    # The probe runs beside the log/process checks: a port that accepts but never answers
                    # must not delay a diagnosis the log already gives.
                    if gate is not None:
                        gate()
                    polls += 1
                    probe = asyncio.create_task(client.get(url, timeout=max(0.2, min(5.0, remaining))))
                await asyncio.wait({probe}, timeout=min(poll_s, remaining))
                if not probe.done():
                    continue
                try:
                    if probe.result().status_code == 200:
                        await drain()  # pick up the ready line if it is already written
                        other = await foreign_listener() if foreign_listener is not None else None
                        if other is not None:
                            return foreign_answer_diagnosis(other, log)
                        return ReadyResult(round(time.monotonic() - started, 3), polls, saw_ready)
                except httpx.HTTPError:
                    pass  # not listening yet (503 or refused): keep waiting
                finally:
                    probe = None
                await asyncio.sleep(max(0.0, min(round_start + poll_s, deadline) - time.monotonic()))
        finally:
            if probe is not None and not probe.done():
                probe.cancel()
                await asyncio.wait({probe})


def foreign_answer_diagnosis(who: str, log_text: str) -> Diagnosis:
    """``/health`` answered 200, but from a process that is not the server this launch started."""
    summary = (
        f"{who} answers on the server's port, not the server this launch started, so the launch is "
        "not ready; benchbot stopped what it started and left that process alone. Stop it (or "
        "/stop if it is an engine) and launch again."
    )
    return Diagnosis("port_in_use", summary, f"GET /health answered 200 from {who}", redact_text(_tail(log_text)))


# ---------------------------------------------------------------------------------------------------------
# Smoke generation
# ---------------------------------------------------------------------------------------------------------

SMOKE_PROMPT = "The capital of France is"


@dataclass(frozen=True)
class SmokeResult:
    """One greedy generation: ``ok`` only when the output looks like language."""

    ok: bool
    text: str
    completion_tokens: int | None
    reason: str


def is_garbage(text: str) -> str | None:
    """Why ``text`` is not a plausible completion, or None when it looks fine.

    Catches the seed's ``!!!!`` (argmax of NaN logits is token 0, ``!`` in Qwen's vocabulary), other
    long runs of one character (``++++++++``), one word repeated (`` the the the ...``), U+FFFD from
    broken byte sequences, control-character soup, and empty output.
    """
    if not text or not text.strip():
        return "the output is empty"
    if "\ufffd" in text:
        return "the output contains U+FFFD replacement characters (broken token bytes)"
    dense = "".join(text.split())
    if set(dense) == {"!"}:
        return "the output is only '!' (the NaN signature: argmax of NaN logits is token 0, '!')"
    if len(dense) >= 4 and len(set(dense)) == 1:
        return f"the output is one character repeated ({dense[0]!r} x{len(dense)})"
    longest, run = 1, 1
    for prev, cur in itertools.pairwise(dense):
        run = run + 1 if cur == prev else 1
        longest = max(longest, run)
    if longest >= 8 and longest * 2 >= len(dense):
        return f"the output is mostly one repeated character ({longest} in a row)"
    words = text.split()
    if len(words) >= 8:
        word, count = collections.Counter(words).most_common(1)[0]
        if count * 10 >= len(words) * 9:
            return f"the output is one word repeated ({word!r} x{count})"
    controls = sum(1 for ch in text if ord(ch) < 32 and ch not in "\n\r\t")
    if controls * 10 > len(text):
        return "the output is mostly control characters"
    return None


async def smoke_test(base_url: str, api_key: str | None = None, *, timeout_s: float = 120.0) -> SmokeResult:
    """Greedy 16-token ``POST /generate`` of "The capital of France is" (reference §6 step 2).

    Rejects transport errors, empty or garbage text and ``completion_tokens`` of 0 or missing.
    """
    payload = {"text": SMOKE_PROMPT, "sampling_params": {"max_new_tokens": 16, "temperature": 0}}
    url = base_url.rstrip("/") + "/generate"
    try:
        async with httpx.AsyncClient(headers=auth_headers(api_key)) as client:
            resp = await client.post(url, json=payload, timeout=timeout_s)
    except httpx.HTTPError as exc:
        return SmokeResult(False, "", None, f"the request failed: {type(exc).__name__}: {exc}")
    if resp.status_code != 200:
        return SmokeResult(False, "", None, f"HTTP {resp.status_code}: {_clip(resp.text.strip(), 200)}")
    try:
        body = resp.json()
    except ValueError:
        return SmokeResult(False, "", None, "the answer is not JSON")
    if isinstance(body, list):
        body = body[0] if body else {}
    if not isinstance(body, Mapping):
        return SmokeResult(False, "", None, "the answer is not a JSON object")
    text = body.get("text") if isinstance(body.get("text"), str) else ""
    meta = body.get("meta_info") if isinstance(body.get("meta_info"), Mapping) else {}
    tokens = meta.get("completion_tokens")
    tokens = int(tokens) if isinstance(tokens, (int, float)) else None
    if tokens is None:
        return SmokeResult(False, text, None, "the server reported no completion_tokens")
    if tokens == 0:
        return SmokeResult(False, text, 0, "the server generated 0 tokens")
    why = is_garbage(text)
    if why:
        return SmokeResult(False, text, tokens, why)
    return SmokeResult(True, text, tokens, "")


def smoke_diagnosis(result: SmokeResult, log_text: str = "") -> Diagnosis:
    """Turn a failed smoke test into a ``garbage_output`` diagnosis (a known log cause wins if present)."""
    # Any garbage rule explains it, the non-fatal NaN warning too: SGLang survives it, the output does not.
    found = (
        next(
            ((rule, m) for rule in RULES if rule.category == "garbage_output" and (m := rule.pattern.search(log_text))),
            None,
        )
        if log_text
        else None
    )
    if found:
        rule, m = found
        return Diagnosis(
            rule.category, _format_summary(rule, m), _clip(_line_at(log_text, m.start())), redact_text(_tail(log_text))
        )
    shown = _clip(repr(result.text), 120)
    summary = (
        f"The server started but its test generation failed: {result.reason}; with NVFP4 on SM120 try "
        "--fp4-gemm-backend flashinfer_cudnn and --moe-runner-backend flashinfer_cutlass."
    )
    return Diagnosis("garbage_output", summary, f"output: {shown}", redact_text(_tail(log_text)))
