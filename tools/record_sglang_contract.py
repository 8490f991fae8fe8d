#!/usr/bin/env python3
"""Record SGLang's contract from its real wheel: launch options, server_info keys, ready line, error texts.

    python tools/record_sglang_contract.py 0.5.9 0.5.23          # downloads from PyPI (pip download)
    python tools/record_sglang_contract.py --wheel sglang-0.5.23-*.whl

benchbot's driver and simulator were written beside each other and shared their mistakes; this script
asks the real thing instead. For each version it downloads the wheel (``pip download --no-deps``, so
from PyPI or the index pip is configured with), unpacks it, and in a child process builds SGLang's own
launch parser (``ServerArgs.add_cli_args``) with every heavy dependency (torch, transformers, ...)
replaced by an inert stub, then describes every option with ``workers/engines/option_dump.py``. It
also reads, from the source, the keys ``/server_info`` returns, the line printed when the server is
ready and the exact error texts behind benchbot's diagnosis rules, each with the file and line it came
from. The result is one JSON file per version under ``workers/engines/contracts/`` (package data: the
worker checks launches against it and the simulator takes its flags from it).

SGLang's code is only read and run here to extract facts; none of it is copied into benchbot.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OPTION_DUMP = ROOT / "workers" / "engines" / "option_dump.py"
DEFAULT_OUT = ROOT / "workers" / "engines" / "contracts"
SCHEMA = 1

# --------------------------------------------------------------------------------------------- the child

#: Runs in a fresh interpreter: argv = [unpacked wheel dir, deps dir, option_dump.py]. Every module that
#: is not the standard library, msgspec (a real dependency of 0.5.15+ server args, installed in deps) or
#: SGLang's argument modules becomes an inert stub, so the parser is built with nothing but its own code.
CHILD = r'''
import importlib.abc, importlib.machinery, json, sys, types

wheel, deps, dump_path = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path[:0] = [deps, wheel]
REAL = {"sglang", "sglang.srt", "sglang.srt.server_args",
        # choices lists: the parser names (0.5.9 reads them off the parser classes, 0.5.23 off name lists)
        "sglang.srt.parser", "sglang.srt.parser.reasoning_parser", "sglang.srt.parser.reasoning_parser_names",
        "sglang.srt.function_call", "sglang.srt.function_call.function_call_parser",
        "sglang.srt.function_call.parser_names"}
REAL_TREES = ("sglang.srt.arg_groups",)
REAL_TOPS = {"msgspec"}


class Stub:
    """Anything: callable, iterable (empty), falsy, usable as a base class, a decorator or a number."""

    def __init__(self, name="stub"):
        object.__setattr__(self, "_n", name)

    def __getattr__(self, key):
        if key == "__version__":
            return "99.0.0"
        if key.startswith("__") and key.endswith("__"):
            raise AttributeError(key)
        return Stub(self._n + "." + key)

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return Stub(self._n + "()")

    def __mro_entries__(self, bases):
        return (object,)

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False

    def __len__(self):
        return 0

    def __contains__(self, item):
        return False

    def __getitem__(self, key):
        return self

    def __int__(self):
        return 0

    __index__ = __int__

    def __float__(self):
        return 0.0

    def __lt__(self, other):
        return False

    __gt__ = __le__ = __ge__ = __lt__

    def __eq__(self, other):
        return self is other

    def __hash__(self):
        return id(self)

    def __or__(self, other):
        return self

    __ror__ = __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __or__

    def __repr__(self):
        return "<stub %s>" % self._n


class StubModule(types.ModuleType):
    def __getattr__(self, key):
        if key == "__version__":
            return "99.0.0"
        if key.startswith("__") and key.endswith("__"):
            raise AttributeError(key)
        return Stub(self.__name__ + "." + key)


class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        if top in sys.stdlib_module_names or top in REAL_TOPS:
            return None
        if name in REAL or any(name == t or name.startswith(t + ".") for t in REAL_TREES):
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        module = StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, Finder())
dump = {}
exec(compile(open(dump_path).read(), dump_path, "exec"), dump)
import argparse

from sglang.srt.server_args import ServerArgs

parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
print(json.dumps({"parser": dump["describe_parser"](parser),
                  "server_args_fields": dump["server_args_fields"](ServerArgs)}))
'''


def run_child(unpacked: Path, deps: Path) -> dict[str, Any]:
    """Build the real parser in a child interpreter and return its description."""
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(unpacked), str(deps), str(OPTION_DUMP)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"building SGLang's parser failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------- source facts


def _literal_text(node: ast.AST, fills: dict[str, str]) -> str | None:
    """The text of a string literal or f-string, with each ``{expr}`` replaced by ``fills[expr]`` (or 1)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts: list[str] = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            elif isinstance(value, ast.FormattedValue):
                parts.append(fills.get(ast.unparse(value.value), "1"))
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _literal_text(node.left, fills), _literal_text(node.right, fills)
        return None if left is None or right is None else left + right
    return None


def _string_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every string literal in a module, implicit concatenations already merged by the parser."""
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            yield node


def find_text(root: Path, needle: str, fills: dict[str, str], under: str = "sglang") -> dict[str, Any] | None:
    """The first string literal under ``root/under`` containing ``needle``: its text, file and line."""
    base = root / under
    if not base.exists():
        return None
    for path in sorted(base.rglob("*.py")):
        source = path.read_text(encoding="utf-8", errors="replace")
        if needle.split("{")[0][:40] not in source and needle not in source:
            continue
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in _string_nodes(tree):
            text = _literal_text(node, fills)
            if text and needle in text:
                return {"text": text, "source": str(path.relative_to(root)), "line": getattr(node, "lineno", None)}
    return None


def server_info_keys(root: Path, fields: list[str]) -> dict[str, Any]:
    """Keys of ``GET /server_info``: the ServerArgs fields plus what the handler and scheduler add."""
    http = root / "sglang" / "srt" / "entrypoints" / "http_server.py"
    tree = ast.parse(http.read_text(encoding="utf-8"))
    extra: list[str] = []
    calls: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.AsyncFunctionDef) and node.name == "server_info":
            for inner in ast.walk(node):
                if isinstance(inner, ast.Dict):
                    extra += [k.value for k in inner.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
                if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name):
                    calls.append(inner.func.id)
    sources = [str(http.relative_to(root))]
    if "build_server_info" in calls:
        common = root / "sglang" / "srt" / "utils" / "common.py"
        ctree = ast.parse(common.read_text(encoding="utf-8"))
        for node in ast.walk(ctree):
            if isinstance(node, ast.FunctionDef) and node.name == "build_server_info":
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Subscript) and isinstance(inner.slice, ast.Constant) \
                            and isinstance(inner.ctx, ast.Store):
                        extra.append(str(inner.slice.value))
        sources.append(str(common.relative_to(root)))
    scheduler = root / "sglang" / "srt" / "managers" / "scheduler.py"
    stree = ast.parse(scheduler.read_text(encoding="utf-8"))
    for node in ast.walk(stree):
        if isinstance(node, ast.Dict):
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
            values = [v.value for v in node.values if isinstance(v, ast.Constant)]
            if "status" in keys and "ready" in values:
                extra += [str(k) for k in keys]
                break
    sources.append(str(scheduler.relative_to(root)))
    return {"fields": fields, "extra": list(dict.fromkeys(extra)), "sources": sources}


def parser_prog(root: Path) -> str:
    """What argparse calls the program in its messages (``launch_server.py`` or ``sglang serve``)."""
    source = (root / "sglang" / "srt" / "server_args.py").read_text(encoding="utf-8")
    m = re.search(r"def prepare_server_args[\s\S]*?ArgumentParser\(\s*prog\s*=\s*\"([^\"]+)\"", source)
    # Without prog, argparse names the script: `python -m sglang.launch_server` runs launch_server.py.
    return m.group(1) if m else "launch_server.py"


#: The texts behind benchbot's diagnosis rules and log handling: id -> (needle, fills, what it is).
#: ``needle`` locates the literal in the wheel; ``fills`` give sample values for f-string fields.
TEXT_PROBES: dict[str, tuple[str, dict[str, str], str]] = {
    "ready": ("fired up and ready to roll", {}, "logged once warm-up is done"),
    "kv_pool_too_small": ("Not enough memory. Please try to increase --mem-fraction-static", {}, "fatal"),
    "cuda_graph_capture_failed": ("Capture cuda graph failed", {"e": "CUDA out of memory"}, "fatal"),
    "scheduler_exception": ("Scheduler hit an exception", {"traceback": "Traceback (most recent call last):"},
                            "fatal wrapper"),
    "child_sigquit": ("Received sigquit from a child process", {}, "fatal wrapper"),
    "spec_v2_topk": ("Spec v2 currently only supports topk = 1", {}, "config error (<= 0.5.10)"),
    "mamba_track_interval_draft": ("must be greater than or equal to speculative_num_draft_tokens",
                                   {"self.mamba_track_interval": "2", "self.speculative_num_draft_tokens": "4"},
                                   "config error"),
    "mamba_track_interval_page": ("must be divisible by page_size",
                                  {"self.mamba_track_interval": "100", "self.page_size": "64"}, "config error"),
    "trtllm_mha_sm100": ("TRTLLM MHA backend is only supported on Blackwell GPUs", {}, "unsupported GPU"),
    "nvfp4_unsupported_platform": ("Current platform does not support NVFP4", {}, "unsupported GPU"),
    "nan_in_logits": ("NaN in the logits", {}, "warning, or an error with --enable-nan-detection"),
    "flashinfer_router_weight": ("apply_router_weight_on_input is not supported for Flashinfer", {}, "assertion"),
    "internal_port_wait": ("is in use. Waiting for", {"port": "30001", "i": "10", "port_name": "nccl_port",
                                                      "error_message": ""}, "recoverable: an internal port"),
    "prefill_oom": ("Prefill out of memory", {}, "runtime OOM"),
    "decode_oom": ("Decode out of memory", {}, "runtime OOM"),
    "kv_pool_full_retract": ("KV cache pool is full. Retract requests", {}, "recoverable"),
}


def record_texts(root: Path) -> dict[str, Any]:
    """Each probe's real text in this wheel, or ``null`` where this version has no such text."""
    texts: dict[str, Any] = {}
    for key, (needle, fills, what) in TEXT_PROBES.items():
        found = find_text(root, needle, fills)
        texts[key] = {**found, "kind": what} if found else None
    return texts


# --------------------------------------------------------------------------------------------- wheels


def download(version: str, into: Path) -> Path:
    """``pip download --no-deps sglang==VERSION``: the wheel file."""
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           f"sglang=={version}", "-d", str(into)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheels = sorted(into.glob(f"sglang-{version}-*.whl"))
    if proc.returncode != 0 or not wheels:
        raise SystemExit(f"could not download sglang=={version}: {proc.stderr.strip()[-800:]}")
    return wheels[0]


def install_msgspec(into: Path) -> None:
    """msgspec is the one real dependency SGLang's argument modules need (0.5.15+)."""
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(into), "msgspec"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"could not install msgspec: {proc.stderr.strip()[-800:]}")


def wheel_version(wheel: Path) -> str:
    """``sglang-0.5.23-cp311-...whl`` -> ``0.5.23``."""
    parts = wheel.name.split("-")
    if len(parts) < 2 or parts[0] != "sglang":
        raise SystemExit(f"{wheel.name} is not an sglang wheel")
    return parts[1]


def record(wheel: Path, deps: Path, work: Path) -> dict[str, Any]:
    """The contract of one wheel."""
    version = wheel_version(wheel)
    unpacked = work / f"sglang-{version}"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(unpacked)
    described = run_child(unpacked, deps)
    parser = described["parser"]
    parser["prog"] = parser_prog(unpacked)
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    texts = record_texts(unpacked)
    return {
        "schema": SCHEMA,
        "engine": "sglang",
        "version": version,
        "recorded_from": {"wheel": wheel.name, "sha256": sha,
                          "parser_source": "sglang/srt/server_args.py (ServerArgs.add_cli_args)"},
        "parser": parser,
        "server_info": server_info_keys(unpacked, described["server_args_fields"]),
        "ready_line": texts.get("ready"),
        "texts": texts,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("versions", nargs="*", help="SGLang versions to download from PyPI and record")
    ap.add_argument("--wheel", action="append", default=[], help="record an already downloaded wheel")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"where to write (default {DEFAULT_OUT})")
    args = ap.parse_args(argv)
    if not args.versions and not args.wheel:
        ap.error("name at least one version or --wheel")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sglang-contract-") as tmp:
        work = Path(tmp)
        deps = work / "deps"
        install_msgspec(deps)
        wheels = [Path(w) for w in args.wheel] + [download(v, work) for v in args.versions]
        for wheel in wheels:
            contract = record(wheel, deps, work)
            path = args.out / f"sglang-{contract['version']}.json"
            path.write_text(json.dumps(contract, indent=1, sort_keys=False) + "\n", encoding="utf-8")
            count = len(contract["parser"]["options"])
            missing = sorted(k for k, v in contract["texts"].items() if v is None)
            print(f"{path}: {count} options; texts not in this version: {', '.join(missing) or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
