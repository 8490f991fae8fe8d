#!/usr/bin/env python3
"""Record SGLang's contract from its real wheel: launch options, server_info keys, ready line, error texts.

    python tools/record_sglang_contract.py 0.5.9..0.5.23         # every release in the range (PyPI)
    python tools/record_sglang_contract.py 0.5.9 0.5.23          # just these (pip download)
    python tools/record_sglang_contract.py --wheel sglang-0.5.23-*.whl --companions ~/wheels

benchbot's driver and simulator were written beside each other and shared their mistakes; this script
asks the real thing instead. For each version it downloads the wheel (``pip download --no-deps``, so
from PyPI or the index pip is configured with), unpacks it, and in a child process builds SGLang's own
launch parser (``ServerArgs.add_cli_args``) with every heavy dependency (torch, transformers, ...)
replaced by an inert stub, then describes every option with ``workers/engines/option_dump.py``. It
also reads, from the source, the keys ``/server_info`` returns, the line printed when the server is
ready and the exact error texts behind benchbot's diagnosis rules, each with the package, file and line
it came from (``tools/sglang_texts.py``: SGLang's own texts; FlashInfer's and PyTorch's from the wheels
this SGLang pins; argparse's from the real parser; the port-in-use line from uvicorn and uvloop). The
result is one JSON file per version under ``workers/engines/contracts/`` (package data: the worker
checks launches against it and the simulator takes its flags from it).

SGLang's code is only read and run here to extract facts; none of it is copied into benchbot.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import wheel_contract
from sglang_texts import SGLANG_PROBES, Companions, Tree, record_companion_texts, record_python_probes

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

parser = argparse.ArgumentParser(prog=sys.argv[4])
ServerArgs.add_cli_args(parser)

# argparse's own error lines, from this very parser (the last stderr line: "prog: error: ...").
import contextlib, io
errors = {}
for key, argv in json.loads(sys.argv[5]).items():
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parser.parse_args(argv)
        errors[key] = None
    except SystemExit:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        errors[key] = {"argv": argv, "text": lines[-1] if lines else ""}
print(json.dumps({"parser": dump["describe_parser"](parser),
                  "server_args_fields": dump["server_args_fields"](ServerArgs),
                  "argparse_errors": errors}))
'''


#: Command lines that make argparse print each of its errors the diagnosis rules read.
ARGPARSE_SAMPLES: dict[str, list[str]] = {
    "argparse_unrecognized": ["--model-path", "m", "--no-such-option", "1"],
    "argparse_ambiguous": ["--model-path", "m", "--pp", "2"],
    "argparse_invalid_choice": ["--model-path", "m", "--moe-runner-backend", "cutlas"],
    "argparse_expected_one": ["--model-path", "m", "--port"],
    "argparse_invalid_int": ["--model-path", "m", "--tp-size", "eight"],
    "argparse_required": [],
}


def run_child(unpacked: Path, deps: Path, prog: str) -> dict[str, Any]:
    """Build the real parser in a child interpreter; its description and argparse's real error lines."""
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(unpacked), str(deps), str(OPTION_DUMP), prog, json.dumps(ARGPARSE_SAMPLES)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"building SGLang's parser failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------- source facts


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
                    if (
                        isinstance(inner, ast.Subscript)
                        and isinstance(inner.slice, ast.Constant)
                        and isinstance(inner.ctx, ast.Store)
                    ):
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


# --------------------------------------------------------------------------------------------- wheels


def download(version: str, into: Path) -> Path:
    """``pip download --no-deps sglang==VERSION``: the wheel file."""
    return wheel_contract.download("sglang", version, into)


def install_msgspec(into: Path) -> None:
    """msgspec is the one real dependency SGLang's argument modules need (0.5.15+)."""
    wheel_contract.pip_install_target(into, "msgspec")


def wheel_version(wheel: Path) -> str:
    """``sglang-0.5.23-cp311-...whl`` -> ``0.5.23``."""
    return wheel_contract.wheel_version(wheel, "sglang")


def expand_versions(words: list[str]) -> list[str]:
    """``["0.5.9..0.5.23"]`` -> ``0.5.9``, ``0.5.10``, ... ``0.5.23``: every patch release in the range, so
    the releases between two recorded ones are never skipped (the presets' version boundaries were once
    guessed from three recordings). Plain versions pass through; both ends must share major.minor."""
    out: list[str] = []
    for word in words:
        if ".." not in word:
            out.append(word)
            continue
        low, high = word.split("..", 1)
        lo, hi = low.split("."), high.split(".")
        if len(lo) != 3 or len(hi) != 3 or lo[:2] != hi[:2] or not (lo[2].isdigit() and hi[2].isdigit()):
            raise SystemExit(f"{word}: a range is X.Y.A..X.Y.B (same X.Y, plain patch numbers)")
        if int(lo[2]) > int(hi[2]):
            raise SystemExit(f"{word}: the range runs backwards")
        out += [f"{lo[0]}.{lo[1]}.{n}" for n in range(int(lo[2]), int(hi[2]) + 1)]
    return list(dict.fromkeys(out))


def argparse_texts(errors: dict[str, Any], version: str) -> dict[str, Any]:
    """argparse's error lines as SGLang's real parser printed them in the child."""
    label = f"sglang {version}'s own parser (ServerArgs.add_cli_args)"
    return {
        key: None if found is None else wheel_contract.argparse_entry(found["text"], found["argv"], label)
        for key, found in errors.items()
    }


def record(wheel: Path, deps: Path, work: Path, companions: Companions) -> dict[str, Any]:
    """The contract of one wheel."""
    version = wheel_version(wheel)
    unpacked = work / f"sglang-{version}"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(unpacked)
    prog = parser_prog(unpacked)
    described = run_child(unpacked, deps, prog)
    parser = described["parser"]
    parser["prog"] = prog
    sha = wheel_contract.sha256(wheel)
    tree = Tree(f"sglang {version}", unpacked)
    texts = record_python_probes(tree, SGLANG_PROBES, "sglang/")
    texts.update(argparse_texts(described["argparse_errors"], version))
    more, used = record_companion_texts(tree, companions)
    texts.update(more)
    return {
        "schema": SCHEMA,
        "engine": "sglang",
        "version": version,
        "recorded_from": {
            "wheel": wheel.name,
            "sha256": sha,
            "parser_source": "sglang/srt/server_args.py (ServerArgs.add_cli_args)",
            "companions": used,
            "python": sys.version.split()[0],
        },
        "parser": parser,
        "server_info": server_info_keys(unpacked, described["server_args_fields"]),
        "ready_line": texts.get("ready"),
        "texts": texts,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("versions", nargs="*", help="SGLang versions (or ranges, 0.5.9..0.5.23) to download and record")
    ap.add_argument("--wheel", action="append", default=[], help="record an already downloaded wheel")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"where to write (default {DEFAULT_OUT})")
    ap.add_argument(
        "--companions",
        action="append",
        type=Path,
        default=[],
        help="a folder of already downloaded companion wheels (flashinfer-python, torch, "
        "nvidia-cuda-runtime, uvicorn, uvloop); searched before downloading",
    )
    ap.add_argument("--no-download", action="store_true", help="never download companions")
    ap.add_argument(
        "--with-torch",
        action="store_true",
        help="also download the pinned PyTorch wheel (~0.9 GB) when no --companions folder has it",
    )
    args = ap.parse_args(argv)
    if not args.versions and not args.wheel:
        ap.error("name at least one version or --wheel")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sglang-contract-") as tmp:
        work = Path(tmp)
        deps = work / "deps"
        install_msgspec(deps)
        companions = Companions(args.companions, work, download=not args.no_download, allow_large=args.with_torch)
        versions = expand_versions(args.versions)
        local = {wheel_version(Path(w)): Path(w) for w in args.wheel}
        wheels = [*local.values()] + [download(v, work) for v in versions if v not in local]
        for wheel in wheels:
            contract = record(wheel, deps, work, companions)
            path = wheel_contract.write_contract(contract, args.out)
            count = len(contract["parser"]["options"])
            texts = contract["texts"]
            absent = sorted(k for k, v in texts.items() if v is None)
            unrecorded = sorted(k for k, v in texts.items() if v is not None and v["text"] is None)
            print(
                f"{path}: {count} options; texts not in this version: {', '.join(absent) or 'none'}; "
                f"not recordable here: {', '.join(unrecorded) or 'none'}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
