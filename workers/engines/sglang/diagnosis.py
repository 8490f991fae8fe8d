"""Why an SGLang start failed, from its log: SGLang's failure RULES, texts it survives, hints fitted to versions.

Every rule is written against a text recorded from the real wheels (``workers/engines/contracts/*.json``,
key ``texts``; see ``tools/sglang_texts.py``), and tests match each rule against the real text of each
version that prints it. How rules are read and added: docs/observe.md ("Readiness and diagnosis"). The matching is
the shared :mod:`workers.engines.diagnosis`; this module binds SGLang's table, name and hint fitting to it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from workers.engines import diagnosis as shared
from workers.engines.contract import Contract, all_contracts
from workers.engines.diagnosis import Diagnosis, Rule
from workers.engines.diagnosis import rule as _r

if TYPE_CHECKING:
    from workers.engines.readiness import SmokeResult

#: The name SGLang's sentences use.
ENGINE = "SGLang"

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
    # Flag combinations SGLang rejects (docs/sim.md, "Versions and flags")
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
    # Memory (docs/sim.md, "Failure modes")
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

#: A flag named in a hint (``--speculative-*`` names a family, not a flag).
SUMMARY_FLAG_RE = re.compile(r"--[a-z0-9][a-z0-9-]*[a-z0-9](?![-*\w])")


def flags_for_version(summary: str, contract: Contract | None) -> str:
    """Name, in a hint, the flags this SGLang version accepts: ``--cuda-graph-max-bs`` is ambiguous in
    0.5.23, whose hint says ``--cuda-graph-max-bs-decode`` (see :data:`FLAG_RENAMES`)."""
    if contract is None:
        return _flags_for_unknown_version(summary)

    def fix(m: re.Match[str]) -> str:
        flag = m.group(0)
        if contract.resolve(flag).kind == "exact":
            return flag
        return next((new for new in FLAG_RENAMES.get(flag, ()) if contract.resolve(new).kind == "exact"), flag)

    return SUMMARY_FLAG_RE.sub(fix, summary)


def _flags_for_unknown_version(summary: str) -> str:
    """For a host whose version is unknown, name in a hint no flag some recorded release refuses:
    ``--cuda-graph-max-bs`` is ambiguous from 0.5.20, so the hint names ``--cuda-graph-max-bs-decode`` and
    the first release that has it (older ones take the name without ``-decode``)."""
    contracts = all_contracts("sglang")

    def fix(m: re.Match[str]) -> str:
        flag = m.group(0)
        if not contracts or all(c.resolve(flag).kind == "exact" for c in contracts):
            return flag
        for new in FLAG_RENAMES.get(flag, ()):
            having = [c.version for c in contracts if c.resolve(new).kind == "exact"]
            if having and having[-1] == contracts[-1].version:
                if len(having) == len(contracts):
                    return new
                suffix = new[len(flag) :] if new.startswith(flag) else ""
                before = f"without {suffix!r}" if suffix else "under its older name"
                return f"{new} (SGLang {having[0]}+; earlier releases take it {before})"
        return flag

    return SUMMARY_FLAG_RE.sub(fix, summary)


def fit_hint(summary: str, contract: Contract | None) -> str:
    """The flags a hint names, as the host's SGLang takes them (:func:`flags_for_version`); a contract of
    another engine leaves the hint as written."""
    if contract is not None and contract.engine != "sglang":
        return summary
    return flags_for_version(summary, contract)


def match_rule(text: str, *, fatal_only: bool = False) -> tuple[Rule, re.Match[str]] | None:
    """The first of SGLang's rules (table order) that matches anywhere in ``text``."""
    return shared.match_rule(text, fatal_only=fatal_only, rules=RULES)


def diagnose(
    log_text: str, *, exited: bool, returncode: int | None, timed_out: bool, contract: Contract | None = None
) -> Diagnosis:
    """Explain a failed or stuck SGLang start from its log (:func:`workers.engines.diagnosis.diagnose` with
    SGLang's rules); with the host's ``contract`` the hints name the flags that version accepts."""
    return shared.diagnose(
        log_text,
        exited=exited,
        returncode=returncode,
        timed_out=timed_out,
        contract=contract,
        rules=RULES,
        engine=ENGINE,
        fit_hint=fit_hint,
    )


#: A hint's clause that asks for a setting, and the env variable that setting is: dropped when set already.
ENV_HINTS = {"SGLANG_ENABLE_SPEC_V2": " (NEXTN on SGLang <= 0.5.10 also needs SGLANG_ENABLE_SPEC_V2=1)"}


def without_satisfied_hints(diagnosis: Diagnosis, env: Mapping[str, str]) -> Diagnosis:
    """``diagnosis`` without SGLang's advice to set what the launch's ``env`` already sets."""
    return shared.without_satisfied_hints(diagnosis, env, ENV_HINTS)


#: What a failed smoke generation suggests on SGLang.
SMOKE_HINT = "with NVFP4 on SM120 try --fp4-gemm-backend flashinfer_cudnn and --moe-runner-backend flashinfer_cutlass."


def smoke_diagnosis(result: SmokeResult, log_text: str = "") -> Diagnosis:
    """A failed smoke test as a ``garbage_output`` diagnosis (a cause SGLang's rules find in the log wins)."""
    return shared.smoke_diagnosis(result, log_text, rules=RULES, hint=SMOKE_HINT, fit_hint=fit_hint)
