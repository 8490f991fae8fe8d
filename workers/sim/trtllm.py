"""``python -m workers.sim.trtllm serve MODEL [TensorRT-LLM options]``: a simulated ``trtllm-serve``.

The TensorRT-LLM personality of the simulator. Its options, texts and HTTP facts come from the contract
recorded from TensorRT-LLM's source (``workers/engines/contracts/trtllm-<v>.json``;
``--sim-trtllm-version`` / ``BENCHBOT_SIM_TRTLLM_VERSION``, default the newest recorded), and it lives like
the real server (``tensorrt_llm/commands/serve.py`` and ``serve/openai_server.py``):

1. **Parse** as click does: ``serve`` is optional (the group's default command), option names match
   exactly and keep their underscores, a flag takes no value, a choice is checked (``--backend trt`` is
   the alias of ``tensorrt``). A bad command line prints click's usage, hint and ``Error: ...`` line with
   the recorded texts and exits 2. ``--config`` / ``--extra_llm_api_options`` is read as the LLM API YAML
   (benchbot writes JSON, which is YAML): a key the recorded LLM API lacks fails like pydantic's
   ``extra = "forbid"``, an unknown ``speculative_config.decoding_type`` with the recorded text.
2. **Bind, no listener.** ``launch_server`` binds the port first (a taken port ends the launch with the
   recorded ``Failed to bind socket ...``, exit 1) and uvicorn listens only once the LLM is built: a client
   gets *connection refused* while the model loads.
3. **Load**: one MPI rank per TP rank as child processes, the fake GPUs (``registry``) holding their memory.
   Failure modes end the launch with recorded texts: a model path that is no folder (huggingface_hub's
   ``Repo id must be ...``), ``moe_config.backend TRTLLM`` on a GPU outside SM100/SM103 (the recorded
   ``TRTLLMGenFusedMoE requires SM100 or SM103, got SM120``), weights that leave no room for one sequence
   of KV cache (``Impossible to fit in any sequence in kvCache``).
4. **Serve**: uvicorn's lines, then ``/health`` (200; 503 with the recorded text once the executor died:
   ``--sim-engine-dies-after-s``), ``/health_generate``, ``/version``, ``/v1/models`` (``owned_by:
   tensorrt_llm``), ``/metrics`` (a JSON list of iteration stats, held open as the real one holds it),
   ``/perf_metrics``, ``/server_info``, ``/v1/completions`` and ``/v1/chat/completions``. Generation, timing
   and the eval answers are the vLLM personality's (``workers/sim/vllm.py``'s server over the shared
   ``engine``/``perf``/``answers`` models), fed the equivalent config: TensorRT-LLM's MoE kernels are its own,
   so the sim gives them no accuracy penalty it has no evidence for.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import uvloop
from aiohttp import web

from workers.engines.contract import Contract, Option, load_contract, recorded_versions
from workers.engines.trtllm import flags as trtllm_flags
from workers.engines.trtllm import processes as trtllm_processes
from workers.errors import BenchbotError
from workers.sim import registry
from workers.sim.children import ChildProcesses
from workers.sim.engine import BatchScheduler
from workers.sim.gpu_load import LoadPublisher
from workers.sim.profile import load_profile, model_spec_for
from workers.sim.texts import say
from workers.sim.vllm import Settings, VllmServer, _bind, _gpu_ids, _model_missing, _wait
from workers.sim.vllm_config import SM100_FAMILY

VERSION_ENV = "BENCHBOT_SIM_TRTLLM_VERSION"
ACTIVATION_GIB = 2.0  # the activations' profile besides the weights (per GPU)
KV_BYTES_PER_TOKEN = 65536
#: TensorRT-LLM's MoE backends as the shared models name kernels: its own implementations, not FlashInfer's
#: (so none of the FlashInfer findings in answers.py applies to them).
MOE_KERNELS = {"AUTO": "trtllm_cutlass", "CUTLASS": "trtllm_cutlass", "WIDEEP": "trtllm_cutlass"}
#: How long a ``/metrics`` read waits for the executor's next iteration stat before it answers: the server's
#: ``get_stats_async(2)``, whose ``IterationResult`` reads its queue with ``get(timeout=2)`` until one times out.
STATS_QUIET_S = 2.0
#: How often the simulated executor iterates while requests run (one stat each, when stats are on).
ITERATION_S = 0.05
TOKENS_PER_BLOCK = 32
#: The newest stats a read returns (the executor's own queue of them is bounded too).
MAX_GATHERED = 1000


def default_version() -> str:
    versions = recorded_versions("trtllm")
    if not versions:
        raise BenchbotError("no TensorRT-LLM contract is recorded (workers/engines/contracts/trtllm-*.json)")
    return versions[-1]


def _env_float(env: Mapping[str, str], name: str, default: float) -> float:
    try:
        return float(env.get(name) or default)
    except ValueError:
        return default


def sim_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    """The simulator's own options; never abbreviated (TensorRT-LLM's options are matched exactly)."""
    p = argparse.ArgumentParser(prog="trtllm-serve (simulated)", add_help=False, allow_abbrev=False)
    p.add_argument("--sim-trtllm-version", default=env.get(VERSION_ENV) or default_version())
    p.add_argument("--sim-profile", default=None, help="GPU profile (workers/sim/profile.py)")
    p.add_argument("--sim-load-s", type=float, default=_env_float(env, "BENCHBOT_SIM_STARTUP_S", 2.0))
    p.add_argument("--sim-state-dir", default=None)
    p.add_argument("--sim-timing", choices=["model", "fixed"], default=env.get("BENCHBOT_SIM_TIMING") or "model")
    p.add_argument("--sim-ttft-ms", type=float, default=_env_float(env, "BENCHBOT_SIM_TTFT_MS", 30.0))
    p.add_argument("--sim-itl-ms", type=float, default=_env_float(env, "BENCHBOT_SIM_ITL_MS", 10.0))
    p.add_argument("--sim-seed", type=int, default=0)
    p.add_argument("--sim-accept-rate", type=float, default=0.72)
    p.add_argument("--sim-engine-dies-after-s", type=float, default=None, help="the executor dies once ready")
    p.add_argument("--version", action="store_true", help="print the imitated version (benchbot's probe)")
    return p


# --------------------------------------------------------------------------------------------- click


class UsageError(Exception):
    """A command line click refuses: the message after ``Error: ``."""


def _convert(opt: Option, value: str, contract: Contract) -> object:
    """A value as click converts it for ``opt`` (int, float, a choice with its aliases)."""
    name = opt.name
    if opt.choices is not None and value not in opt.choices:
        real = [c for c in opt.choices if c not in (opt_aliases(contract, opt))]
        shown = ", ".join(repr(c) for c in real)
        message = contract.text("click_not_one_of") or "{value!r} is not one of {choices}."
        hint = contract.text("click_invalid_value") or "Invalid value for {param_hint}: {message}"
        raise UsageError(hint.format(param_hint=f"'{name}'", message=message.format(value=value, choices=shown)))
    if opt.type in ("int", "float"):
        try:
            return int(value) if opt.type == "int" else float(value)
        except ValueError:
            kind = "integer" if opt.type == "int" else "float"
            hint = contract.text("click_invalid_value") or "Invalid value for {param_hint}: {message}"
            raise UsageError(hint.format(param_hint=f"'{name}'", message=f"{value!r} is not a valid {kind}.")) from None
    return opt_aliases(contract, opt).get(value, value)


def opt_aliases(contract: Contract, opt: Option) -> dict[str, str]:
    """``ChoiceWithAlias``'s aliases (``trt`` -> ``tensorrt``), from the raw recorded option."""
    return _aliases(contract.version).get(opt.dest, {})


def _aliases(version: str) -> dict[str, dict[str, str]]:
    from workers.engines.contract import contract_path

    data = json.loads(contract_path("trtllm", version).read_text(encoding="utf-8"))
    return {o["dest"]: dict(o["aliases"]) for o in data["parser"]["options"] if o.get("aliases")}


def click_parse(words: Sequence[str], contract: Contract) -> dict[str, object]:
    """``serve``'s words -> ``{dest: value}`` (defaults included, ``model`` the positional), as click parses."""
    options = {f: o for o in trtllm_flags.cli_options(contract) for f in o.flags}
    values: dict[str, object] = {o.dest: o.default for o in trtllm_flags.cli_options(contract) if o.action != "help"}
    positionals: list[str] = []
    i = 0
    items = list(words)
    while i < len(items):
        word = items[i]
        if word.startswith("-") and len(word) > 1:
            name, eq, inline = word.partition("=")
            opt = options.get(name)
            if opt is None:
                text = contract.text("click_no_such_option") or "No such option {name!r}."
                raise UsageError(text.format(name=name))
            if not opt.takes_value:
                values[opt.dest] = True
            else:
                if eq:
                    raw = inline
                else:
                    i += 1
                    if i >= len(items):
                        text = contract.text("click_requires_argument") or "Option {name!r} requires an argument."
                        raise UsageError(text.format(name=name))
                    raw = items[i]
                value = _convert(opt, raw, contract)
                if opt.action == "append":
                    before = values.get(opt.dest)
                    values[opt.dest] = [*(before if isinstance(before, list) else []), value]
                else:
                    values[opt.dest] = value
        else:
            positionals.append(word)
        i += 1
    if not positionals:
        text = contract.text("click_missing_argument") or "Missing argument"
        raise UsageError(f"{text} 'MODEL'.")
    if len(positionals) > 1:
        raise UsageError(f"Got unexpected extra argument ({positionals[1]})")
    values["model"] = positionals[0]
    return values


def usage_error(contract: Contract, message: str) -> int:
    """click's output for a usage error (usage line, help hint, ``Error: ...``) on stderr; exit code 2."""
    prefix = contract.text("click_error_prefix") or "Error: {message}"
    sys.stderr.write(
        f"Usage: {contract.prog} [OPTIONS] MODEL\nTry '{contract.prog} --help' for help.\n\n"
        f"{prefix.format(message=message)}\n"
    )
    sys.stderr.flush()
    return 2


# --------------------------------------------------------------------------------------------- the YAML


class LlmArgsError(Exception):
    """The ``--config`` document the LLM API refuses: the lines a traceback ends with."""


def _fields(api: Any, cls: str) -> Any:  # api: the contract's JSON
    entry = api["classes"].get(cls)
    if entry is None:
        return {}
    out: dict[str, object] = {}
    for base in entry["bases"]:
        out.update(_fields(api, base))
    out.update(entry["fields"])
    return out


def _field_class(annotation: str, api: Any) -> str | None:
    words = annotation.replace("[", " ").replace("]", " ").replace(",", " ").split()
    return next((w for w in words if w in api["classes"]), None)


def check_llm_args(document: Mapping[str, object], contract: Contract) -> None:
    """Refuse what ``TorchLlmArgs(**document)`` would: keys it lacks (``extra = "forbid"``), and a
    speculative ``decoding_type`` with no config class (the recorded ``invalid_decoding_type`` text)."""
    from workers.engines.contract import contract_path

    api = json.loads(contract_path("trtllm", contract.version).read_text(encoding="utf-8"))["llm_api"]
    top = _fields(api, api["args_classes"]["pytorch"])
    for key, value in document.items():
        if key not in top:
            raise LlmArgsError(
                f"pydantic_core._pydantic_core.ValidationError: 1 validation error for TorchLlmArgs\n{key}\n"
                "  Extra inputs are not permitted [type=extra_forbidden]"
            )
        if key == "speculative_config" and isinstance(value, Mapping):
            kind = value.get("decoding_type")
            cls = api["speculative_decoding_types"].get(kind)
            if cls is None:
                raise LlmArgsError(f"ValueError: {say(contract, 'invalid_decoding_type', decoding_type=kind)}")
            inner = _fields(api, cls)
        elif isinstance(value, Mapping):
            inner = _fields(api, _field_class(top[key]["annotation"], api) or "")
        else:
            continue
        for sub in value:
            if sub != "decoding_type" and sub not in inner:
                raise LlmArgsError(
                    f"pydantic_core._pydantic_core.ValidationError: 1 validation error for {key}\n{key}.{sub}\n"
                    "  Extra inputs are not permitted [type=extra_forbidden]"
                )


# --------------------------------------------------------------------------------------------- logs


def log(msg: str, level: str = "I") -> None:
    """TensorRT-LLM's logger: ``[MM/DD/YYYY-HH:MM:SS] [TRT-LLM] [I] message`` (tensorrt_llm/logger.py)."""
    stamp = time.strftime("%m/%d/%Y-%H:%M:%S")
    stream = sys.stderr if level in ("E", "W", "F") else sys.stdout
    stream.write(f"[{stamp}] [TRT-LLM] [{level}] {msg}\n")
    stream.flush()


def traceback(exc_line: str, where: str) -> None:
    sys.stderr.write(f'Traceback (most recent call last):\n  File "{where}", in <module>\n{exc_line}\n')
    sys.stderr.flush()


# --------------------------------------------------------------------------------------------- server


def _table(document: Mapping[str, object], key: str) -> Mapping[str, object]:
    """A nested LLM API config of the document (``moe_config``...), {} when absent."""
    value = document.get(key)
    return value if isinstance(value, Mapping) else {}


def _text(value: object) -> str | None:
    return str(value) if value not in (None, "") else None


def _number(value: object, default: float) -> float:
    try:
        return float(value) if isinstance(value, (int, float, str)) and value != "" else default
    except ValueError:
        return default


def settings_from(values: Mapping[str, object], document: Mapping[str, object]) -> Settings:
    """The vLLM personality's settings for the equivalent config (its server does the serving)."""
    spec: Mapping[str, object] = _table(document, "speculative_config")
    moe = str(_table(document, "moe_config").get("backend") or "AUTO").upper()
    kv = _table(document, "kv_cache_config")
    raw: dict[str, object] = {
        "max_num_seqs": values.get("max_batch_size"),
        "max_num_batched_tokens": values.get("max_num_tokens"),
        "kv_cache_dtype": kv.get("dtype") if kv.get("dtype") not in (None, "auto") else None,
        "async_scheduling": not bool(document.get("disable_overlap_scheduler")),
    }
    layers = spec.get("num_nextn_predict_layers") or spec.get("max_draft_len")
    tokens = int(_number(layers, 1)) if spec else 0
    return Settings(
        model=str(values["model"]),
        served=str(values["model"]),
        host=_text(values.get("host")),
        port=int(_number(values.get("port"), 8000)),
        tp=int(_number(values.get("tensor_parallel_size"), 1)),
        moe_backend=MOE_KERNELS.get(moe, f"trtllm_{moe.lower()}"),
        linear_backend="trtllm_nvfp4",
        quantization=None,
        gpu_memory_utilization=_number(values.get("free_gpu_memory_fraction"), 0.9),
        max_model_len=int(_number(values.get("max_seq_len"), 0)) or None,
        spec_method=str(spec.get("decoding_type")).lower() if spec else None,
        spec_tokens=tokens,
        disable_custom_all_reduce=False,
        api_key=None,
        raw=raw,
    )


class TrtllmServer(VllmServer):
    """The HTTP surface of one simulated ``trtllm-serve`` (generation is the vLLM personality's)."""

    #: ``enable_iter_perf_stats`` (off by default): whether the executor records a stat per iteration.
    iter_stats = False
    #: A prompt was submitted since a read last drained the stats (``IterationResult.mark_undone``).
    stats_undone = False
    #: The executor's iteration counter (``IterationStats.iter``), counted as reads gather the iterations.
    iterations = 0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health_generate)
        r.add_get("/version", self.version)
        r.add_get("/v1/models", self.models)
        r.add_get("/metrics", self.iteration_stats)
        r.add_get("/perf_metrics", self.perf_metrics)
        r.add_get("/server_info", self.trtllm_server_info)
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat)
        return app

    async def health(self, request: web.Request) -> web.Response:
        if self.dead:
            return web.Response(status=503, text=say(self.contract, "health_unavailable"))
        return web.Response(status=200)

    async def health_generate(self, request: web.Request) -> web.Response:
        if self.dead:
            return web.Response(status=500, text="Generation health check failed")
        return web.Response(status=200, text="Generation health check OK")

    def card(self) -> dict[str, object]:
        card = {"id": self.cfg.served, "object": "model", "created": self.created, "owned_by": "tensorrt_llm"}
        fields = self.contract.http.get("models", {}).get("card_fields")
        return {k: v for k, v in card.items() if not fields or k in fields}

    async def completions(self, request: web.Request) -> web.StreamResponse:
        self.stats_undone = True  # every submission expects more stats (``_maybe_initialize_iteration_results``)
        return await super().completions(request)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        self.stats_undone = True
        return await super().chat(request)

    async def iteration_stats(self, request: web.Request) -> web.Response:
        """``/metrics``: the iteration stats gathered since the last read (JSON, not Prometheus), read as the real
        server reads them. Once a prompt was submitted, the read waits for the next stat until
        :data:`STATS_QUIET_S` pass without one: while requests run with stats on it is held open until the
        server has been quiet that long; with stats off it answers ``[]`` after that wait. With no prompt
        submitted since a read last drained them it answers ``[]`` at once."""
        gathered: deque[dict[str, object]] = deque(maxlen=MAX_GATHERED)
        if self.stats_undone:
            loop = asyncio.get_running_loop()
            quiet_since = loop.time()
            while loop.time() - quiet_since < STATS_QUIET_S:
                if self.iter_stats and (self.stats.running or self.stats.queued):
                    self.iterations += 1
                    gathered.append(self._iteration(self.iterations))
                    quiet_since = loop.time()
                await asyncio.sleep(ITERATION_S)
            self.stats_undone = False
        return web.json_response(list(gathered))

    def _iteration(self, number: int) -> dict[str, object]:
        """One iteration's stat, in the keys of TensorRT-LLM's ``IterationStats`` JSON."""
        st = self.stats
        blocks = max(1, self.kv_tokens // TOKENS_PER_BLOCK)
        used = round(blocks * (st.kv_usage_fn() if st.kv_usage_fn else 0.0))
        return {
            "iter": number,
            "timestamp": time.strftime("%m-%d-%Y %H:%M:%S"),
            "numActiveRequests": st.running,
            "numQueuedRequests": st.queued,
            "kvCacheStats": {
                "maxNumBlocks": blocks,
                "freeNumBlocks": blocks - used,
                "usedNumBlocks": used,
                "tokensPerBlock": TOKENS_PER_BLOCK,
            },
        }

    async def perf_metrics(self, request: web.Request) -> web.Response:
        return web.json_response([])

    async def trtllm_server_info(self, request: web.Request) -> web.Response:
        return web.json_response({"disaggregated_params": None})


# --------------------------------------------------------------------------------------------- lifecycle


def _read_config(path: str | None) -> dict[str, object]:
    """The ``--config`` document (benchbot writes JSON, a subset of YAML); {} without one."""
    if not path:
        return {}
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise LlmArgsError(f"{type(exc).__name__}: {exc}") from None
    return dict(data) if isinstance(data, dict) else {}


async def serve(contract: Contract, values: dict[str, object], ns: argparse.Namespace, env: Mapping[str, str]) -> int:
    try:
        document = _read_config(_text(values.get("extra_llm_api_options")))
        check_llm_args(document, contract)
    except LlmArgsError as exc:
        traceback(str(exc), "tensorrt_llm/llmapi/llm_args.py")
        return 1
    for key in document:
        log(say(contract, "overriding_field", field_name=key, extra_llm_str=""), "W")
    cfg = settings_from(values, document)
    profile = load_profile(ns.sim_profile)
    model = model_spec_for(cfg.model)
    pid = os.getpid()
    host = cfg.host or "localhost"
    try:
        sock = _bind(cfg.host, cfg.port)
    except OSError as exc:
        traceback(
            f"RuntimeError: {say(contract, 'port_in_use', host=host, port=cfg.port, e=exc)}",
            "tensorrt_llm/commands/serve.py",
        )
        return 1
    if _model_missing(cfg.model):
        sock.close()
        # huggingface_hub's wording (utils/_validators.py), as the real tier saw it from vLLM 0.32: not in
        # TensorRT-LLM's source, so not in its contract
        message = f"Repo id must be in the form 'repo_name' or 'namespace/repo_name': '{cfg.model}'."
        traceback(f"huggingface_hub.errors.HFValidationError: {message}", "huggingface_hub/utils/_validators.py")
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    state = registry.state_dir(ns.sim_state_dir)
    gpus = _gpu_ids(cfg.tp, profile.count, env)
    others = registry.used_mib_by_gpu(registry.live_entries(state), exclude_pid=pid)
    others_gib = max((others.get(g, 0) for g in gpus), default=0) / 1024.0
    weights = model.weight_gb / max(1, cfg.tp) * 0.931  # GB -> GiB
    free_after = profile.memory_gib - others_gib - weights - ACTIVATION_GIB
    kv_gib = max(0.0, free_after * cfg.gpu_memory_utilization)
    kv_tokens = int(kv_gib * 2**30 / KV_BYTES_PER_TOKEN)
    entry: dict[str, object] = {
        "pid": pid,
        "port": cfg.port,
        "host": cfg.host,
        "tp": cfg.tp,
        "gpus": gpus,
        "mem_mib": 0,
        "util": 0,
        "model": cfg.model,
        "profile": profile.name,
        "started": time.time(),
        "status": "Loading",
        "engine": "trtllm",
        "trtllm_version": contract.version,
        "procs": [],
    }
    children = ChildProcesses()
    server = TrtllmServer(contract, cfg, profile, model, ns, env, kv_tokens)
    server.iter_stats = bool(document.get("enable_iter_perf_stats"))
    runner: web.AppRunner | None = None
    t0 = time.time()
    load_s = max(0.0, ns.sim_load_s)
    moe = str(_table(document, "moe_config").get("backend") or "AUTO").upper()
    try:
        ranks = [(f"mpi4py.futures.server rank{r}", gpus[r] if r < len(gpus) else None) for r in range(1, cfg.tp)]
        children.start(ranks, ())
        entry["procs"] = children.as_registry()
        registry.register(state, entry)
        steps = 4
        for i in range(1, steps + 1):
            if await _wait(stop, t0 + load_s * i / (steps + 1) - time.time()):
                return 0
            entry["mem_mib"] = int(min(weights, profile.memory_gib) * 1024 * i / steps)
            registry.register(state, entry)
            if i == 2 and moe == "TRTLLM" and model.experts and profile.sm not in SM100_FAMILY:
                reason = say(contract, "trtllm_moe_needs_sm100", sm_version=profile.sm)
                log(reason, "W")
                traceback(f"RuntimeError: {reason}", "tensorrt_llm/_torch/modules/fused_moe/fused_moe_trtllm_gen.py")
                return 1
            if i == 3:
                log(say(contract, "weights_memory", **{"model_bytes / GB": weights}))
                if free_after <= 0:
                    entry_text = contract.texts.get("kv_cache_cannot_fit")
                    line = entry_text.log_line if entry_text is not None else None
                    traceback(line or "AssertionError", "tensorrt_llm/_torch/pyexecutor/resource_manager.py")
                    return 1
                log(say(contract, "kv_cache_estimate", **{"kv_cache_max_memory / GB": kv_gib}))
        if await _wait(stop, t0 + load_s - time.time()):
            return 0
        # --- ready: uvicorn serves the bound socket ----------------------------------------------------
        sock.listen(4096)
        sock.setblocking(False)
        runner = web.AppRunner(server.app(), access_log=None, handle_signals=False, keepalive_timeout=5)
        await runner.setup()
        await web.SockSite(runner, sock).start()
        if isinstance(server.scheduler, BatchScheduler):
            server.scheduler.start()
        sys.stdout.write(f"INFO:     {say(contract, 'uvicorn_started') % pid}\n")
        sys.stdout.write(f"INFO:     {say(contract, 'uvicorn_waiting')}\n")
        sys.stdout.write(f"INFO:     {say(contract, 'ready')}\n")
        sys.stdout.write(f"INFO:     Uvicorn running on http://{host}:{cfg.port} (Press CTRL+C to quit)\n")
        sys.stdout.flush()
        entry.update(status="ready", mem_mib=int((weights + ACTIVATION_GIB + kv_gib) * 1024))
        registry.register(state, entry)
        dies_at = None if ns.sim_engine_dies_after_s is None else time.time() + ns.sim_engine_dies_after_s

        def publish(**changes: object) -> None:
            entry.update(changes)
            registry.register(state, entry)

        load = LoadPublisher(server.stats, server.perf_model(), publish)  # nvidia-smi's telemetry
        while not stop.is_set():
            if dies_at is not None and not server.dead and time.time() >= dies_at:
                server.dead = True
                children.stop(timeout=0.5)
                log("Executor worker died", "E")
            if await _wait(stop, 0.2):
                break
            load.tick()
        return 0
    finally:
        registry.unregister(state, pid)
        children.stop(timeout=0.5)
        if isinstance(server.scheduler, BatchScheduler):
            await server.scheduler.stop()
        if runner is not None:
            await runner.cleanup()
        sock.close()


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m workers.sim.trtllm``; returns the exit code."""
    env = dict(os.environ)
    argv = sys.argv[1:] if argv is None else list(argv)
    sp = sim_parser(env)
    sim, rest = sp.parse_known_args(argv)
    known = recorded_versions("trtllm")
    if sim.sim_trtllm_version not in known:
        print(f"error: {sim.sim_trtllm_version!r} is not a recorded TensorRT-LLM version ({', '.join(known)})")
        return 2
    contract = load_contract("trtllm", sim.sim_trtllm_version)
    if sim.version:
        print(contract.version)
        return 0
    words = trtllm_processes.serve_args(["trtllm-serve", *rest])
    if words is None:
        return usage_error(contract, f"No such command '{rest[0] if rest else ''}'.")
    try:
        values = click_parse(words, contract)
    except UsageError as exc:
        return usage_error(contract, str(exc))
    try:
        return uvloop.run(serve(contract, values, sim, env))
    except BenchbotError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
