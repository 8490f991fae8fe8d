"""The exact texts behind benchbot's diagnosis rules, read from the wheels that really print them.

Used by ``tools/record_sglang_contract.py``. A text is recorded where it is written: SGLang's own
messages from the SGLang wheel, FlashInfer's from the FlashInfer wheel SGLang pins, PyTorch's and the
CUDA runtime's from their compiled libraries (C strings), uvicorn/uvloop's port message from their
source, argparse's from SGLang's real parser (in the recorder's child). Each entry says where it came
from (package, file, line) and how it is emitted (``raise ValueError``, ``assert``, ``logger.warning``,
...), so a test can render the line as it appears in a log. A Python literal also keeps its template
(``Template``: the literal parts, and each f-string or ``%`` field with its source expression, format
and sample), so the simulator renders the wheel's wording with its own values instead of copying it.
Where a text cannot be read from any wheel the entry says so (``"text": null, "source": "not recorded:
..."``) instead of inventing it.

Each SGLang version is recorded with its own companions: the FlashInfer and PyTorch versions it pins,
the CUDA runtime that PyTorch pins. Their pins are read from the wheels' metadata, or asked of pip
without downloading (``pip install --dry-run --report``).
"""

from __future__ import annotations

import ast
import errno
import fnmatch
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import tokenize
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# --------------------------------------------------------------------------------------------- trees


class Tree:
    """Files of an unpacked wheel (a directory) or of a wheel read in place (a zip), by relative path."""

    def __init__(self, label: str, root: Path) -> None:
        self.label = label  # e.g. "flashinfer-python 0.6.3"
        self.root = root
        self._zip = zipfile.ZipFile(root) if root.is_file() else None

    def names(self) -> list[str]:
        if self._zip is not None:
            return sorted(n for n in self._zip.namelist() if not n.endswith("/"))
        return sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*") if p.is_file())

    def read_bytes(self, name: str) -> bytes:
        if self._zip is not None:
            return self._zip.read(name)
        return (self.root / name).read_bytes()

    def read_text(self, name: str) -> str:
        return self.read_bytes(name).decode("utf-8", errors="replace")

    def metadata(self) -> str:
        """The wheel's ``*.dist-info/METADATA``."""
        for name in self.names():
            if name.endswith(".dist-info/METADATA"):
                return self.read_text(name)
        return ""


# --------------------------------------------------------------------------------------------- probes


@dataclass(frozen=True)
class Probe:
    """Where to find one text and what it is.

    ``needles`` must all appear in the rendered text (f-string fields replaced by ``fills``, or by ``1``).
    ``prefer`` lists path fragments searched first (the same text often appears in several files: the
    ready line is also in the gRPC and diffusion servers). ``emitted`` keeps only literals emitted that
    way (``raise``, ``assert``, ``logger``). ``source_line`` is a fallback for versions that assert
    without a message: the traceback then shows the source line, so that line is the text.
    """

    key: str
    needles: tuple[str, ...]
    kind: str
    fills: dict[str, str] = field(default_factory=dict)
    prefer: tuple[str, ...] = ()
    emitted: str | None = None
    source_line: str | None = None
    pattern: str = "*.py"  # which files to read ("*.cu" reads C++ string literals)


SGLANG_PROBES: tuple[Probe, ...] = (
    Probe(
        "ready",
        ("fired up and ready to roll",),
        "info: the server is ready (once warm-up is done)",
        prefer=("sglang/srt/entrypoints/http_server.py",),
    ),
    Probe(
        "kv_pool_too_small",
        ("Not enough memory. Please try to increase --mem-fraction-static",),
        "fatal: no room for the KV cache after the weights",
        fills={"self.server_args.mem_fraction_static": "0.88"},
    ),
    Probe(
        "kv_pool_current_value",
        ("Current value: mem_fraction_static=",),
        "the second half of kv_pool_too_small, appended when --mem-fraction-static is set (0.5.10+)",
        fills={"self.mem_fraction_static": "0.88"},
        prefer=(
            "sglang/srt/model_executor/pool_configurator.py",
            "sglang/srt/model_executor/model_runner_kv_cache_mixin.py",
        ),
    ),
    Probe(
        "cuda_graph_capture_failed",
        ("Capture cuda graph failed",),
        "fatal: CUDA graph capture failed",
        fills={"e": "CUDA out of memory", "CUDA_GRAPH_CAPTURE_FAILED_MSG": "Possible solutions: ..."},
        prefer=(
            "sglang/srt/model_executor/cuda_graph_runner.py",
            "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py",
        ),
    ),
    Probe(
        "cuda_graph_capture_hint",
        ("Possible solutions:", "--mem-fraction-static", "Open an issue"),
        "the hint after cuda_graph_capture_failed (CUDA_GRAPH_CAPTURE_FAILED_MSG)",
        prefer=("sglang/srt/model_executor/cuda_graph_runner.py", "sglang/srt/model_executor/runner_backend_utils/"),
    ),
    Probe(
        "scheduler_exception",
        ("Scheduler hit an exception",),
        "fatal wrapper around a scheduler traceback",
        fills={
            "traceback": "Traceback (most recent call last):",
            "get_exception_traceback()": "Traceback (most recent call last):",
        },
    ),
    Probe("child_sigquit", ("Received sigquit from a child process",), "fatal wrapper: a worker process died"),
    Probe(
        "spec_v2_topk",
        ("Spec v2 currently only supports topk = 1 for speculative decoding",),
        "fatal config error (SGLANG_ENABLE_SPEC_V2=1 with --speculative-eagle-topk > 1)",
        prefer=("sglang/srt/server_args.py",),
        emitted="raise",
    ),
    Probe(
        "mamba_radix_no_buffer_spec",
        ("not compatible with radix cache when using",),
        "fatal config error (speculative decoding, radix cache and mamba no_buffer)",
        fills={"model_arch": "Qwen3_5MoeForConditionalGeneration"},
    ),
    Probe(
        "mamba_track_interval_draft",
        ("mamba_track_interval", "must be greater than or equal to speculative_num_draft_tokens"),
        "fatal config error (mamba extra_buffer)",
        fills={"self.mamba_track_interval": "2", "self.speculative_num_draft_tokens": "4"},
        source_line="assert view.mamba_track_interval >= view.speculative_num_draft_tokens",
    ),
    Probe(
        "mamba_track_interval_page",
        ("mamba_track_interval", "must be divisible by page_size"),
        "fatal config error (mamba extra_buffer)",
        fills={"self.mamba_track_interval": "100", "self.page_size": "64"},
        source_line="assert view.mamba_track_interval % view.page_size == 0",
    ),
    Probe(
        "trtllm_mha_sm100",
        ("TRTLLM MHA backend is only supported on Blackwell GPUs",),
        "fatal: --attention-backend trtllm_mha on a GPU other than SM100",
    ),
    Probe(
        "trtllm_mha_sm120_fp8_kv",
        ("TRTLLM FMHAv2 prefill on SM120 does not support",),
        "fatal: trtllm_mha prefill on SM120 with an fp8_e4m3 KV cache",
        emitted="raise",
    ),
    Probe(
        "trtllm_mla_blackwell",
        ("TRTLLM MLA backend is only supported on Blackwell GPUs",),
        "fatal: --attention-backend trtllm_mla on a pre-Blackwell GPU",
    ),
    Probe(
        "trtllm_mha_prefill_gpu",
        ("TRTLLM MHA backend for prefill requires",),
        "fatal: trtllm_mha prefill on a GPU other than SM90/SM100/SM120",
    ),
    Probe(
        "trtllm_mha_decode_gpu",
        ("TRTLLM MHA backend for decode is only supported on",),
        "fatal: trtllm_mha decode on a GPU other than SM90/SM100/SM120",
    ),
    Probe(
        "nvfp4_unsupported_platform",
        ("Current platform does not support NVFP4",),
        "fatal: an NVFP4 checkpoint on a pre-Blackwell GPU",
    ),
    Probe(
        "nan_in_logits",
        ("Detected errors during sampling! NaN in the logits",),
        "warning (with --enable-nan-detection): NaN logits are replaced and serving goes on",
        prefer=("sglang/srt/layers/sampler.py",),
        emitted="logger",
    ),
    Probe(
        "nan_in_logits_raised",
        ("Detected errors during sampling! NaN in the logits",),
        "fatal when raised as a ValueError (speculative workers with --enable-nan-detection)",
        prefer=("sglang/srt/speculative/spec_utils.py",),
        emitted="raise",
    ),
    Probe(
        "nan_detected_async",
        ("NaN detected! ",),
        "fatal device assert (SGLANG_ENABLE_NAN_LOGITS_CHECK=1): NaN logits",
        fills={"msg": "sampler: next_token_logits"},
    ),
    Probe(
        "nan_sanitized_warning",
        ("values were sanitized before sampling",),
        "warning, logged once: NaN logits were replaced and serving goes on",
        fills={"msg": "sampler: next_token_logits"},
    ),
    Probe(
        "flashinfer_router_weight",
        ("apply_router_weight_on_input is not supported for Flashinfer",),
        "fatal: this model's MoE needs router weights on input, which the FlashInfer runner lacks",
    ),
    Probe(
        "internal_port_wait",
        ("is in use. Waiting for",),
        "info, recoverable: an internal port is busy",
        fills={
            "port": "30001",
            "i": "15",
            "port_name": "nccl_port",
            "error_message": "nccl_port is used by a process already.",
        },
    ),
    Probe(
        "internal_port_used_by",
        ("is used by a process already.", "process.name()="),
        "the detail an internal port wait names its holder with",
        fills={
            "port_name": "nccl_port",
            "process.name()": "'python3'",
            "process.cmdline()": "['python3']",
            "process.status()": "'sleeping'",
            "pid": "4242",
        },
    ),
    Probe(
        "internal_port_owner_unknown",
        ("is in use, but we could not find the process that uses it",),
        "warning, recoverable: an internal port is busy",
        fills={"port": "30001"},
    ),
    Probe(
        "internal_port_next",
        ("is already in use, trying port",),
        "info, recoverable: SGLANG_PORT is busy, the next port is tried",
        fills={"port": "30001", "port + 1": "30002"},
    ),
    Probe(
        "internal_port_timeout",
        ("is not available in", "seconds"),
        "fatal: an internal port stayed busy (DP attention ports derive from --port)",
        fills={"port_name": "nccl_port", "port": "30001", "timeout_s": "30", "error_message": ""},
        emitted="raise",
    ),
    Probe(
        "internal_port_in_use",
        ("Port is already in use.", "dist_init_port="),
        "error, then the exception re-raised: PortArgs found an internal port taken",
        fills={
            "dist_init_port": "None",
            "port_base": "30001",
            "detokenizer_port": "30002",
            "nccl_port": "30003",
            "scheduler_input_port": "30004",
        },
        prefer=("sglang/srt/server_args.py",),
    ),
    Probe(
        "prefill_oom",
        ("Prefill out of memory",),
        "fatal: the KV pool cannot hold a prefill batch",
        fills={"extend_num_tokens": "8192", "available_and_evictable_str(tree_cache)": ""},
    ),
    Probe(
        "decode_oom",
        ("Decode out of memory",),
        "fatal: the KV pool cannot hold a decode batch",
        fills={"num_tokens": "512", "available_and_evictable_str(tree_cache)": ""},
    ),
    Probe(
        "kv_pool_full_retract",
        ("KV cache pool is full. Retract requests",),
        "warning, recoverable: requests are retracted and retried",
    ),
    Probe(
        "moe_auto_sm120_info", ("MoE runner backend on SM110/SM120",), "info: auto picks flashinfer_cutlass on SM120"
    ),
    Probe(
        "spec_max_running_reset",
        ("Max running requests is reset to 48 for speculative decoding",),
        "warning: speculative decoding caps --max-running-requests",
    ),
    Probe(
        "assert_example",
        ("tp_size must be divisible by number of nodes",),
        "fatal assertion (an example of a bare launch-settings assert)",
        emitted="assert",
    ),
    Probe(
        "value_error_example",
        ("Cannot set --encoder-only and --language-only together",),
        "fatal ValueError (an example of a launch-settings ValueError)",
        emitted="raise",
    ),
)

FLASHINFER_PROBES: tuple[Probe, ...] = (
    Probe(
        "flashinfer_backend_unsupported",
        ("does not support backend",),
        "fatal: a FlashInfer backend chosen for a GPU it has no kernels for (mm_fp4 trtllm on SM120)",
        fills={"func.__name__": "mm_fp4", "backend": "trtllm", "extra": " with capability 120"},
        prefer=("flashinfer/utils.py",),
        emitted="raise",
    ),
    Probe(
        "flashinfer_no_arch",
        ("No supported CUDA architectures found for major versions",),
        "fatal: a FlashInfer JIT module built for other GPU generations only (trtllm-gen MoE: SM100)",
        fills={"supported_major_versions": "[10]"},
        prefer=("flashinfer/compilation_context.py",),
    ),
    Probe(
        "flashinfer_moe_arch_check",
        ("MoE kernel requires",),
        "fatal: the trtllm-gen MoE launcher's architecture check (when its module was built anyway)",
        prefer=("trtllm_fused_moe_kernel_launcher.cu",),
        pattern="*.cu",
    ),
)


@dataclass(frozen=True)
class BinaryProbe:
    """A C string in a compiled library: the NUL-terminated string that contains (or equals) ``needle``."""

    key: str
    member: str  # glob of the library inside the wheel
    needle: str
    kind: str
    exact: bool = False


TORCH_PROBES: tuple[BinaryProbe, ...] = (
    BinaryProbe(
        "torch_cuda_oom",
        "torch/lib/libc10_cuda.so",
        "CUDA out of memory. Tried to allocate",
        "fatal: PyTorch's CUDA allocator is out of memory",
    ),
    BinaryProbe(
        "torch_oom_error",
        "torch/lib/libtorch_python.so",
        "torch.OutOfMemoryError",
        "fatal: the exception class PyTorch raises for it",
        exact=True,
    ),
    BinaryProbe(
        "torch_probability_nan",
        "torch/lib/libtorch_cuda.so",
        "probability tensor contains either",
        "fatal device assert in torch.multinomial (NaN/inf probabilities)",
    ),
)

CUDART_PROBES: tuple[BinaryProbe, ...] = (
    BinaryProbe(
        "cuda_no_kernel_image",
        "*/libcudart.so.*",
        "no kernel image is available for execution",
        "fatal: a kernel was not built for this GPU (PyTorch prints 'CUDA error: ' + this)",
    ),
    BinaryProbe(
        "cuda_invalid_device",
        "*/libcudart.so.*",
        "invalid device ordinal",
        "fatal: a GPU index this host does not have",
        exact=True,
    ),
    BinaryProbe(
        "cuda_device_assert",
        "*/libcudart.so.*",
        "device-side assert triggered",
        "fatal: a CUDA kernel assertion fired",
        exact=True,
    ),
)

#: Texts whose wheel exists but which live where no wheel can show them.
NOT_RECORDABLE: dict[str, tuple[str, str]] = {
    "cuda_assertion_failed": (
        "printed by the CUDA device runtime (the kernel's assert(), format "
        "'file:line: ...: Assertion `cond` failed.'), not a string in any wheel",
        "fatal device assert",
    ),
}


# --------------------------------------------------------------------------------------------- literals


def _fill(node: ast.AST, fills: dict[str, str]) -> str:
    return fills.get(ast.unparse(node), "1")


class Template:
    """A text as its source writes it: literal parts, and a numbered field per f-string or ``%`` value.

    ``format`` is ``str.format`` syntax (literal braces doubled, fields ``{0}``, ``{1}``...); each field
    keeps its source expression (``self.server_args.mem_fraction_static``), how the source formats it
    (``!r`` for ``{x=}`` or ``{x!r}``, ``:.2f``, or a ``%d`` of a logging call) and the sample value the
    recorder rendered it with. The recorded text is ``format`` filled with the samples, so a reader (the
    simulator) renders the same wording with its own values and can never drift from the wheel.
    """

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.fields: list[dict[str, str]] = []

    def literal(self, text: str) -> None:
        self.parts.append(text.replace("{", "{{").replace("}", "}}"))

    def field(self, expr: str, how: str, sample: str) -> None:
        for i, known in enumerate(self.fields):
            if known["expr"] == expr and known["format"] == how:
                self.parts.append(f"{{{i}}}")
                return
        self.fields.append({"expr": expr, "format": how, "sample": sample})
        self.parts.append(f"{{{len(self.fields) - 1}}}")

    @property
    def format(self) -> str:
        return "".join(self.parts)

    def text(self) -> str:
        return self.format.format(*(f["sample"] for f in self.fields))

    def as_dict(self) -> dict[str, Any]:
        return {"template": self.format, "fields": self.fields}


def _field_format(value: ast.FormattedValue) -> str | None:
    """``!r``, ``:.2f``, ``!r:>8`` or ``""``: how an f-string field is formatted (None: a nested field)."""
    how = "" if value.conversion == -1 else "!" + chr(value.conversion)
    if value.format_spec is None:
        return how
    pieces = value.format_spec.values if isinstance(value.format_spec, ast.JoinedStr) else []
    if not all(isinstance(p, ast.Constant) for p in pieces):
        return None
    return how + ":" + "".join(str(p.value) for p in pieces if isinstance(p, ast.Constant))


def literal_template(node: ast.AST, fills: dict[str, str]) -> Template | None:
    """The template of a string literal, f-string or ``+`` of them; each ``{expr}`` sampled as ``fills[expr]``
    (or 1). None for anything else (a name, a call, a field whose format has fields of its own)."""
    template = Template()

    def walk(n: ast.AST) -> bool:
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            template.literal(n.value)
            return True
        if isinstance(n, ast.JoinedStr):
            for value in n.values:
                if isinstance(value, ast.Constant):
                    template.literal(str(value.value))
                elif isinstance(value, ast.FormattedValue):
                    how = _field_format(value)
                    if how is None:
                        return False
                    template.field(ast.unparse(value.value), how, _fill(value.value, fills))
            return True
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add):
            return walk(n.left) and walk(n.right)
        return False

    return template if walk(node) else None


_LOG_METHODS = {"debug", "info", "warning", "warn", "error", "exception", "critical"}
_PERCENT = re.compile(r"%[-#0 +]*\d*(?:\.\d+)?[sdrfi]")


def _emission(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> tuple[str, ast.Call | None]:
    """How a literal reaches the log: ``raise X``, ``assert``, ``logger.<level>``, ``print`` or ``literal``."""
    child, parent = node, parents.get(node)
    while parent is not None:
        if isinstance(parent, ast.Raise):
            exc = parent.exc.func if isinstance(parent.exc, ast.Call) else parent.exc
            name = exc.id if isinstance(exc, ast.Name) else exc.attr if isinstance(exc, ast.Attribute) else "?"
            return f"raise {name}", None
        if isinstance(parent, ast.Assert) and parent.msg is child:
            return "assert", None
        if isinstance(parent, ast.Call):
            func = parent.func
            if isinstance(func, ast.Attribute) and func.attr in _LOG_METHODS:
                return f"logger.{func.attr}", parent
            if isinstance(func, ast.Name) and func.id == "print":
                return "print", parent
        if isinstance(parent, (ast.stmt,)):
            return "literal", None
        child, parent = parent, parents.get(parent)
    return "literal", None


def _percent_args(template: Template, call: ast.Call | None, fills: dict[str, str]) -> Template:
    """``logger.info("Port %d is in use", port)``: each ``%d`` becomes a field for its argument."""
    if call is None or len(call.args) < 2 or not _PERCENT.search(template.format):
        return template
    out = Template()
    out.fields = list(template.fields)
    args = iter(call.args[1:])
    pos = 0
    source = template.format
    for m in _PERCENT.finditer(source):
        out.parts.append(source[pos : m.start()])
        arg = next(args, None)
        if arg is None:
            out.literal("1")  # more %-fields than arguments: logging would fail; the text says 1 as before
        else:
            out.field(ast.unparse(arg), m.group(0), _fill(arg, fills))
        pos = m.end()
    out.parts.append(source[pos:])
    return out


def _ordered(names: list[str], prefer: tuple[str, ...]) -> list[str]:
    def rank(name: str) -> int:
        return next((i for i, frag in enumerate(prefer) if frag in name), len(prefer))

    return sorted(names, key=lambda n: (rank(n), n))


def _raw_hints(probe: Probe) -> list[str]:
    """Pieces of the needles that must appear in the raw source (before f-string fields are filled)."""
    hints = []
    for needle in probe.needles:
        piece = max(re.split(r"[{}\d]", needle), key=len).strip()
        if piece:
            hints.append(piece[:40])
    return hints


def find_python_text(tree: Tree, probe: Probe, under: str) -> dict[str, Any] | None:
    """The first Python string literal under ``under`` matching ``probe``: text, file, line, emission."""
    names = [n for n in tree.names() if n.startswith(under) and fnmatch.fnmatch(n, probe.pattern)]
    hints = _raw_hints(probe)
    for name in _ordered(names, probe.prefer):
        source = tree.read_text(name)
        if not all(h in source for h in hints):
            continue
        try:
            module = ast.parse(source)
        except SyntaxError:
            continue
        parents = {child: node for node in ast.walk(module) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(module):
            is_str = isinstance(node, ast.Constant) and isinstance(node.value, str)
            if not (is_str or isinstance(node, ast.JoinedStr)):
                continue
            if isinstance(parents.get(node), ast.JoinedStr):
                continue  # a piece of a larger f-string: the whole one is visited too
            template = literal_template(node, probe.fills)
            text = None if template is None else template.text()
            if template is None or not text or not all(n in text for n in probe.needles):
                continue
            how, call = _emission(node, parents)
            if probe.emitted and not how.startswith(probe.emitted):
                continue
            template = _percent_args(template, call, probe.fills)
            return {
                "text": template.text(),
                "source": name,
                "line": getattr(node, "lineno", None),
                "emitted": how,
                **template.as_dict(),
            }
    return None


def find_source_line(tree: Tree, needle: str, under: str) -> dict[str, Any] | None:
    """The first source line containing ``needle`` (an assert without a message shows its line)."""
    for name in _ordered([n for n in tree.names() if n.startswith(under) and n.endswith(".py")], ()):
        source = tree.read_text(name)
        if needle not in source:
            continue
        for number, line in enumerate(source.splitlines(), 1):
            if needle in line:
                return {
                    "text": line.strip(),
                    "source": name,
                    "line": number,
                    "emitted": "assert without a message (the traceback shows this line, then AssertionError)",
                }
    return None


_C_STRING = re.compile(r'"((?:[^"\\\n]|\\.)*)"')


def find_c_text(tree: Tree, probe: Probe, under: str) -> dict[str, Any] | None:
    """The first C/C++ string literal matching ``probe`` (FlashInfer's CUDA sources ship in its wheel)."""
    names = [n for n in tree.names() if n.startswith(under) and fnmatch.fnmatch(n, probe.pattern)]
    for name in _ordered(names, probe.prefer):
        source = tree.read_text(name)
        if probe.needles[0] not in source:
            continue
        for m in _C_STRING.finditer(source):
            text = m.group(1).encode().decode("unicode_escape")
            if all(n in text for n in probe.needles):
                return {
                    "text": text,
                    "source": name,
                    "line": source.count("\n", 0, m.start()) + 1,
                    "emitted": "C++ check (TVM_FFI_ICHECK ... <<): raised as a RuntimeError in Python",
                }
    return None


def find_c_string(tree: Tree, probe: BinaryProbe) -> dict[str, Any] | None:
    """The NUL-terminated string containing ``probe.needle`` in a compiled library of the wheel."""
    needle = probe.needle.encode()
    for name in tree.names():
        if not fnmatch.fnmatch(name, probe.member):
            continue
        data = tree.read_bytes(name)
        start = 0
        while (pos := data.find(needle, start)) >= 0:
            begin = data.rfind(b"\0", 0, pos) + 1
            end = data.find(b"\0", pos)
            text = data[begin:end].decode("utf-8", errors="replace")
            start = pos + 1
            if probe.exact and text != probe.needle:
                continue
            return {"text": text, "source": name, "line": None, "emitted": "C string in a compiled library"}
    return None


def _with(found: dict[str, Any] | None, package: str, kind: str) -> dict[str, Any] | None:
    if found is None:
        return None
    entry = {
        "text": found["text"],
        "source": f"{package}: {found['source']}",
        "line": found.get("line"),
        "kind": kind,
        "emitted": found.get("emitted", ""),
    }
    if "template" in found:
        entry.update(template=found["template"], fields=found["fields"])
    return entry


def _not_recorded(why: str, kind: str) -> dict[str, Any]:
    return {"text": None, "source": f"not recorded: {why}", "line": None, "kind": kind, "emitted": ""}


def record_python_probes(tree: Tree, probes: tuple[Probe, ...], under: str) -> dict[str, Any]:
    """Each probe's text in this tree, or None where this version has no such text."""
    out: dict[str, Any] = {}
    for probe in probes:
        python = probe.pattern.endswith(".py")
        found = find_python_text(tree, probe, under) if python else find_c_text(tree, probe, "")
        if found is None and probe.source_line:
            found = find_source_line(tree, probe.source_line, under)
        out[probe.key] = _with(found, tree.label, probe.kind)
    return out


def record_binary_probes(tree: Tree | None, probes: tuple[BinaryProbe, ...], missing: str) -> dict[str, Any]:
    """C strings from a compiled wheel; ``missing`` says why none could be read when ``tree`` is None."""
    out: dict[str, Any] = {}
    for probe in probes:
        if tree is None:
            out[probe.key] = _not_recorded(missing, probe.kind)
            continue
        found = find_c_string(tree, probe)
        out[probe.key] = _with(found, tree.label, probe.kind) or _not_recorded(
            f"'{probe.needle}' is not a string in {tree.label}'s host libraries (device code is compressed)", probe.kind
        )
    return out


# --------------------------------------------------------------------------------------------- the port


def python_strings(source: str, needle: str) -> tuple[str, int] | None:
    """Adjacent string literals (Python or Cython source, read with the tokenizer) containing ``needle``."""
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    i = 0
    while i < len(tokens):
        if tokens[i].type == tokenize.STRING:
            parts, j = [], i
            while j < len(tokens) and tokens[j].type in (tokenize.STRING, tokenize.NL, tokenize.COMMENT):
                if tokens[j].type == tokenize.STRING:
                    try:
                        parts.append(ast.literal_eval(tokens[j].string))
                    except ValueError:
                        parts.append("")  # an f-string: not one of the plain messages looked for
                j += 1
            text = "".join(p for p in parts if isinstance(p, str))
            if needle in text:
                return text, tokens[i].start[0]
            i = j
        else:
            i += 1
    return None


def record_port_texts(uvloop: Tree | None, uvicorn: Tree | None, sglang: Tree) -> dict[str, Any]:
    """What the log shows when the HTTP port is taken (errno 98), on the path SGLang really uses.

    SGLang runs ``uvicorn`` with ``loop="uvloop"``; uvloop's ``create_server`` raises
    ``OSError(errno, 'error while attempting to bind on address %r: %s' % (addr, strerror.lower()))``
    and uvicorn's ``Server.startup`` logs it (``logger.error(exc)``) and exits 1. The strerror is this
    host's libc's. 0.5.23's multi-tokenizer mode binds the socket itself and logs the plain OSError.
    """
    kind = "fatal: the HTTP port is taken"
    strerror = os.strerror(errno.EADDRINUSE)
    texts: dict[str, Any] = {}
    if uvloop is None or uvicorn is None:
        texts["http_port_in_use"] = _not_recorded("uvloop/uvicorn wheels were not available", kind)
    else:
        loop = next((n for n in uvloop.names() if n.endswith("uvloop/loop.pyx")), None)
        found = python_strings(uvloop.read_text(loop), "while attempting") if loop else None
        server = next((n for n in uvicorn.names() if n.endswith("uvicorn/server.py")), None)
        logged = python_strings_line(uvicorn.read_text(server), "logger.error(exc)") if server else None
        if found is None or logged is None:
            texts["http_port_in_use"] = _not_recorded("uvloop's create_server or uvicorn's startup changed", kind)
        else:
            fmt, line = found
            # create_server formats ``% (pyaddr, err.strerror.lower())``: the address is the one field.
            template = Template()
            template.literal(f"[Errno {errno.EADDRINUSE}] ")
            head, _, tail = fmt.partition("%r")
            template.literal(head)
            template.field("pyaddr", "%r", repr(("127.0.0.1", 30000)))
            template.literal(tail.replace("%s", strerror.lower(), 1))
            assert template.text() == str(OSError(errno.EADDRINUSE, fmt % (("127.0.0.1", 30000), strerror.lower())))
            texts["http_port_in_use"] = {
                "text": template.text(),
                "source": f"{uvloop.label}: {loop} (create_server), logged by {uvicorn.label}: {server}:{logged} "
                f"(logger.error(exc)); strerror of errno {errno.EADDRINUSE} from this host's libc",
                "line": line,
                "kind": kind,
                "emitted": "uvicorn logger.error(OSError), then exit 1",
                **template.as_dict(),
            }
    own = next((n for n in sglang.names() if n.endswith("sglang/srt/entrypoints/http_server.py")), None)
    source = sglang.read_text(own) if own else ""
    line = python_strings_line(source, "def _reserve_reuseport_socket")
    texts["http_port_in_use_reuseport"] = (
        None
        if line is None
        else {
            "text": str(OSError(errno.EADDRINUSE, strerror)),
            "source": f"{sglang.label}: {own}:{line} (_reserve_reuseport_socket logs socket.bind's OSError); "
            f"strerror of errno {errno.EADDRINUSE} from this host's libc",
            "line": line,
            "kind": kind + " (--tokenizer-worker-num > 1)",
            "emitted": "logger.error(OSError), then exit 1",
        }
    )
    return texts


def python_strings_line(source: str, needle: str) -> int | None:
    """The line number of the first source line containing ``needle``."""
    for number, line in enumerate(source.splitlines(), 1):
        if needle in line:
            return number
    return None


# --------------------------------------------------------------------------------------------- companions


def requirement_pin(metadata: str, name: str) -> str | None:
    """``Requires-Dist: flashinfer_python[cu13]==0.7.2`` -> ``0.7.2`` (None when unpinned or absent)."""
    wanted = re.sub(r"[-_.]+", "-", name).lower()
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        m = re.match(r"Requires-Dist:\s*([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*==\s*([^;,\s]+)", line)
        if m and re.sub(r"[-_.]+", "-", m.group(1)).lower() == wanted:
            return m.group(3).rstrip(".*")
    return None


def requirement_spec(metadata: str, name: str) -> str | None:
    """The whole requirement of ``name`` (``uvicorn>=0.51``, or ``uvicorn`` when unpinned)."""
    wanted = re.sub(r"[-_.]+", "-", name).lower()
    for line in metadata.splitlines():
        m = re.match(r"Requires-Dist:\s*([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*([^;]*)", line)
        if m and re.sub(r"[-_.]+", "-", m.group(1)).lower() == wanted and "extra ==" not in line:
            return f"{m.group(1)}{m.group(3).strip()}"
    return None


def pip_metadata(requirement: str) -> dict[str, Any] | None:
    """Resolve ``requirement`` with pip without downloading the wheel (``--dry-run --report``)."""
    with tempfile.TemporaryDirectory(prefix="pip-report-") as tmp:
        report = Path(tmp) / "report.json"
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--no-deps",
            "--ignore-installed",
            "--quiet",
            "--report",
            str(report),
            requirement,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600)
        if proc.returncode != 0 or not report.is_file():
            return None
        install = json.loads(report.read_text(encoding="utf-8")).get("install") or []
        return install[0]["metadata"] if install else None


def cudart_requirement(torch_metadata: str) -> str | None:
    """The CUDA runtime wheel a PyTorch version pins (directly, or through ``cuda-toolkit[cudart]``)."""
    pin = requirement_pin(torch_metadata, "nvidia-cuda-runtime-cu12")
    if pin:
        return f"nvidia-cuda-runtime-cu12=={pin}"
    toolkit = requirement_pin(torch_metadata, "cuda-toolkit")
    if toolkit:
        meta = pip_metadata(f"cuda-toolkit=={toolkit}")
        for req in (meta or {}).get("requires_dist") or []:
            m = re.match(r"nvidia-cuda-runtime\s*==\s*([0-9.]+)", req)
            if m and "cudart" in req:
                return f"nvidia-cuda-runtime=={m.group(1).rstrip('.')}"
    return None


class Companions:
    """Finds the wheels a SGLang version runs with: in ``dirs`` first, else ``pip download --no-deps``.

    PyTorch is never downloaded unless ``allow_large`` (its wheel is 0.5-0.9 GB); from a directory that
    already holds it (a local mirror) it is read in place.
    """

    LARGE: frozenset[str] = frozenset({"torch"})

    def __init__(self, dirs: list[Path], work: Path, *, download: bool, allow_large: bool) -> None:
        self.dirs = dirs
        self.work = work
        self.download = download
        self.allow_large = allow_large

    def wheel(self, name: str, version: str) -> Path | None:
        stem = re.sub(r"[-.]+", "_", name)
        for folder in [*self.dirs, self.work]:
            found = sorted(folder.glob(f"{stem}-{version}-*.whl")) + sorted(folder.glob(f"{stem}-{version}+*.whl"))
            found = [w for w in found if "+cpu" not in w.name]
            if found:
                return found[0]
        if not self.download or (name in self.LARGE and not self.allow_large):
            return None
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            f"{name}=={version}",
            "-d",
            str(self.work),
        ]
        subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=1800)
        found = sorted(self.work.glob(f"{stem}-{version}-*.whl"))
        return found[0] if found else None

    def tree(self, name: str, version: str | None) -> Tree | None:
        if not version:
            return None
        wheel = self.wheel(name, version)
        return Tree(f"{name} {version}", wheel) if wheel else None

    def newest(self, requirement: str | None) -> tuple[str, str] | None:
        """(name, version) pip would install for an unpinned requirement (``uvicorn>=0.51``)."""
        if not requirement:
            return None
        meta = pip_metadata(requirement)
        return (meta["name"], meta["version"]) if meta else None


def record_companion_texts(sglang: Tree, companions: Companions) -> tuple[dict[str, Any], dict[str, Any]]:
    """Texts from the wheels SGLang runs with, and which versions they were."""
    meta = sglang.metadata()
    texts: dict[str, Any] = {}
    used: dict[str, Any] = {}
    fi_version = requirement_pin(meta, "flashinfer-python")
    flashinfer = companions.tree("flashinfer-python", fi_version)
    used["flashinfer-python"] = fi_version
    if flashinfer is not None:
        texts.update(record_python_probes(flashinfer, FLASHINFER_PROBES, "flashinfer/"))
    else:
        for probe in FLASHINFER_PROBES:
            texts[probe.key] = _not_recorded(f"flashinfer-python {fi_version} wheel was not available", probe.kind)

    torch_version = requirement_pin(meta, "torch")
    used["torch"] = torch_version
    torch = companions.tree("torch", torch_version)
    texts.update(
        record_binary_probes(
            torch,
            TORCH_PROBES,
            f"torch {torch_version} wheel (~0.9 GB) was not available to the recorder (--companions DIR, --with-torch)",
        )
    )

    torch_meta = torch.metadata() if torch is not None else ""
    if not torch_meta and torch_version:
        report = pip_metadata(f"torch=={torch_version}")
        torch_meta = "\n".join(f"Requires-Dist: {r}" for r in (report or {}).get("requires_dist") or [])
    cudart_req = cudart_requirement(torch_meta)
    used["cuda-runtime"] = cudart_req
    cudart = None
    if cudart_req:
        name, _, version = cudart_req.partition("==")
        cudart = companions.tree(name, version)
    texts.update(
        record_binary_probes(
            cudart, CUDART_PROBES, f"the CUDA runtime torch {torch_version} pins ({cudart_req}) was not available"
        )
    )

    uvicorn_pin = companions.newest(requirement_spec(meta, "uvicorn"))
    uvloop_pin = companions.newest(requirement_spec(meta, "uvloop"))
    used["uvicorn"] = uvicorn_pin[1] if uvicorn_pin else None
    used["uvloop"] = uvloop_pin[1] if uvloop_pin else None
    texts.update(
        record_port_texts(
            companions.tree("uvloop", uvloop_pin[1]) if uvloop_pin else None,
            companions.tree("uvicorn", uvicorn_pin[1]) if uvicorn_pin else None,
            sglang,
        )
    )
    for key, (why, kind) in NOT_RECORDABLE.items():
        texts[key] = _not_recorded(why, kind)
    return texts, used
