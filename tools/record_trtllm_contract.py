#!/usr/bin/env python3
"""Record TensorRT-LLM's contract from its real source: ``trtllm-serve serve`` options, the LLM API keys its
``--config`` YAML accepts, HTTP facts, ready line and error texts.

    python tools/record_trtllm_contract.py --source DIR --origin "github NVIDIA/TensorRT-LLM v1.2.1" \
        --commit SHA [--click DIR] [--out workers/engines/contracts/]

``DIR`` holds a TensorRT-LLM source tree (``DIR/tensorrt_llm/commands/serve.py`` ...); the version is read
from its ``tensorrt_llm/version.py``. Nothing is imported or run: TensorRT-LLM's wheel needs CUDA and is
not on PyPI, so every fact is read statically with ``ast``:

- **options**: the ``@click.option`` / ``@click.argument`` decorators of the ``serve`` command in
  ``tensorrt_llm/commands/serve.py``: option strings, the dest click derives (the explicit name, else the
  first long option with ``-`` -> ``_``), type (``int``/``float``/``str``/``path``), choices (a literal list,
  ``ChoiceWithAlias``'s choices and aliases, or the keys of a dict literal the choice reads, resolved in its
  module), default (a literal, or ``Model.model_fields["x"].default`` resolved in the model's class),
  ``is_flag``, ``multiple``, help and stability tag. Click matches option names exactly (no prefixes) and
  keeps underscores, so ``allow_abbrev`` is false;
- **llm_api**: every pydantic model class of ``tensorrt_llm/llmapi/llm_args.py`` with its fields
  (annotation, literal default, ``Literal`` choices, description), the speculative decoding types
  (``decoding_type`` class variables) and which args class each ``--backend`` builds. The keys benchbot
  compiles into the ``--config`` YAML (:data:`YAML_KEYS`) are added to the parser's options as pseudo-options
  spelt ``--KEY.SUB`` and marked ``"llm_api_key"``, so a launch's nested settings are held against the same
  recorded choices as its flags;
- **http**: the routes ``OpenAIServer.register_routes`` mounts, what ``/health``, ``/version`` and
  ``/v1/models`` answer, and how the port is bound (``launch_server``: bound before the model loads,
  listened on once uvicorn starts);
- **texts**: TensorRT-LLM's own failure texts (``tools/sglang_texts.py``'s probes, with file and line),
  click's usage-error texts from the click installed here (``--click``), and uvicorn's ready line as
  recorded in the vLLM contract. The real CLI parses with click, whose errors say ``Error: No such option
  '--x'.`` and ``Invalid value for '--backend': 'x' is not one of ...``.

TensorRT-LLM's code is only read here; none of it is copied into benchbot.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sglang_texts import Probe, Tree, record_python_probes

ROOT = Path(__file__).resolve().parent.parent
CONTRACTS = ROOT / "workers" / "engines" / "contracts"
SERVE = "tensorrt_llm/commands/serve.py"
LLM_ARGS = "tensorrt_llm/llmapi/llm_args.py"
OPENAI_SERVER = "tensorrt_llm/serve/openai_server.py"
PROTOCOL = "tensorrt_llm/serve/openai_protocol.py"

#: The ``--config`` YAML keys benchbot writes (pseudo-options ``--KEY``), each a field path in the args class.
YAML_KEYS = (
    "moe_config.backend",
    "moe_config.max_num_tokens",
    "speculative_config.decoding_type",
    "speculative_config.max_draft_len",
    "speculative_config.num_nextn_predict_layers",
    "kv_cache_config.dtype",
    "kv_cache_config.enable_block_reuse",
    "kv_cache_config.free_gpu_memory_fraction",
    "enable_attention_dp",
    "attention_dp_config.enable_balance",
    "cuda_graph_config.enable_padding",
    "cuda_graph_config.max_batch_size",
    "disable_overlap_scheduler",
    "print_iter_log",
    "stream_interval",
)

TRTLLM_PROBES: tuple[Probe, ...] = (
    Probe(
        "port_in_use",
        ("Failed to bind socket to ",),
        "fatal: the port is taken (launch_server binds it before loading the model)",
        fills={"host": "localhost", "port": "8000", "e": "[Errno 98] Address already in use"},
        prefer=(SERVE,),
        emitted="raise",
    ),
    Probe(
        "unknown_backend",
        ("is not a known backend, check help for available options.",),
        "fatal: a --backend the server has no LLM class for",
        fills={"backend": "nonesuch"},
        prefer=(SERVE,),
    ),
    Probe(
        "moe_backend_unsupported",
        ("Unsupported moe backend: ",),
        "fatal: moe_config.backend names no MoE implementation",
        fills={"moe_backend": "NONESUCH"},
        prefer=("tensorrt_llm/_torch/modules/fused_moe/create_moe.py",),
        emitted="raise",
    ),
    Probe(
        "trtllm_moe_needs_sm100",
        ("TRTLLMGenFusedMoE requires SM100 or SM103, got SM",),
        "the trtllm-gen MoE (moe_config.backend TRTLLM) has kernels for SM100/SM103 only",
        fills={"sm_version": "120"},
        prefer=("tensorrt_llm/_torch/modules/fused_moe/fused_moe_trtllm_gen.py",),
    ),
    Probe(
        "kv_cache_cannot_fit",
        ("Impossible to fit in any sequence in kvCache",),
        "fatal (assert): the KV cache left after the weights cannot hold one sequence",
        prefer=("tensorrt_llm/_torch/pyexecutor/resource_manager.py",),
    ),
    Probe(
        "kv_cache_estimate",
        ("Estimated max memory in KV cache : ",),
        "info: the KV cache the memory profile leaves (after the weights and activations)",
        fills={"kv_cache_max_memory / GB": "12.00"},
        prefer=("tensorrt_llm/_torch/pyexecutor/_util.py",),
    ),
    Probe(
        "weights_memory",
        ("Memory used after loading model weights (inside torch) in memory usage profiling: ",),
        "info: the weights' memory once loaded (per GPU)",
        fills={"model_bytes / GB": "48.00"},
        prefer=("tensorrt_llm/_torch/pyexecutor/_util.py",),
    ),
    Probe(
        "invalid_decoding_type",
        ("Invalid decoding type: ",),
        "fatal: speculative_config.decoding_type names no decoding config",
        fills={"decoding_type": "NONESUCH"},
        prefer=(LLM_ARGS,),
        emitted="raise",
    ),
    Probe(
        "health_unavailable",
        ("LLM is unavailable. Please check the server logs for more details.",),
        "what /health answers (503) once the executor is unhealthy",
        prefer=(OPENAI_SERVER,),
    ),
    Probe(
        "overriding_field",
        ("Overriding ",),
        "warning: a --config YAML key replaced what the command line set (one per key)",
        fills={"field_name": "moe_config", "extra_llm_str": ""},
        prefer=(LLM_ARGS,),
    ),
)

#: click's usage-error texts (the real CLI parses with click): key -> (needles, kind, fills).
CLICK_PROBES: tuple[Probe, ...] = (
    Probe(
        "click_no_such_option",
        ("No such option ",),
        "fatal (exit 2): an option the command does not have; click prints usage, a hint and 'Error: ...'",
        fills={"name": "'--nonesuch'"},
        prefer=("click/exceptions.py",),
    ),
    Probe(
        "click_invalid_value",
        ("Invalid value for ",),
        "fatal (exit 2): a value an option refuses (the message says why)",
        fills={"param_hint": "'--backend'", "message": "'x' is not one of 'pytorch', 'tensorrt', '_autodeploy'."},
        prefer=("click/exceptions.py",),
    ),
    Probe(
        "click_not_one_of",
        ("is not one of ",),
        "the message of click_invalid_value for a choice option",
        fills={"value": "'x'", "choices": "'pytorch', 'tensorrt', '_autodeploy'"},
        prefer=("click/types.py",),
    ),
    Probe(
        "click_missing_argument",
        ("Missing argument",),
        "fatal (exit 2): MODEL was not given",
        prefer=("click/exceptions.py",),
    ),
    Probe(
        "click_requires_argument",
        ("requires an argument.",),
        "fatal (exit 2): an option that takes a value was given none",
        fills={"name": "'--tp_size'"},
        prefer=("click/parser.py",),
    ),
    Probe(
        "click_error_prefix",
        ("Error: ",),
        "how click prints a usage error's message (after the usage line and the help hint)",
        fills={"message": "No such option '--nonesuch'."},
        prefer=("click/exceptions.py",),
    ),
)


# --------------------------------------------------------------------------------------------- helpers


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _call_name(node: ast.AST) -> str:
    """``click.option`` -> ``click.option``; ``help_info_with_stability_tag`` as written."""
    return ast.unparse(node.func) if isinstance(node, ast.Call) else ""


def _string(node: ast.AST | None) -> str | None:
    """A string literal, implicit or ``+`` concatenation of literals; None otherwise."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _string(node.left), _string(node.right)
        return left + right if left is not None and right is not None else None
    return None


def _class_fields(module: ast.Module, name: str) -> dict[str, ast.AnnAssign]:
    for node in module.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return {
                n.target.id: n for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
            }
    return {}


def _field_default(assign: ast.AnnAssign) -> tuple[bool, Any]:
    """(known, value) of a field's default: ``= 3`` or ``= Field(default=3, ...)``; factories are unknown."""
    value = assign.value
    if value is None:
        return False, None
    if isinstance(value, ast.Call) and ast.unparse(value.func).endswith("Field"):
        for kw in value.keywords:
            if kw.arg == "default":
                value = kw.value
                break
        else:
            return False, None
    try:
        return True, ast.literal_eval(value)
    except ValueError:
        return False, ast.unparse(value)


def _field_description(assign: ast.AnnAssign) -> str:
    if isinstance(assign.value, ast.Call):
        for kw in assign.value.keywords:
            if kw.arg == "description":
                return _string(kw.value) or ""
    return ""


def _literal_choices(annotation: ast.AST) -> list[Any] | None:
    """``Literal["a", "b"]`` (also inside ``Optional[...]``) -> ``["a", "b"]``."""
    for node in ast.walk(annotation):
        if isinstance(node, ast.Subscript) and ast.unparse(node.value).endswith("Literal"):
            items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            try:
                return [ast.literal_eval(item) for item in items]
            except ValueError:
                return None
    return None


class Source:
    """The TensorRT-LLM source tree, read with ``ast`` (modules parsed once)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._modules: dict[str, ast.Module] = {}

    def module(self, rel: str) -> ast.Module:
        if rel not in self._modules:
            self._modules[rel] = ast.parse((self.root / rel).read_text(encoding="utf-8"))
        return self._modules[rel]

    def version(self) -> str:
        for node in ast.walk(self.module("tensorrt_llm/version.py")):
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets
            ):
                text = _string(node.value)
                if text:
                    return text
        raise SystemExit("tensorrt_llm/version.py has no literal __version__")

    def imported_from(self, module_rel: str, name: str) -> str | None:
        """The source file ``name`` is imported from in ``module_rel`` (relative or absolute imports)."""
        package = module_rel.rsplit("/", 1)[0].replace("/", ".")
        for node in ast.walk(self.module(module_rel)):
            if isinstance(node, ast.ImportFrom) and any(a.name == name for a in node.names):
                mod = node.module or ""
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - node.level + 1]
                    mod = ".".join([*base, mod] if mod else base)
                path = mod.replace(".", "/")
                for candidate in (f"{path}.py", f"{path}/__init__.py"):
                    if (self.root / candidate).is_file():
                        return candidate
        return None

    def find_class(self, name: str, near: str) -> tuple[str, ast.Module] | None:
        """The module defining class ``name``: ``near`` itself, or where ``near`` imports it from, following
        re-exports (``tensorrt_llm.llmapi`` -> ``llm_utils`` -> ``builder``) a few steps deep."""
        rel: str | None = near
        for _ in range(6):
            if rel is None:
                return None
            module = self.module(rel)
            if any(isinstance(n, ast.ClassDef) and n.name == name for n in module.body):
                return rel, module
            rel = self.imported_from(rel, name)
        return None

    def dict_keys(self, expr: ast.AST, near: str) -> list[str] | None:
        """Keys of the dict literal ``expr`` names (``severity_map``, ``Factory.parsers``), read in its module."""
        text = ast.unparse(expr)
        if not text.endswith(".keys()"):
            return None
        target = text[: -len(".keys()")]
        owner, _, attr = target.rpartition(".")
        places: list[tuple[str, str | None]] = []
        if owner:
            found = self.find_class(owner, near)
            if found:
                places.append((found[0], owner))
        else:
            origin = self.imported_from(near, attr) or near
            places.append((origin, None))
        for rel, cls in places:
            body: list[ast.stmt] = self.module(rel).body
            if cls:
                body = next(n.body for n in body if isinstance(n, ast.ClassDef) and n.name == cls)
            for node in body:
                targets = (
                    node.targets
                    if isinstance(node, ast.Assign)
                    else [node.target]
                    if isinstance(node, ast.AnnAssign)
                    else []
                )
                if any(isinstance(t, ast.Name) and t.id == attr for t in targets) and isinstance(
                    getattr(node, "value", None), ast.Dict
                ):
                    return [k.value for k in node.value.keys if isinstance(k, ast.Constant)]  # type: ignore[union-attr]
        return None

    def model_field_default(self, expr: ast.AST, near: str) -> tuple[bool, Any]:
        """``BuildConfig.model_fields["max_batch_size"].default`` -> the field's literal default."""
        if not (isinstance(expr, ast.Attribute) and expr.attr == "default" and isinstance(expr.value, ast.Subscript)):
            return False, None
        sub = expr.value
        if not (isinstance(sub.value, ast.Attribute) and sub.value.attr == "model_fields"):
            return False, None
        cls = ast.unparse(sub.value.value)
        key = _string(sub.slice)
        found = self.find_class(cls, near)
        if found is None or key is None:
            return False, None
        assign = _class_fields(found[1], cls).get(key)
        return _field_default(assign) if assign is not None else (False, None)


# --------------------------------------------------------------------------------------------- the CLI


def _help(node: ast.AST | None) -> tuple[str, str | None]:
    """(help text, stability tag) of ``help=`` (``help_info_with_stability_tag(text, tag)`` or a literal)."""
    if node is None:
        return "", None
    if isinstance(node, ast.Call) and _call_name(node).endswith("help_info_with_stability_tag"):
        return _string(node.args[0]) or "", _string(node.args[1]) if len(node.args) > 1 else None
    return _string(node) or "", None


def _option(src: Source, call: ast.Call) -> dict[str, Any]:
    """One ``@click.option(...)`` as a recorded option (the contract's shape, argparse words)."""
    decls = [s for s in (_string(a) for a in call.args) if s is not None]
    flags = [d for d in decls if d.startswith("-")]
    names = [d for d in decls if not d.startswith("-")]
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    dest = names[0] if names else next(f for f in flags if f.startswith("--")).lstrip("-").replace("-", "_").lower()
    is_flag = isinstance(kw.get("is_flag"), ast.Constant) and kw["is_flag"].value is True  # type: ignore[union-attr]
    multiple = isinstance(kw.get("multiple"), ast.Constant) and kw["multiple"].value is True  # type: ignore[union-attr]
    type_node = kw.get("type")
    type_name: str | None = None
    choices: list[str] | None = None
    aliases: dict[str, str] = {}
    choice_source = ""
    if type_node is not None:
        text = ast.unparse(type_node)
        if text in ("int", "float", "str", "bool"):
            type_name = text
        elif isinstance(type_node, ast.Call) and _call_name(type_node).endswith(("Choice", "ChoiceWithAlias")):
            first = type_node.args[0] if type_node.args else None
            if isinstance(first, ast.List | ast.Tuple):
                choices = [str(ast.literal_eval(e)) for e in first.elts]
            elif first is not None:
                choices = src.dict_keys(first, SERVE)
                choice_source = ast.unparse(first)
            if _call_name(type_node).endswith("ChoiceWithAlias") and len(type_node.args) > 1:
                aliases = {str(k): str(v) for k, v in ast.literal_eval(type_node.args[1]).items()}
            type_name = "str"
        elif isinstance(type_node, ast.Call) and _call_name(type_node).endswith("Path"):
            type_name = "path"
        else:
            type_name = text
    default: Any = None
    if "default" in kw:
        try:
            default = ast.literal_eval(kw["default"])
        except ValueError:
            known, value = src.model_field_default(kw["default"], SERVE)
            default = value if known else ast.unparse(kw["default"])
    help_text, stability = _help(kw.get("help"))
    entry: dict[str, Any] = {
        "flags": flags,
        "dest": dest,
        "action": "store_true" if is_flag else "append" if multiple else "store",
        "nargs": 0 if is_flag else None,
        "choices": [*choices, *aliases] if choices is not None else None,
        "default": False if is_flag and default is None else default,
        "type": None if is_flag else type_name,
        "required": False,
        "help": help_text,
    }
    if is_flag:
        entry["const"] = True
    if stability:
        entry["stability"] = stability
    if aliases:
        entry["aliases"] = aliases
    if choice_source:
        entry["choices_from"] = choice_source
    return entry


def serve_command(src: Source) -> tuple[dict[str, Any], list[str]]:
    """The ``serve`` command: its options (in ``--help`` order) and positional arguments."""
    module = src.module(SERVE)
    func = next(
        n
        for n in module.body
        if isinstance(n, ast.FunctionDef)
        and any(
            isinstance(d, ast.Call) and _call_name(d) == "click.command" and _string(d.args[0]) == "serve"
            for d in n.decorator_list
            if isinstance(d, ast.Call) and d.args
        )
    )
    options: list[dict[str, Any]] = []
    positionals: list[str] = []
    for deco in func.decorator_list:
        if not isinstance(deco, ast.Call):
            continue
        name = _call_name(deco)
        if name == "click.option":
            options.append(_option(src, deco))
        elif name == "click.argument":
            positionals.append(_string(deco.args[0]) or "")
    options.insert(
        0,
        {
            "flags": ["--help"],
            "dest": "help",
            "action": "help",
            "nargs": 0,
            "choices": None,
            "default": None,
            "type": None,
            "required": False,
            "help": "Show this message and exit.",
        },
    )
    return {"options": options}, positionals


def cli_groups(src: Source) -> dict[str, Any]:
    """``trtllm-serve``'s group: its sub-commands and the one it runs when the first word is none of them."""
    module = src.module(SERVE)
    commands: list[str] = []
    default = None
    for node in module.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "main" for t in node.targets):
            call = node.value
            if isinstance(call, ast.Call):
                for kw in call.keywords:
                    if kw.arg == "commands" and isinstance(kw.value, ast.Dict):
                        commands = [k.value for k in kw.value.keys if isinstance(k, ast.Constant)]
        if isinstance(node, ast.ClassDef) and node.name == "DefaultGroup":
            for sub in ast.walk(node):
                if isinstance(sub, ast.Return) and isinstance(sub.value, ast.Tuple) and sub.value.elts:
                    default = _string(sub.value.elts[0]) or default
    return {"subcommands": commands, "default_subcommand": default}


# --------------------------------------------------------------------------------------------- the LLM API


def llm_api(src: Source) -> dict[str, Any]:
    """Every model class of ``llm_args.py`` (fields, bases, decoding type) and what the YAML merge accepts."""
    module = src.module(LLM_ARGS)
    classes: dict[str, Any] = {}
    decoding: dict[str, str] = {}
    for node in module.body:
        if not isinstance(node, ast.ClassDef):
            continue
        fields: dict[str, Any] = {}
        for stmt in node.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            name = stmt.target.id
            annotation = ast.unparse(stmt.annotation)
            if annotation.startswith("ClassVar"):
                if name == "decoding_type":
                    decoding[str(_field_default(stmt)[1])] = node.name
                continue
            if name.startswith("_"):
                continue
            known, default = _field_default(stmt)
            field: dict[str, Any] = {"annotation": annotation}
            if known:
                field["default"] = default
            elif default is not None:
                field["default_expr"] = default
            choices = _literal_choices(stmt.annotation)
            if choices is not None:
                field["choices"] = choices
            description = _field_description(stmt)
            if description:
                field["description"] = description
            fields[name] = field
        if fields:
            classes[node.name] = {"bases": [ast.unparse(b) for b in node.bases], "fields": fields}
    mapping: dict[str, str] = {}
    for node in ast.walk(module):
        if isinstance(node, ast.FunctionDef) and node.name == "update_llm_args_with_extra_dict":
            for sub in ast.walk(node):
                if (
                    isinstance(sub, ast.Assign)
                    and isinstance(sub.value, ast.Dict)
                    and any(isinstance(t, ast.Name) and t.id == "field_mapping" for t in sub.targets)
                ):
                    mapping = {
                        str(_string(k)): ast.unparse(v) for k, v in zip(sub.value.keys, sub.value.values, strict=True)
                    }
    return {
        "source": LLM_ARGS,
        "args_classes": {"pytorch": "TorchLlmArgs", "_autodeploy": "TorchLlmArgs", "tensorrt": "TrtLlmArgs"},
        "extra_dict_field_types": mapping,
        "speculative_decoding_types": dict(sorted(decoding.items())),
        "classes": classes,
    }


def _fields_of(api: dict[str, Any], cls: str) -> dict[str, Any]:
    """A class's fields with its bases' (the base first, the class's own over them)."""
    entry = api["classes"].get(cls)
    if entry is None:
        return {}
    out: dict[str, Any] = {}
    for base in entry["bases"]:
        out.update(_fields_of(api, base))
    out.update(entry["fields"])
    return out


def _class_of(annotation: str, api: dict[str, Any]) -> str | None:
    """The model class a field holds: ``Optional[MoeConfig]`` -> ``MoeConfig``."""
    for name in sorted(api["classes"], key=len, reverse=True):
        if name in annotation.replace("Optional[", "[").replace("]", " ").replace("[", " ").split():
            return name
    return None


def yaml_options(api: dict[str, Any]) -> list[dict[str, Any]]:
    """The :data:`YAML_KEYS` as pseudo-options ``--KEY.SUB`` read from the PyTorch args class."""
    out: list[dict[str, Any]] = []
    top = _fields_of(api, api["args_classes"]["pytorch"])
    for key in YAML_KEYS:
        head, _, sub = key.partition(".")
        field = top.get(head)
        if field is None:
            continue
        if sub:
            if head == "speculative_config":
                owner = "MTPDecodingConfig" if sub == "num_nextn_predict_layers" else "DecodingBaseConfig"
                if sub == "decoding_type":
                    field = {
                        "annotation": "str",
                        "choices": sorted(api["speculative_decoding_types"]),
                        "description": "Which speculative decoding config the YAML block builds (its class's "
                        "decoding_type).",
                    }
                else:
                    field = _fields_of(api, owner).get(sub)
            else:
                owner = _class_of(field["annotation"], api) or ""
                field = _fields_of(api, owner).get(sub)
            if field is None:
                continue
        annotation = field["annotation"]
        kind = (
            "bool"
            if "bool" in annotation and "int" not in annotation
            else "int"
            if "int" in annotation and "float" not in annotation
            else "float"
            if "float" in annotation
            else "str"
        )
        choices = field.get("choices")
        if kind == "bool":
            choices = ["true", "false"]
        out.append(
            {
                "flags": [f"--{key}"],
                "dest": key,
                "action": "store",
                "nargs": None,
                "choices": [str(c) for c in choices] if choices is not None else None,
                "default": field.get("default"),
                "type": kind if kind != "bool" else "str",
                "required": False,
                "help": field.get("description", ""),
                "llm_api_key": key,
                "llm_api_type": kind,
            }
        )
    return out


# --------------------------------------------------------------------------------------------- HTTP


def http_facts(src: Source) -> dict[str, Any]:
    """Routes, health, version, model card, metrics and how the port is bound, from the server's source."""
    module = src.module(OPENAI_SERVER)
    routes: list[dict[str, Any]] = []
    for node in ast.walk(module):
        if isinstance(node, ast.FunctionDef) and node.name == "register_routes":
            for sub in ast.walk(node):
                if isinstance(sub, ast.Call) and ast.unparse(sub.func).endswith("add_api_route"):
                    path = _string(sub.args[0])
                    methods = next((ast.literal_eval(k.value) for k in sub.keywords if k.arg == "methods"), ["GET"])
                    if path:
                        routes.append({"path": path, "methods": methods, "line": sub.lineno})
    card: list[str] = []
    owned_by = None
    for name, assign in _class_fields(src.module(PROTOCOL), "ModelCard").items():
        card.append(name)
        if name == "owned_by":
            owned_by = _field_default(assign)[1]
    return {
        "routes": routes,
        "listens": "only once the model is loaded: launch_server binds the port first (a taken port fails "
        "at once), builds the LLM, then uvicorn serves the bound socket, so a loading server refuses connections",
        "health": {"path": "/health", "status_codes": [200, 503], "source": OPENAI_SERVER},
        "health_generate": {"path": "/health_generate", "status_codes": [200, 500], "source": OPENAI_SERVER},
        "version": {"path": "/version", "keys": ["version"], "source": OPENAI_SERVER},
        "models": {"path": "/v1/models", "card_fields": card, "owned_by": owned_by, "source": PROTOCOL},
        "metrics": {
            "path": "/metrics",
            "format": "JSON: a list of the executor's iteration stats (not Prometheus text)",
            "source": OPENAI_SERVER,
        },
        "server_info": {"path": "/server_info", "keys": ["disaggregated_params"], "source": OPENAI_SERVER},
    }


# --------------------------------------------------------------------------------------------- texts


def texts(src: Source, click_dir: Path | None, version: str) -> dict[str, Any]:
    out = record_python_probes(Tree(f"tensorrt_llm {version}", src.root), TRTLLM_PROBES, "tensorrt_llm/")
    if click_dir is not None:
        meta = next(click_dir.parent.glob("click-*.dist-info"), None)
        label = f"click {meta.name.removesuffix('.dist-info').split('-')[1]}" if meta else "click"
        out.update(record_python_probes(Tree(label, click_dir.parent), CLICK_PROBES, "click/"))
    vllm = sorted(CONTRACTS.glob("vllm-*.json"))
    if vllm:
        ready = json.loads(vllm[-1].read_text(encoding="utf-8"))["texts"].get("ready")
        if ready:
            out["ready"] = {**ready, "kind": "info: uvicorn serves the bound socket (the model is loaded)"}
            for key in ("uvicorn_started", "uvicorn_waiting"):
                entry = json.loads(vllm[-1].read_text(encoding="utf-8"))["texts"].get(key)
                if entry:
                    out[key] = entry
    return out


# --------------------------------------------------------------------------------------------- main


def record(source: Path, origin: str, commit: str, click_dir: Path | None) -> dict[str, Any]:
    src = Source(source)
    version = src.version()
    parser, positionals = serve_command(src)
    api = llm_api(src)
    groups = cli_groups(src)
    files = {rel: _sha(source / rel) for rel in (SERVE, LLM_ARGS, OPENAI_SERVER, PROTOCOL, "tensorrt_llm/version.py")}
    found = texts(src, click_dir, version)
    return {
        "schema": 1,
        "engine": "trtllm",
        "version": version,
        "recorded_from": {
            "source": origin,
            "commit": commit,
            "files_sha256": files,
            "method": "static (ast) reading of the source; nothing imported or run",
        },
        "parser": {
            "prog": "trtllm-serve serve",
            "top_prog": "trtllm-serve",
            "usage": "trtllm-serve serve [OPTIONS] MODEL",
            "allow_abbrev": False,
            "parser_kind": "click",
            "positionals": positionals,
            **groups,
            "options": [*parser["options"], *yaml_options(api)],
        },
        "llm_api": api,
        "http": http_facts(src),
        "server_info": {"fields": [], "extra": [], "sources": []},
        "ready_line": found.get("ready"),
        "texts": found,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", type=Path, required=True, help="a TensorRT-LLM source tree (holds tensorrt_llm/)")
    p.add_argument("--origin", required=True, help="where the tree came from, for recorded_from")
    p.add_argument("--commit", required=True, help="the commit (or tag) of the tree")
    p.add_argument("--click", type=Path, default=None, help="click's package folder (default: the one importable)")
    p.add_argument("--out", type=Path, default=CONTRACTS)
    args = p.parse_args(argv)
    click_dir = args.click
    if click_dir is None:
        import click

        click_dir = Path(click.__file__).resolve().parent
    contract = record(args.source, args.origin, args.commit, click_dir)
    out = args.out / f"trtllm-{contract['version']}.json" if args.out.is_dir() else args.out
    out.write_text(json.dumps(contract, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    print(f"wrote {out}: {len(contract['parser']['options'])} options, {len(contract['texts'])} texts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
