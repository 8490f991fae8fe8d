"""The vLLM texts and HTTP facts a diagnosis and a simulator need, read from the vLLM wheel's source.

Used by ``tools/record_vllm_contract.py``. Texts are found with the same probes as SGLang's
(``sglang_texts.Probe``/``record_python_probes``: a literal or f-string in the wheel, with its file,
line, how it is emitted and its template). HTTP facts are read from the route modules with ``ast``:
which status codes ``/health`` answers, the keys of ``/version`` and ``/server_info``, the fields of a
``/v1/models`` card, the env switch that mounts ``/server_info``, and every ``vllm:*`` Prometheus metric
with its kind (a counter is exposed with ``_total`` appended).
"""

from __future__ import annotations

import ast
import errno
import os
import re
from typing import Any

from sglang_texts import Probe, Tree, python_strings_line

VLLM_PROBES: tuple[Probe, ...] = (
    Probe(
        "api_server_starting",
        ("Starting vLLM server on",),
        "info: the engine is up, the API server is about to serve (routes, then uvicorn's lines follow)",
        fills={"listen_address": "http://0.0.0.0:8000"},
        prefer=("vllm/entrypoints/launchers/api_server/entry.py",),
    ),
    Probe(
        "server_version",
        ("vLLM server version ", "serving model"),
        "info, first line of a launch (plain-text form; a terminal gets an ASCII-art banner instead)",
        prefer=("vllm/entrypoints/common/startup.py",),
    ),
    Probe(
        "non_default_args",
        ("non-default args: ",),
        "info: the command line's non-default settings (secrets redacted)",
        prefer=("vllm/entrypoints/common/startup.py",),
    ),
    Probe(
        "route_line",
        ("Route: ", "Methods: "),
        "info: one per route, after routes_header",
        prefer=("vllm/entrypoints/launchers/launcher.py",),
    ),
    Probe(
        "engine_core_failed",
        ("EngineCore failed to start.",),
        "error in the engine core process, followed by its traceback",
        prefer=("vllm/v1/engine/core.py",),
    ),
    Probe(
        "routes_header",
        ("Available routes are:",),
        "info: printed just before uvicorn starts listening",
        prefer=("vllm/entrypoints/launchers/launcher.py",),
    ),
    Probe(
        "kv_cache_no_memory",
        ("No available memory for the cache blocks.",),
        "fatal: nothing left for the KV cache after weights and activations (OOM at start-up)",
        fills={"hint": "Try increasing `gpu_memory_utilization` when initializing the engine."},
        prefer=("vllm/v1/core/kv_cache_planning.py",),
        emitted="raise",
    ),
    Probe(
        "kv_cache_memory_hint",
        ("Try increasing `gpu_memory_utilization` when initializing the engine",),
        "the hint filled into kv_cache_no_memory / kv_cache_too_small on a GPU",
        prefer=("vllm/v1/core/kv_cache_planning.py",),
    ),
    Probe(
        "kv_cache_too_small",
        ("To serve at least one request with the model's max seq len",),
        "fatal: the KV cache cannot hold one request of max_model_len",
        fills={
            "max_model_len": "262144",
            "format_gib(needed_memory)": "12.0",
            "format_gib(available_memory)": "3.5",
            "estimated_msg": "",
            "hint": "Try increasing `gpu_memory_utilization` when initializing the engine.",
        },
        prefer=("vllm/v1/core/kv_cache_planning.py",),
        emitted="raise",
    ),
    Probe(
        "engine_core_init_failed",
        ("Engine core initialization failed.",),
        "fatal wrapper in the API server process: an engine core process died while starting",
        fills={"finished": "{'EngineCore_DP0': 1}"},
        prefer=("vllm/v1/engine/utils.py",),
        emitted="raise",
    ),
    Probe(
        "engine_dead_client",
        ("The server had an error while processing your request.",),
        "what a client is answered (HTTP 500) once the engine core died",
        prefer=("vllm/v1/engine/exceptions.py",),
    ),
    Probe(
        "engine_dead",
        ("EngineCore encountered an issue.",),
        "fatal: the engine core died while serving (/health answers 503 from then on)",
        prefer=("vllm/v1/engine/exceptions.py",),
    ),
    Probe(
        "moe_backend_unsupported",
        ("MoE ", "' does not support the ", "deployment configuration"),
        "fatal: the --moe-backend chosen has no kernel for this model/GPU",
        fills={"self.name": "NvFp4", "lora": "", "backend.value": "FLASHINFER_TRTLLM", "since": ""},
        prefer=("vllm/model_executor/layers/fused_moe/oracle/base.py",),
    ),
    Probe(
        "moe_kernel_reason",
        ("kernel does not support 1",),
        "the reason appended to moe_backend_unsupported (' since ' + this)",
        prefer=("vllm/model_executor/layers/fused_moe/modular_kernel.py",),
    ),
    Probe(
        "moe_kernel_reason_device",
        ("current device 1",),
        "the reason a kernel gives for a GPU it was not built for (filled into moe_kernel_reason)",
        prefer=("vllm/model_executor/layers/fused_moe/modular_kernel.py",),
    ),
    Probe(
        "nvfp4_linear_no_kernel",
        ("Failed to find a kernel that can implement the NVFP4 linear layer",),
        "fatal: no NVFP4 GEMM kernel (--linear-backend) works on this GPU; the reasons follow, one per line",
        prefer=("vllm/model_executor/kernels/linear/__init__.py",),
        emitted="raise",
    ),
    Probe(
        "linear_backend_missing",
        ("was requested but no", "kernel exists for"),
        "fatal: --linear-backend names a backend with no kernel for this layer type",
        fills={"linear_backend": "flashinfer_cudnn"},
        prefer=("vllm/model_executor/kernels/linear/__init__.py",),
        emitted="raise",
    ),
    Probe(
        "model_not_found",
        ("Invalid repository ID or local directory specified:",),
        "fatal: the model is neither a Hugging Face repo id nor a local folder with a config",
        fills={"model": "no/such-model"},
        prefer=("vllm/transformers_utils/config.py",),
    ),
)

UVICORN_PROBES: tuple[Probe, ...] = (
    Probe(
        "uvicorn_started",
        ("Started server process",),
        "info: uvicorn starts serving the (already bound) socket",
        prefer=("uvicorn/server.py",),
    ),
    Probe(
        "uvicorn_waiting",
        ("Waiting for application startup.",),
        "info: uvicorn runs the app's lifespan startup",
        prefer=("uvicorn/lifespan/on.py",),
    ),
    Probe(
        "ready",
        ("Application startup complete.",),
        "info: uvicorn serves (vLLM's engine was ready before it started listening)",
        prefer=("uvicorn/lifespan/on.py",),
    ),
)


# --------------------------------------------------------------------------------------------- routes


def _route_functions(source: str) -> dict[str, ast.AST]:
    """``@router.get("/health")`` -> {"/health": the handler}."""
    out: dict[str, ast.AST] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for deco in node.decorator_list:
            if (
                isinstance(deco, ast.Call)
                and isinstance(deco.func, ast.Attribute)
                and deco.func.attr in ("get", "post", "api_route")
                and deco.args
                and isinstance(deco.args[0], ast.Constant)
            ):
                out[str(deco.args[0].value)] = node
    return out


def _find(tree: Tree, suffix: str) -> str | None:
    return next((n for n in tree.names() if n.endswith(suffix)), None)


def _dict_keys(node: ast.AST) -> list[str]:
    keys: list[str] = []
    for inner in ast.walk(node):
        if isinstance(inner, ast.Dict):
            keys += [k.value for k in inner.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
    return list(dict.fromkeys(keys))


def http_facts(tree: Tree) -> dict[str, Any]:
    """What the API server answers, each fact with the file it was read from."""
    facts: dict[str, Any] = {}
    health_file = _find(tree, "vllm/entrypoints/serve/instrumentator/health.py")
    if health_file:
        handler = _route_functions(tree.read_text(health_file)).get("/health")
        codes = sorted(
            {
                int(kw.value.value)
                for n in ast.walk(handler)
                if isinstance(n, ast.Call)
                for kw in n.keywords
                if kw.arg == "status_code" and isinstance(kw.value, ast.Constant)
            }
            if handler
            else set()
        )
        handlers = [ast.unparse(h.type) for n in ast.walk(handler) if isinstance(n, ast.Try) for h in n.handlers]
        facts["health"] = {
            "path": "/health",
            "status_codes": codes,
            "unhealthy_on": handlers,
            "listens": "only once the engine is ready: the port is bound early (setup_server) but listen() "
            "happens when uvicorn starts, so a loading server refuses connections",
            "source": health_file,
        }
    basic = _find(tree, "vllm/entrypoints/serve/instrumentator/basic.py")
    if basic:
        handler = _route_functions(tree.read_text(basic)).get("/version")
        facts["version"] = {"path": "/version", "keys": _dict_keys(handler) if handler else [], "source": basic}
    protocol = _find(tree, "vllm/entrypoints/serve/engine/protocol.py")
    if protocol:
        fields: list[str] = []
        for node in ast.walk(ast.parse(tree.read_text(protocol))):
            if isinstance(node, ast.ClassDef) and node.name == "ModelCard":
                fields = [
                    s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                ]
        facts["models"] = {"path": "/v1/models", "card_fields": fields, "source": protocol}
    info = _find(tree, "vllm/entrypoints/serve/dev/server_info/api_router.py")
    routers = _find(tree, "vllm/entrypoints/launchers/api_server/routers.py")
    if info:
        source = tree.read_text(info)
        handler = _route_functions(source).get("/server_info")
        formats = re.findall(r"Literal\[([^\]]+)\]", ast.unparse(handler)) if handler else []
        gate = None
        if routers and "envs.VLLM_SERVER_DEV_MODE" in tree.read_text(routers):
            gate = "VLLM_SERVER_DEV_MODE=1"
        facts["server_info"] = {
            "path": "/server_info",
            "query": {"config_format": [s.strip().strip("'\"") for s in formats[0].split(",")] if formats else []},
            "keys": _dict_keys(handler) if handler else [],
            "mounted_only_with": gate,
            "source": f"{info}; gate in {routers}",
        }
    envs = _find(tree, "vllm/envs.py")
    if envs:
        m = re.search(r'"VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "(\d+)"', tree.read_text(envs))
        facts["keep_alive_s"] = {"value": int(m.group(1)) if m else None, "env": "VLLM_HTTP_TIMEOUT_KEEP_ALIVE"}
    facts["metrics"] = metric_names(tree)
    return facts


_KINDS = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram", "Info": "info"}


def metric_names(tree: Tree) -> dict[str, Any]:
    """Every ``vllm:*`` metric created in the wheel: its kind and the names ``/metrics`` exposes."""
    found: dict[str, dict[str, Any]] = {}
    for name in tree.names():
        if not (name.startswith("vllm/") and name.endswith(".py")):
            continue
        source = tree.read_text(name)
        if '"vllm:' not in source:
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.List):
                # ``counter_specs = [("vllm:spec_decode_num_drafts", "..."), ...]`` (spec_decode/metrics.py)
                target = ast.unparse(node.targets[0]).lower()
                kind = next((k for word, k in _KINDS.items() if word.lower() in target), None)
                for item in node.value.elts if kind else []:
                    first = item.elts[0] if isinstance(item, ast.Tuple) and item.elts else None
                    if isinstance(first, ast.Constant) and str(first.value).startswith("vllm:"):
                        metric = str(first.value)
                        exposed = [metric + "_total"] if kind == "counter" else [metric]
                        found.setdefault(metric, {"kind": kind, "exposed": exposed, "source": f"{name}:{item.lineno}"})
                continue
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            fname = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            kind = next((k for word, k in _KINDS.items() if word.lower() in fname.lower()), None)
            if kind is None:
                continue
            for kw in node.keywords:
                if kw.arg == "name" and isinstance(kw.value, ast.Constant) and str(kw.value.value).startswith("vllm:"):
                    metric = str(kw.value.value)
                    exposed = [metric + "_total"] if kind == "counter" else [metric]
                    if kind == "histogram":
                        exposed = [metric + s for s in ("_bucket", "_sum", "_count")]
                    found.setdefault(metric, {"kind": kind, "exposed": exposed, "source": f"{name}:{node.lineno}"})
    return dict(sorted(found.items()))


def port_in_use(tree: Tree) -> dict[str, Any] | None:
    """vLLM binds its HTTP socket itself before loading (``create_server_socket``): a taken port is the
    plain ``OSError`` of ``socket.bind`` ending a traceback, before any weight is loaded."""
    name = _find(tree, "vllm/entrypoints/launchers/launcher.py")
    if name is None:
        return None
    line = python_strings_line(tree.read_text(name), "sock.bind(addr)")
    strerror = os.strerror(errno.EADDRINUSE)
    return {
        "text": str(OSError(errno.EADDRINUSE, strerror)),
        "source": f"{tree.label}: {name}:{line} (create_server_socket: socket.bind raises, uncaught); "
        f"strerror of errno {errno.EADDRINUSE} from this host's libc",
        "line": line,
        "kind": "fatal: the HTTP port is taken (at once, before loading)",
        "emitted": "raise OSError",
    }
