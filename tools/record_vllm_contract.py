#!/usr/bin/env python3
"""Record vLLM's contract from its real wheel: ``vllm serve`` options, HTTP facts, ready line, error texts.

    python tools/record_vllm_contract.py 0.34.0                      # pip download from PyPI
    python tools/record_vllm_contract.py --wheel /tmp/vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl

How the parser is obtained (the choice): vLLM derives most of its options from config dataclasses at
run time (``EngineArgs.add_cli_args``: ``Literal`` type hints become choices, ``bool`` fields become
``--x/--no-x`` pairs, ``FlexibleArgumentParser`` adds ``--enable-x``/``--disable-x`` inverses), so a
static reading of the source would have to re-implement that derivation and would drift with it.
Instead ``tools/vllm_parser_child.py`` runs vLLM's own ``make_arg_parser`` in a child interpreter with
every heavy import (torch, transformers, fastapi, ...) replaced by an inert stub, and only the pure-
Python packages the derivation needs installed for real (pydantic, regex, PyYAML, msgspec, into a
temporary folder with ``pip install --target``). The child builds the parser exactly as ``vllm`` does
(a top-level parser with a ``serve`` sub-parser), describes every option with
``workers/engines/option_dump.py`` (hidden and negative option strings included, since argparse
matches prefixes against them too) and feeds it sample command lines, so argparse's error lines and
FlexibleArgumentParser's rewrites (``--a_b`` -> ``--a-b``, ``--x.key v`` -> JSON) are recorded from the
real thing. ``allow_abbrev`` is read off the real parser (vLLM leaves argparse's default: on).

Texts and HTTP facts come from the source (``tools/vllm_texts.py``), each with its file and line; the
ready line from uvicorn's wheel (the newest pip resolves, as vLLM pins none); the port-in-use line from
vLLM's own ``create_server_socket``. Shared steps (download, versions, argparse entries, writing) are in
``tools/wheel_contract.py``. vLLM's code is only read and run here; none of it is copied into benchbot.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import wheel_contract
from sglang_texts import TORCH_PROBES, Companions, Tree, record_binary_probes, record_python_probes
from vllm_texts import UVICORN_PROBES, VLLM_PROBES, http_facts, port_in_use

ROOT = Path(__file__).resolve().parents[1]
OPTION_DUMP = ROOT / "workers" / "engines" / "option_dump.py"
CHILD = Path(__file__).resolve().parent / "vllm_parser_child.py"
DEFAULT_OUT = ROOT / "workers" / "engines" / "contracts"
DEPS = ("pydantic", "regex", "pyyaml", "msgspec", "typing_extensions")

#: Command lines fed to the real parser. ``argparse_*`` record the error line; ``accepts_*`` record what
#: the parser makes of a spelling (FlexibleArgumentParser's rewrites), ``spec_*`` the JSON option.
SAMPLES: dict[str, list[str]] = {
    "argparse_unrecognized": ["serve", "m", "--no-such-option", "1"],
    "argparse_ambiguous": ["serve", "m", "--max-num", "8"],
    "argparse_invalid_choice": ["serve", "m", "--moe-backend", "cutlas"],
    "argparse_expected_one": ["serve", "m", "--port"],
    "argparse_invalid_int": ["serve", "m", "--tensor-parallel-size", "eight"],
    "accepts_port_80": ["serve", "m", "--port", "80"],
    "speculative_config_bad_json": [
        "serve",
        "m",
        "--speculative-config",
        '{"method": "mtp", "num_speculative_tokens": 3',
    ],
    "accepts_underscores": ["serve", "m", "--tensor_parallel_size", "2"],
    "accepts_dotted_json": ["serve", "m", "--speculative-config.method", "mtp"],
    "accepts_prefix": ["serve", "m", "--tensor-parallel", "2"],
    "accepts_spec_mtp": ["serve", "m", "--speculative-config", '{"method":"mtp","num_speculative_tokens":3}'],
    "accepts_disable_custom_all_reduce": ["serve", "m", "--disable-custom-all-reduce"],
    "accepts_enable_custom_all_reduce": ["serve", "m", "--enable-custom-all-reduce"],
}


def usage_of_serve(root: Path) -> str:
    """The ``usage=`` string ``vllm serve``'s sub-parser is created with (read from serve.py)."""
    import ast

    source = (root / "vllm" / "entrypoints" / "cli" / "serve.py").read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_parser":
            for kw in node.keywords:
                if kw.arg == "usage" and isinstance(kw.value, ast.Constant):
                    return str(kw.value.value)
    return "vllm serve [model_tag] [options]"


def run_child(unpacked: Path, deps: Path, usage: str, python: Path | None = None) -> dict[str, Any]:
    """Build the real parser in a child interpreter; its description and the samples' outcomes.

    With ``python`` (an interpreter whose venv has this vLLM installed, e.g. the real tier's ``.venv-real``)
    the child runs the installed vLLM for real, on the platform it detects, instead of the wheel with stubs.
    """
    samples = {"__usage__": usage, **SAMPLES}
    where = "-" if python is not None else str(unpacked)
    proc = subprocess.run(
        [str(python or sys.executable), str(CHILD), where, str(deps), str(OPTION_DUMP), json.dumps(samples)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"building vLLM's parser failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def sample_texts(samples: dict[str, Any], version: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(argparse error texts by key, what the accepted samples parsed to)."""
    label = f"vllm {version}'s own parser (vllm serve: make_arg_parser)"
    texts: dict[str, Any] = {}
    accepted: dict[str, Any] = {}
    for key, found in samples.items():
        if found["ok"]:
            values = found["values"]
            keep = {
                k: values.get(k) for k in ("tensor_parallel_size", "speculative_config", "disable_custom_all_reduce")
            }
            accepted[key] = {"argv": found["argv"], "ok": True, "values": keep}
        elif key.startswith("accepts_"):
            accepted[key] = {"argv": found["argv"], "ok": False, "error": found["text"]}
        else:
            texts[key] = entry = wheel_contract.argparse_entry(found["text"], found["argv"], label)
            address = re.search(r" at (0x[0-9a-f]+)>", found["text"])
            if address:  # a function's repr in the message: its address differs per run
                head, tail = found["text"][: address.start(1)], found["text"][address.end(1) :]
                esc = lambda t: t.replace("{", "{{").replace("}", "}}")  # noqa: E731
                entry["template"] = esc(head) + "{0}" + esc(tail)
                entry["fields"] = [{"expr": "hex(id(type))", "format": "", "sample": address.group(1)}]
    return texts, accepted


def record(wheel: Path, deps: Path, work: Path, companions: Companions, python: Path | None = None) -> dict[str, Any]:
    """The contract of one vLLM wheel."""
    version = wheel_contract.wheel_version(wheel, "vllm")
    unpacked = work / f"vllm-{version}"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(unpacked, members=[n for n in zf.namelist() if not n.endswith(".so")])
    usage = usage_of_serve(unpacked)
    described = run_child(unpacked, deps, usage, python)
    parser = described["parser"]
    parser["top_prog"] = described["top_prog"]
    tree = Tree(f"vllm {version}", unpacked)
    texts = record_python_probes(tree, VLLM_PROBES, "vllm/")
    more, accepted = sample_texts(described["samples"], version)
    texts.update(more)
    texts["http_port_in_use"] = port_in_use(tree)
    uvicorn_pin = companions.newest("uvicorn")
    uvicorn = companions.tree("uvicorn", uvicorn_pin[1]) if uvicorn_pin else None
    if uvicorn is not None:
        texts.update(record_python_probes(uvicorn, UVICORN_PROBES, "uvicorn/"))
    else:
        texts["ready"] = None
    torch_pin = next(
        (
            ln.split("==", 1)[1].split(";", 1)[0].strip()  # "2.13.0+cpu; platform_machine == ..." -> the pin
            for ln in tree.metadata().splitlines()
            if ln.startswith("Requires-Dist: torch==")
        ),
        None,
    )
    texts.update(
        record_binary_probes(
            companions.tree("torch", torch_pin),
            TORCH_PROBES,
            f"torch {torch_pin} wheel (~0.9 GB) was not available to the recorder (--companions DIR, --with-torch)",
        )
    )
    return {
        "schema": wheel_contract.SCHEMA,
        "engine": "vllm",
        "version": version,
        "recorded_from": {
            "wheel": wheel.name,
            "sha256": wheel_contract.sha256(wheel),
            "parser_source": "vllm/entrypoints/common/cli_args.py (make_arg_parser) under "
            "vllm/entrypoints/cli/serve.py's sub-parser; FlexibleArgumentParser in vllm/utils/argparse_utils.py",
            "companions": {"uvicorn": uvicorn_pin[1] if uvicorn_pin else None, "torch": torch_pin},
            "parser_built": "by the installed vLLM, for real (no stubs)"
            if python is not None
            else "from the wheel, heavy imports stubbed, CUDA platform",
            "python": sys.version.split()[0],
        },
        "parser": parser,
        "flexible": accepted,
        "http": http_facts(tree),
        "server_info": {"fields": [], "extra": [], "sources": []},
        "ready_line": texts.get("ready"),
        "texts": texts,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("versions", nargs="*", help="vLLM versions to download from PyPI and record")
    ap.add_argument("--wheel", action="append", default=[], help="record an already downloaded wheel")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"where to write (default {DEFAULT_OUT})")
    ap.add_argument("--companions", action="append", type=Path, default=[], help="folder of downloaded wheels")
    ap.add_argument("--no-download", action="store_true", help="never download companions (uvicorn)")
    ap.add_argument("--with-torch", action="store_true", help="also download the pinned PyTorch wheel")
    ap.add_argument(
        "--python",
        type=Path,
        help="build the parser with this interpreter's installed vLLM, for real (e.g. .venv-real/bin/python "
        "for the CPU build)",
    )
    args = ap.parse_args(argv)
    if not args.versions and not args.wheel:
        ap.error("name at least one version or --wheel")
    with tempfile.TemporaryDirectory(prefix="vllm-contract-") as tmp:
        work = Path(tmp)
        deps = work / "deps"
        wheel_contract.pip_install_target(deps, *DEPS)
        companions = Companions(args.companions, work, download=not args.no_download, allow_large=args.with_torch)
        wheels = [Path(w) for w in args.wheel] + [wheel_contract.download("vllm", v, work) for v in args.versions]
        for wheel in wheels:
            contract = record(wheel, deps, work, companions, args.python)
            path = wheel_contract.write_contract(contract, args.out)
            texts = contract["texts"]
            absent = sorted(k for k, v in texts.items() if v is None)
            print(
                f"{path}: {len(contract['parser']['options'])} options; texts not found: {', '.join(absent) or 'none'}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
