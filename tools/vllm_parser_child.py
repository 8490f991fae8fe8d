"""Build ``vllm serve``'s real parser from an unpacked vLLM wheel, with its heavy imports stubbed; print it.

Run by ``tools/record_vllm_contract.py`` in a fresh interpreter::

    python tools/vllm_parser_child.py WHEEL_DIR DEPS_DIR OPTION_DUMP_PY SAMPLES_JSON

vLLM derives most options from its config dataclasses (``EngineArgs.add_cli_args``: type hints become
choices, ``bool`` fields become ``--x/--no-x`` pairs), so reading the source would mean re-implementing
that derivation; running it is faithful by construction. Everything but the standard library, vLLM
itself and the few pure-Python packages the derivation needs (pydantic and its helpers, regex, PyYAML,
msgspec, installed in DEPS_DIR) is an inert stub: torch, transformers, fastapi, ... A stub here is a
*class* (so it can be subclassed, used in annotations and unions, and validated by pydantic as "any").
vLLM's compiled extensions and its kernel IR package (``vllm.ir``, which registers torch ops at import)
are stubbed too. The CUDA platform is set explicitly, as ``vllm serve`` on a GPU host would detect it.

The parser is built the way ``vllm`` builds it (``vllm/entrypoints/cli/main.py`` and ``serve.py``): a
top-level ``FlexibleArgumentParser(prog="vllm")`` with a ``serve`` sub-parser filled by
``make_arg_parser``, so argparse's error lines come out exactly as a user sees them (an unrecognized
flag is reported by the top-level parser, ``vllm: error: ...``; the rest by ``vllm serve: error: ...``).
Nothing of vLLM is copied: the wheel is only run.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import io
import json
import sys
import types
from pathlib import Path

REAL_TOPS = {
    "vllm",
    "pydantic",
    "pydantic_core",
    "typing_extensions",
    "typing_inspection",
    "annotated_types",
    "regex",
    "yaml",
    "_yaml",
    "msgspec",
}
STUB_TREES = ("vllm.ir",)


class StubMeta(type):
    """A stub that is a class: attribute chains, calls and decorators all work and do nothing."""

    def __getattr__(cls, key):
        if key.startswith("__") and key.endswith("__"):
            raise AttributeError(key)
        return _make(cls.__qualname__ + "." + key)

    def __call__(cls, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs and not isinstance(args[0], StubMeta):
            return args[0]  # used as a decorator
        return _make(cls.__qualname__ + "()")

    def __iter__(cls):
        return iter(())

    def __bool__(cls):
        return False

    def __len__(cls):
        return 0

    def __contains__(cls, item):
        return False

    def __getitem__(cls, key):
        return cls

    def __setitem__(cls, key, value):
        pass

    def __int__(cls):
        return 0

    __index__ = __int__

    def __float__(cls):
        return 0.0

    def __lt__(cls, other):
        return False

    __gt__ = __le__ = __ge__ = __lt__

    def __eq__(cls, other):
        # `array(...).itemsize == torch.float32.itemsize` runs at import time: a stub equals any int.
        if isinstance(other, StubMeta):
            return cls.__qualname__ == other.__qualname__
        return isinstance(other, int) and not isinstance(other, bool)

    __hash__ = type.__hash__

    def __add__(cls, other):
        return cls

    __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __add__

    def __enter__(cls):
        return cls

    def __exit__(cls, *exc):
        return False


def _any_schema(cls, source, handler):
    from pydantic_core import core_schema

    return core_schema.any_schema()


def _make(name: str) -> type:
    return StubMeta(name, (), {"__module__": "stub", "__get_pydantic_core_schema__": classmethod(_any_schema)})


class StubModule(types.ModuleType):
    def __getattr__(self, key):
        if key.startswith("__") and key.endswith("__"):
            raise AttributeError(key)
        value = _make(self.__name__ + "." + key)
        setattr(self, key, value)
        return value


class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        if any(name == t or name.startswith(t + ".") for t in STUB_TREES):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        if top in sys.stdlib_module_names or top in REAL_TOPS:
            if top == "vllm" and importlib.machinery.PathFinder.find_spec(name, path) is None:
                return importlib.machinery.ModuleSpec(name, self, is_package=True)  # a compiled extension
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        module = StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def main() -> None:
    wheel, deps, dump_path, samples = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    # WHEEL_DIR "-": the vLLM installed in this interpreter, run for real (no stubs, its own platform):
    # how the CPU build is recorded from the real tier's venv, where torch and the rest are really there.
    installed = wheel == "-"
    if not installed:
        sys.path[:0] = [deps, wheel]
        sys.meta_path.insert(0, Finder())
    sys.argv = ["vllm", "serve"]
    import importlib.metadata

    real_version = importlib.metadata.version

    def version(name: str) -> str:
        """A stubbed distribution (torch, ...) is not installed: it reports version 0."""
        try:
            return real_version(name)
        except importlib.metadata.PackageNotFoundError:
            return "0"

    if not installed:
        importlib.metadata.version = version
    dump: dict = {}
    exec(compile(Path(dump_path).read_text(encoding="utf-8"), dump_path, "exec"), dump)

    import vllm.platforms

    if not installed:
        # Before anything imports ``current_platform`` by name (``arg_utils`` does, at import): bound
        # later, modules keep the stub the plugin lookup resolved to, and ``--mm-processor-device`` got
        # a stub's repr as its choice instead of CUDA's ``cuda``.
        from vllm.platforms.cuda import CudaPlatform

        vllm.platforms.current_platform = CudaPlatform()
    try:
        from vllm.entrypoints.common.cli_args import make_arg_parser
    except ModuleNotFoundError:  # 0.32 and older: the OpenAI server's launchers package
        from vllm.entrypoints.launchers.cli_args import make_arg_parser  # type: ignore[no-redef]
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    usage = samples.pop("__usage__")
    top = FlexibleArgumentParser(prog="vllm")
    sub = top.add_subparsers(required=False, dest="subparser")
    serve = make_arg_parser(sub.add_parser("serve", usage=usage))

    results: dict = {}
    for key, argv in samples.items():
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                ns = top.parse_args(list(argv))
            results[key] = {"argv": argv, "ok": True, "values": _plain(vars(ns))}
        except SystemExit:
            lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
            results[key] = {"argv": argv, "ok": False, "text": lines[-1] if lines else ""}
    described = dump["describe_parser"](serve)
    described["usage"] = serve.usage
    print(json.dumps({"parser": described, "top_prog": top.prog, "samples": results}, default=repr))


def _plain(values: dict) -> dict:
    """The parsed values that survive JSON (the rest as their repr)."""
    out = {}
    for key, value in values.items():
        try:
            json.dumps(value)
            out[key] = value
        except (TypeError, ValueError):
            out[key] = repr(value)
    return out


if __name__ == "__main__":
    main()
