"""``python -m workers.sim.vllm serve MODEL [vLLM flags]``: a simulated ``vllm serve``.

The vLLM personality of the simulator. It takes its flags, texts and HTTP facts from the contract
recorded from the vLLM wheel (``workers/engines/contracts/vllm-<v>.json``; ``--sim-vllm-version`` /
``BENCHBOT_SIM_VLLM_VERSION``, default the newest recorded) and lives like the real server:

1. **Parse.** ``vllm``'s parser rebuilt from the contract: a top-level ``vllm`` parser with a ``serve``
   sub-parser holding every recorded option, prefix matching as recorded (``allow_abbrev``), and
   FlexibleArgumentParser's spellings (``--a_b``, ``--x.key v``). Errors read as vLLM's (an unknown flag
   is reported by ``vllm: error: unrecognized arguments``), exit 2. A ``--speculative-config`` that is not
   JSON is refused with the recorded ``speculative_config_bad_json`` line.
2. **Bind, no listener.** Like ``setup_server``, the HTTP socket is *bound* at once (a taken port ends the
   launch here with the recorded ``OSError``, exit 1) but ``listen()`` waits until the engine is ready:
   a client gets *connection refused* while the model loads, never a 503.
3. **Load.** The engine core and one worker per TP rank (``VLLM::EngineCore``, ``VLLM::Worker_TP<r>``) are
   started as child processes and the fake GPUs (``workers/sim/registry.py``, read by the ``nvidia-smi``
   stand-in) hold their memory. Failure modes end the launch with the recorded texts: a local model path
   that does not exist (``model_not_found``), ``--moe-backend flashinfer_trtllm`` or ``flashinfer_cutedsl``
   on a GPU outside the SM100 family (``moe_backend_unsupported`` + ``moe_kernel_reason``), weights that
   leave no room for the KV cache (``kv_cache_no_memory``); the API server then raises
   ``engine_core_init_failed``, exit 1.
4. **Serve.** The socket listens; the recorded ``api_server_starting`` line, the routes, and uvicorn's
   ready line are logged. ``/health`` is 200, ``/version``, ``/v1/models`` (``root``,
   ``max_model_len``), ``/metrics`` (``vllm:*``; the spec-decode counters move with ``--speculative-
   config``), ``/v1/completions`` and ``/v1/chat/completions`` (SSE, usage), and ``/server_info`` only with
   ``VLLM_SERVER_DEV_MODE=1``. Timing and the answers to benchbot's eval questions come from the models the
   SGLang personality uses, fed with the equivalent config (``vllm_config.py``): ``perf.PerfModel`` in
   ``engine.BatchScheduler`` (``--sim-timing model``, the default; ``fixed`` keeps the ttft/itl ground
   truth) and ``answers.Oracle`` with the quality of the kernels vLLM's flags pick.
   ``--sim-engine-dies-after-s`` kills the engine core: the recorded ``engine_dead`` line, ``/health`` 503,
   requests 500, and after vLLM's 5 s watchdog the server exits (unless ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvloop
from aiohttp import web

from workers.engines.contract import Contract, add_option, load_contract, recorded_versions
from workers.engines.vllm.flags import flexible_argv
from workers.errors import BenchbotError
from workers.sim import answers, ledger, registry, text, vllm_config
from workers.sim.children import ChildProcesses
from workers.sim.engine import LATENCY_BUCKETS, BatchScheduler, FixedScheduler, Sink, Stats, Stream
from workers.sim.gpu_load import LoadPublisher
from workers.sim.perf import PerfModel
from workers.sim.profile import GpuProfile, ModelSpec, load_profile, model_spec_for
from workers.sim.profiler import SimProfiler
from workers.sim.texts import say
from workers.sim.vllm_config import SM100_FAMILY, human_int

VERSION_ENV = "BENCHBOT_SIM_VLLM_VERSION"
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
WATCHDOG_S = 5.0  # vLLM's watchdog_loop checks the engine every 5 s and shuts the server down
SM100_ONLY_MOE = ("flashinfer_trtllm", "flashinfer_cutedsl")  # their NVFP4 kernels support the SM100 family only
KV_BYTES_PER_TOKEN = 65536  # the KV cache size line's token count (all layers, all TP ranks)


def default_version() -> str:
    versions = recorded_versions("vllm")
    if not versions:
        raise BenchbotError("no vLLM contract is recorded (workers/engines/contracts/vllm-*.json)")
    return versions[-1]


# --------------------------------------------------------------------------------------------- flags


def sim_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    """The simulator's own options; never abbreviated, so they cannot change vLLM's prefix matching."""
    p = argparse.ArgumentParser(prog="vllm (simulated)", add_help=False, allow_abbrev=False)
    p.add_argument("--sim-vllm-version", default=env.get(VERSION_ENV) or default_version())
    p.add_argument("--sim-profile", default=None, help="GPU profile (workers/sim/profile.py)")
    load_s = env.get("BENCHBOT_SIM_STARTUP_S") or "2.0"
    p.add_argument(
        "--sim-load-s",
        type=float,
        default=float(load_s) if load_s.replace(".", "", 1).isdigit() else 2.0,
        help="seconds to load before listening (env BENCHBOT_SIM_STARTUP_S, as the SGLang personality)",
    )
    p.add_argument("--sim-state-dir", default=None)
    p.add_argument(
        "--sim-timing",
        choices=["model", "fixed"],
        default=env.get("BENCHBOT_SIM_TIMING") or "model",
        help="model: SGLang's performance model for the equivalent config (vllm_config.py); fixed: ttft/itl",
    )
    p.add_argument("--sim-ttft-ms", type=float, default=_env_ms(env, "BENCHBOT_SIM_TTFT_MS", 30.0))
    p.add_argument(
        "--sim-itl-ms",
        type=float,
        default=_env_ms(env, "BENCHBOT_SIM_ITL_MS", 10.0),
        help="fixed timing: ms per decode step (one token without MTP)",
    )
    p.add_argument("--sim-seed", type=int, default=0)
    p.add_argument("--sim-accept-rate", type=float, default=0.72, help="fixed timing: per-draft-token acceptance (MTP)")
    p.add_argument("--sim-engine-dies-after-s", type=float, default=None, help="engine core dies once ready")
    return p


def _env_ms(env: Mapping[str, str], name: str, default: float) -> float:
    try:
        return float(env.get(name) or default)
    except ValueError:
        return default


def build_parser(contract: Contract) -> argparse.ArgumentParser:
    """``vllm`` with its ``serve`` sub-parser, rebuilt from the recorded options (see the module docstring)."""
    top = argparse.ArgumentParser(prog=contract.top_prog or "vllm", allow_abbrev=contract.allow_abbrev)
    top.add_argument("-v", "--version", action="version", version=contract.version)
    sub = top.add_subparsers(required=False, dest="subparser")
    serve = sub.add_parser("serve", usage=contract.usage, add_help=False, allow_abbrev=contract.allow_abbrev)
    for positional in contract.positionals:
        serve.add_argument(positional, nargs="?")
    for opt in contract.options:
        add_option(serve, opt)
    return top


@dataclass
class Settings:
    """What the simulated engine runs with, from the parsed command line."""

    model: str
    served: str
    host: str | None
    port: int
    tp: int
    moe_backend: str
    linear_backend: str
    quantization: str | None
    gpu_memory_utilization: float
    max_model_len: int | None
    spec_method: str | None
    spec_tokens: int
    disable_custom_all_reduce: bool
    api_key: str | None
    raw: dict[str, Any]


def _one_key(value: object) -> str | None:
    """``--api-key`` may be given more than once (a list): the server accepts the first here."""
    if isinstance(value, list):
        value = value[0] if value else None
    return str(value) if value else None


def _profiler_config(value: object) -> dict[str, object]:
    """``--profiler-config`` as vLLM reads it: a JSON object (the sim takes only that spelling)."""
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            return {}
        return parsed if isinstance(parsed, dict) else {}
    return {}


def settings_from(ns: argparse.Namespace, contract: Contract) -> Settings:
    raw = {k: v for k, v in vars(ns).items() if not k.startswith("sim_")}
    model = ns.model_tag or getattr(ns, "model", None) or "Qwen/Qwen3-0.6B"
    served = ns.served_model_name
    if isinstance(served, list):
        served = served[0] if served else None
    spec = ns.speculative_config
    if isinstance(spec, str):
        spec = json.loads(spec)
    util = getattr(ns, "gpu_memory_utilization", None)
    api_key = getattr(ns, "api_key", None)
    return Settings(
        model=model,
        served=served or model,
        host=ns.host,
        port=int(ns.port or 8000),
        tp=int(ns.tensor_parallel_size or 1),
        moe_backend=str(ns.moe_backend or "auto"),
        linear_backend=str(ns.linear_backend or "auto"),
        quantization=ns.quantization,
        gpu_memory_utilization=float(util) if util is not None else 0.92,
        max_model_len=None if ns.max_model_len is None else human_int(ns.max_model_len, 0) or None,
        spec_method=(spec or {}).get("method"),
        spec_tokens=int((spec or {}).get("num_speculative_tokens") or 0),
        disable_custom_all_reduce=bool(ns.disable_custom_all_reduce),
        api_key=_one_key(api_key),
        raw=raw,
    )


# --------------------------------------------------------------------------------------------- logs


class VllmLog:
    """vLLM's log format: ``(APIServer pid=N) INFO 12-03 10:00:00 [entry.py:139] message``; a recorded
    text logs the file and line it came from."""

    def __init__(self, contract: Contract, pid: int) -> None:
        self.contract = contract
        self.pid = pid

    def line(self, msg: str, *, level: str = "INFO", proc: str = "APIServer", where: str = "api_server.py:1") -> None:
        stamp = time.strftime("%m-%d %H:%M:%S")
        stream = sys.stderr if level in ("ERROR", "WARNING") else sys.stdout
        for part in msg.splitlines() or [""]:
            stream.write(f"({proc} pid={self.pid}) {level} {stamp} [{where}] {part}\n")
        stream.flush()

    def text(
        self,
        key: str,
        *,
        level: str = "INFO",
        proc: str = "APIServer",
        percent: tuple = (),
        fields: Mapping[str, object] | None = None,
        **values: object,
    ) -> str:
        """Log the recorded text ``key``: template fields from ``values`` (or ``fields``, for field names
        that are expressions in the source), a ``%s`` literal from ``percent``."""
        entry = self.contract.texts.get(key)
        msg = say(self.contract, key, **{**(fields or {}), **values})
        if percent:
            msg = msg % percent
        where = f"{Path(entry.source.split(': ', 1)[-1]).name}:{entry.line}" if entry and entry.line else "?"
        self.line(msg, level=level, proc=proc, where=where)
        return msg

    def traceback(self, exc_line: str, where: str) -> None:
        sys.stderr.write(f'Traceback (most recent call last):\n  File "{where}", in <module>\n{exc_line}\n')
        sys.stderr.flush()

    def raw(self, msg: str) -> None:
        sys.stdout.write(msg + "\n")
        sys.stdout.flush()


# --------------------------------------------------------------------------------------------- server


class VllmServer:
    """The HTTP surface and the counters of one simulated ``vllm serve``."""

    def __init__(
        self,
        contract: Contract,
        cfg: Settings,
        profile: GpuProfile,
        model: ModelSpec,
        ns: argparse.Namespace,
        env: Mapping[str, str],
        kv_tokens: int = 1,
    ) -> None:
        self.contract = contract
        self.cfg = cfg
        self.profile = profile
        self.model = model
        self.ns = ns
        self.env = env
        self.stats = Stats()
        self.kv_tokens = max(1, kv_tokens)
        self.max_model_len = cfg.max_model_len or model.context_len
        # the eval questions' answers, right, degraded or garbage by the kernels (answers.kernel_quality)
        self.oracle = answers.Oracle(vllm_config.quality(cfg, model, profile.sm))
        self.scheduler: FixedScheduler | BatchScheduler
        if ns.sim_timing == "fixed":
            itl = ns.sim_itl_ms / 1000.0 / self._mean_accept()  # MTP emits several tokens per step
            self.scheduler = FixedScheduler(self.stats, True, ns.sim_ttft_ms / 1000.0, itl)
        else:
            args = vllm_config.perf_args(cfg, model, profile)
            self.scheduler = BatchScheduler(
                self.stats,
                True,
                PerfModel(args, profile, model),
                args.max_running_requests,
                args.chunked_prefill_size,
                self.kv_tokens,
                40,
                model.hybrid,
                args.speculative_algorithm is not None,
                lambda idle: None,
                rank=None,
            )
            self.scheduler.quiet = True  # SGLang's batch log lines are not vLLM's
        self.dead = False
        self.created = int(time.time())
        self.spec = {"drafts": 0, "draft_tokens": 0, "accepted": 0}
        self.finished = {"stop": 0, "length": 0}
        self.profiler_config = _profiler_config(getattr(ns, "profiler_config", None))
        self.profiler = SimProfiler(cfg.tp, lambda: self.scheduler.forwards)

    def perf_model(self) -> PerfModel:
        """The performance model of this config (the scheduler's, or one built for telemetry in fixed timing)."""
        if isinstance(self.scheduler, BatchScheduler):
            return self.scheduler.perf
        return PerfModel(vllm_config.perf_args(self.cfg, self.model, self.profile), self.profile, self.model)

    def _mean_accept(self) -> float:
        k = self.cfg.spec_tokens if self.cfg.spec_method else 0
        a = self.ns.sim_accept_rate
        return sum(a**i for i in range(k + 1)) if k else 1.0

    def _count_spec(self, s: Stream) -> None:
        """A finished request's drafts: each step drafts k tokens and accepts a chained run of them. In
        model timing those are the scheduler's verify steps (the first token comes from the prefill);
        fixed timing emits one token at a time, so the steps are drawn here."""
        k = self.cfg.spec_tokens
        if not (self.cfg.spec_method and k):
            return
        if s.verify_ct:
            self.spec["drafts"] += s.verify_ct
            self.spec["draft_tokens"] += k * s.verify_ct
            self.spec["accepted"] += max(0, s.emitted - 1 - s.verify_ct)
            return
        left = s.emitted
        while left > 0:
            accepted = 0
            while accepted < k and s.rng.random() < self.ns.sim_accept_rate:
                accepted += 1
            step = min(left, accepted + 1)
            self.spec["drafts"] += 1
            self.spec["draft_tokens"] += k
            self.spec["accepted"] += step - 1
            left -= step

    def app(self) -> web.Application:
        middlewares = [*ledger.middlewares(), *([self._auth] if self.cfg.api_key else [])]
        app = web.Application(middlewares=middlewares, client_max_size=64 * 1024 * 1024)
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/version", self.version)
        r.add_get("/v1/models", self.models)
        r.add_get("/metrics", self.metrics)
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat)
        r.add_get("/ping", self.ping)  # SageMaker's health route, as the real server mounts it
        r.add_post("/ping", self.ping)
        r.add_get("/load", self.load)
        if self.env.get("VLLM_SERVER_DEV_MODE", "0") not in ("", "0"):
            r.add_get("/server_info", self.server_info)
        if self.profiler_config.get("profiler"):  # mounted only with --profiler-config naming a profiler
            r.add_post("/start_profile", self.start_profile)
            r.add_post("/stop_profile", self.stop_profile)
        return app

    async def start_profile(self, request: web.Request) -> web.Response:
        """``StartProfileRequest``: profile_prefix, delay_iterations, max_iterations (0: no limit)."""
        body: dict[str, object] = {}
        if request.can_read_body:
            try:
                raw = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError):
                return self._error("Invalid JSON body", 400, "BadRequestError")
            body = raw if isinstance(raw, dict) else {}
        prefix = body.get("profile_prefix")
        # As the real CPU build names them (a capture recorded by the real tier): each worker's
        # <prefix>_rank<r>.<ns>.pt.trace.json.gz, and the API server's own beside them.
        stamp, head = time.time_ns(), f"{prefix}_" if prefix else ""
        names = [f"{head}rank{r}.{stamp + r}.pt.trace.json.gz" for r in range(self.profiler.ranks)]
        names.append(f"{head}vm_{os.getpid()}.async_llm.{stamp}.pt.trace.json.gz")
        out = str(self.profiler_config.get("torch_profiler_dir") or "/tmp/vllm_profile")
        asked = body.get("max_iterations")
        steps = asked if isinstance(asked, int) and asked > 0 else 0
        try:
            self.profiler.start(out, names, steps or None)
        except ValueError:
            message = "A profiling session is already active. Call /stop_profile before starting another session."
            return self._error(message, 409, "Conflict")
        return web.Response(status=200)

    async def stop_profile(self, request: web.Request) -> web.Response:
        if self.profiler.active:
            self.profiler.stop()
        self.profiler.capture = None  # the session ends here even when max_iterations already wrote the files
        return web.Response(status=200)

    def routes(self) -> list[tuple[str, str]]:
        found = [("/health", "GET"), ("/version", "GET"), ("/v1/models", "GET"), ("/metrics", "GET")]
        found += [("/v1/completions", "POST"), ("/v1/chat/completions", "POST")]
        if self.env.get("VLLM_SERVER_DEV_MODE", "0") not in ("", "0"):
            found.append(("/server_info", "GET"))
        if self.profiler_config.get("profiler"):
            found += [("/start_profile", "POST"), ("/stop_profile", "POST")]
        return found

    @web.middleware
    async def _auth(self, request: web.Request, handler):
        if request.path.startswith("/v1") and request.headers.get("Authorization") != f"Bearer {self.cfg.api_key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    # -- info --------------------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self.dead else 200)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": self.contract.version})

    def card(self) -> dict[str, Any]:
        card = {
            "id": self.cfg.served,
            "object": "model",
            "created": self.created,
            "owned_by": "vllm",
            "root": self.cfg.model,
            "parent": None,
            "max_model_len": self.max_model_len,
            "permission": [
                {
                    "id": f"modelperm-{uuid.uuid4().hex}",
                    "object": "model_permission",
                    "created": self.created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }
        fields = self.contract.http.get("models", {}).get("card_fields")
        return {k: v for k, v in card.items() if not fields or k in fields}

    async def ping(self, request: web.Request) -> web.Response:
        return await self.health(request)

    async def load(self, request: web.Request) -> web.Response:
        """``/load``: the requests in the server now (vLLM's ``server_load_metrics``)."""
        return web.json_response({"server_load": self.stats.running + self.stats.queued})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self.card()]})

    async def server_info(self, request: web.Request) -> web.Response:
        cfg = self.cfg
        vllm_config = {
            "model_config": {
                "model": cfg.model,
                "served_model_name": cfg.served,
                "max_model_len": self.max_model_len,
                "quantization": cfg.quantization or (self.model.quant or None),
            },
            "parallel_config": {
                "tensor_parallel_size": cfg.tp,
                "disable_custom_all_reduce": cfg.disable_custom_all_reduce,
            },
            "cache_config": {"gpu_memory_utilization": cfg.gpu_memory_utilization},
            "kernel_config": {"moe_backend": cfg.moe_backend, "linear_backend": cfg.linear_backend},
            "speculative_config": (
                {"method": cfg.spec_method, "num_speculative_tokens": cfg.spec_tokens} if cfg.spec_method else None
            ),
        }
        text_form = request.query.get("config_format", "text") == "text"
        envs = {k: v for k, v in self.env.items() if k.startswith("VLLM_") and "KEY" not in k}
        return web.json_response(
            {
                "vllm_config": str(vllm_config) if text_form else vllm_config,
                "vllm_env": envs,
                "system_env": {"gpu_models": self.profile.gpu_name, "cuda_runtime_version": self.profile.cuda_version},
            }
        )

    async def metrics(self, request: web.Request) -> web.Response:
        known = {n for m in self.contract.http.get("metrics", {}).values() for n in m["exposed"]}
        labels = f'engine="0",model_name="{self.cfg.served}"'
        lines: list[str] = []

        def put(name: str, kind: str, value: float, extra: str = "") -> None:
            exposed = name if kind != "histogram" else name + "_count"
            if known and exposed not in known:
                raise AssertionError(f"{name} is not a metric vLLM {self.contract.version} exposes")
            base = name.removesuffix("_total") if kind == "counter" else name
            lines.append(f"# TYPE {base} {kind}")
            lines.append(f"{name}{{{labels}{extra}}} {value}")

        st = self.stats
        put("vllm:num_requests_running", "gauge", float(st.running))
        put("vllm:num_requests_waiting", "gauge", float(st.queued))
        put("vllm:kv_cache_usage_perc", "gauge", st.kv_usage_fn() if st.kv_usage_fn else 0.0)
        put("vllm:prompt_tokens_total", "counter", float(st.prompt_tokens))
        put("vllm:generation_tokens_total", "counter", float(st.generation_tokens))
        put("vllm:prefix_cache_queries_total", "counter", float(st.prompt_tokens))
        put("vllm:prefix_cache_hits_total", "counter", 0.0)  # the simulator caches no prefix
        put("vllm:num_preemptions_total", "counter", 0.0)
        for reason, count in self.finished.items():
            put("vllm:request_success_total", "counter", float(count), f',finished_reason="{reason}"')
        for name, key in (
            ("vllm:time_to_first_token_seconds", "ttft"),
            ("vllm:inter_token_latency_seconds", "itl"),
            ("vllm:e2e_request_latency_seconds", "e2e"),
        ):
            buckets, total, count = st.hist[key]
            if known and name + "_count" not in known:
                continue
            lines.append(f"# TYPE {name} histogram")
            running = 0
            for bound, n in zip((*LATENCY_BUCKETS, math.inf), buckets, strict=True):
                running += n
                le = "+Inf" if bound == math.inf else repr(float(bound))
                lines.append(f'{name}_bucket{{{labels},le="{le}"}} {running}')
            lines.append(f"{name}_sum{{{labels}}} {total}")
            lines.append(f"{name}_count{{{labels}}} {count}")
        if self.cfg.spec_method:
            put("vllm:spec_decode_num_drafts_total", "counter", float(self.spec["drafts"]))
            put("vllm:spec_decode_num_draft_tokens_total", "counter", float(self.spec["draft_tokens"]))
            put("vllm:spec_decode_num_accepted_tokens_total", "counter", float(self.spec["accepted"]))
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    # -- generation --------------------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, chat=True)

    def _error(self, message: str, status: int, kind: str) -> web.Response:
        body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
        return web.json_response(body, status=status)

    async def _openai(self, request: web.Request, chat: bool) -> web.StreamResponse:
        if self.dead:
            return self._error(say(self.contract, "engine_dead_client"), 500, "InternalServerError")
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return self._error("Invalid JSON body", 400, "BadRequestError")
        if not isinstance(body, dict):
            return self._error("The request body must be a JSON object", 400, "BadRequestError")
        asked = body.get("model")
        if asked is not None and asked != self.cfg.served:  # vLLM answers only to its served name(s)
            return self._error(f"The model `{asked}` does not exist.", 404, "NotFoundError")
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                return self._error("messages must be a non-empty list", 400, "BadRequestError")
            n_prompt = text.count_chat_tokens(messages)
            key = text.prompt_key(messages)
        else:
            prompt = body.get("prompt")
            # vLLM's CompletionRequest takes text or token ids (the bench client sends ids: exact lengths)
            if (
                isinstance(prompt, list)
                and prompt
                and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
            ):
                n_prompt = len(prompt)
            elif isinstance(prompt, str):
                n_prompt = text.count_text_tokens(prompt)
            else:
                return self._error("prompt must be a string or a list of token ids", 400, "BadRequestError")
            key = text.prompt_key(prompt)
        raw_max = body.get("max_completion_tokens", body.get("max_tokens"))
        max_new = 16 if raw_max is None and not chat else raw_max
        if max_new is None:
            max_new = self.max_model_len - n_prompt
        if not isinstance(max_new, int) or max_new < 1:
            return self._error("max_tokens must be a positive integer", 400, "BadRequestError")
        if n_prompt + max_new > self.max_model_len:
            return self._error(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{n_prompt + max_new} tokens ({n_prompt} in the messages, {max_new} in the completion).",
                400,
                "BadRequestError",
            )
        sink = Sink()
        stop_at = None if body.get("ignore_eos") else text.natural_length(text.rng_for(self.ns.sim_seed + 7919, key))
        stream_stops = stop_at is not None
        stream = Stream(
            rid=f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            index=0,
            prompt_tokens=n_prompt,
            cached_tokens=0,
            max_new=max_new,
            stop_at=stop_at,
            rng=text.rng_for(self.ns.sim_seed, key),
            sink=sink,
            t_recv=time.time(),
            garbage=self.oracle.garbage,
        )
        # a built-in eval question gets the kernels' answer (answers.py); token ids and other text: None
        replies = self.oracle.chat_replies(body["messages"]) if chat else self.oracle.replies(body["prompt"])
        if replies and replies[0] is not None:
            answers.apply(stream, replies[0], max_new, stops=stream_stops)
        created = int(time.time())
        model = body.get("model") or self.cfg.served
        self.scheduler.submit([stream])
        if body.get("stream"):
            return await self._stream(request, stream, sink, chat, created, model, body)
        finished = False
        while not finished:
            finished = any(done for _s, _upto, _t, done in await sink.wait())
        self._finish(stream)
        content = "".join(text.VOCAB[p] for p in stream.pieces[: stream.emitted])
        choice: dict[str, Any] = {"index": 0, "finish_reason": stream.finish, "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": content}
        else:
            choice["text"] = content
        return web.json_response(
            {
                "id": stream.rid,
                "object": "chat.completion" if chat else "text_completion",
                "created": created,
                "model": model,
                "choices": [choice],
                "usage": self._usage(stream),
            }
        )

    def _usage(self, s: Stream) -> dict[str, int]:
        return {
            "prompt_tokens": s.prompt_tokens,
            "completion_tokens": s.emitted,
            "total_tokens": s.prompt_tokens + s.emitted,
        }

    def _finish(self, s: Stream) -> None:
        self.finished[s.finish] = self.finished.get(s.finish, 0) + 1
        self._count_spec(s)

    async def _stream(self, request, stream: Stream, sink: Sink, chat: bool, created: int, model: str, body: dict):
        resp = web.StreamResponse(headers=SSE_HEADERS)
        await resp.prepare(request)
        kind = "chat.completion.chunk" if chat else "text_completion"
        options = body.get("stream_options") or {}
        include_usage = bool(options.get("include_usage"))
        # vLLM's continuous_usage_stats: every chunk carries the usage so far (with include_usage)
        continuous = include_usage and bool(options.get("continuous_usage_stats"))

        def chunk(delta: str, finish: str | None, upto: int = 0) -> bytes:
            if chat:
                d: dict[str, Any] = {"content": delta}
                choice: dict[str, Any] = {"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish}
            obj: dict[str, Any] = {"id": stream.rid, "object": kind, "created": created, "model": model}
            obj["choices"] = [choice]
            if continuous:
                obj["usage"] = {
                    "prompt_tokens": stream.prompt_tokens,
                    "completion_tokens": upto,
                    "total_tokens": stream.prompt_tokens + upto,
                }
            return b"data: " + json.dumps(obj).encode() + b"\n\n"

        sent = 0
        try:
            while sent < stream.target:
                events = await sink.wait()
                upto = max(e[1] for e in events)
                done = any(e[3] for e in events)
                delta = "".join(text.VOCAB[p] for p in stream.pieces[sent:upto])
                if chat and sent == 0:  # vLLM's first chat chunk names the role and carries no text
                    role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None}
                    head = {"id": stream.rid, "object": kind, "created": created, "model": model}
                    head["choices"] = [{**role, "finish_reason": None}]
                    await resp.write(b"data: " + json.dumps(head).encode() + b"\n\n")
                await resp.write(chunk(delta, stream.finish if done else None, upto))
                sent = upto
                if done:
                    break
            self._finish(stream)
            if include_usage:
                usage = {
                    "id": stream.rid,
                    "object": kind,
                    "created": created,
                    "model": model,
                    "choices": [],
                    "usage": self._usage(stream),
                }
                await resp.write(b"data: " + json.dumps(usage).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            self.scheduler.abort([stream])
            raise
        return resp


# --------------------------------------------------------------------------------------------- lifecycle


def _gpu_ids(tp: int, count: int, env: Mapping[str, str]) -> list[int]:
    visible = env.get("CUDA_VISIBLE_DEVICES")
    ids = [int(x) for x in visible.split(",") if x.strip().isdigit()] if visible else list(range(count))
    return [g for g in ids[:tp] if g < count]


def _bind(host: str | None, port: int) -> socket.socket:
    """``create_server_socket``: bound now, listening only once the engine is ready."""
    family = socket.AF_INET6 if host and ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host or "", port))
    except OSError:
        sock.close()
        raise
    return sock


def _model_missing(model: str) -> bool:
    """A path-like model (``/...``, ``./...``, ``~/...``) that is not a folder: vLLM cannot find its config."""
    return model.startswith(("/", "./", "../", "~")) and not Path(model).expanduser().is_dir()


async def _wait(stop: asyncio.Event, seconds: float) -> bool:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), max(0.0, seconds))
    return stop.is_set()


async def serve(contract: Contract, ns: argparse.Namespace, env: Mapping[str, str]) -> int:
    cfg = settings_from(ns, contract)
    profile = load_profile(ns.sim_profile)
    model = model_spec_for(cfg.model)
    pid = os.getpid()
    log = VllmLog(contract, pid)
    log.text("server_version", percent=(contract.version, cfg.model))
    defaults = {opt.dest: opt.default for opt in contract.options}
    changed = {k: v for k, v in cfg.raw.items() if k in defaults and v != defaults[k]}
    non_default = {"model_tag": cfg.model, **changed}
    log.text("non_default_args", fields={"redact_sensitive_args(non_default_args)": non_default})
    try:
        sock = _bind(cfg.host, cfg.port)
    except OSError:
        log.traceback(f"OSError: {say(contract, 'http_port_in_use')}", "vllm/entrypoints/launchers/launcher.py")
        return 1
    if _model_missing(cfg.model):
        sock.close()
        log.traceback(
            f"ValueError: {say(contract, 'model_not_found', model=cfg.model)}", "vllm/transformers_utils/config.py"
        )
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, ledger.on_signal(sig.name, stop.set))
    ledger.engine_started("vllm", cfg.port)
    state = registry.state_dir(ns.sim_state_dir)
    gpus = _gpu_ids(cfg.tp, profile.count, env)
    others = registry.used_mib_by_gpu(registry.live_entries(state), exclude_pid=pid)
    others_gib = max((others.get(g, 0) for g in gpus), default=0) / 1024.0
    entry: dict[str, Any] = {
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
        "engine": "vllm",
        "vllm_version": contract.version,
        "procs": [],
    }
    children = ChildProcesses()
    weights = model.weight_gb / max(1, cfg.tp) * 0.931  # GB -> GiB
    budget = profile.memory_gib * cfg.gpu_memory_utilization - others_gib
    activation = vllm_config.profile_activation_gib(cfg, profile)
    kv_gib = max(0.0, budget - weights - activation)
    kv_tokens = int(kv_gib * 2**30 / KV_BYTES_PER_TOKEN)
    server = VllmServer(contract, cfg, profile, model, ns, env, kv_tokens)
    runner: web.AppRunner | None = None
    t0 = time.time()
    load_s = max(0.0, ns.sim_load_s)
    try:
        titles = [f"VLLM::Worker_TP{r}" if cfg.tp > 1 else "VLLM::Worker" for r in range(cfg.tp)]
        children.start([(t, gpus[r] if r < len(gpus) else None) for r, t in enumerate(titles)], ("VLLM::EngineCore",))
        entry["procs"] = children.as_registry()
        registry.register(state, entry)
        steps = 4
        for i in range(1, steps + 1):
            if await _wait(stop, t0 + load_s * i / (steps + 1) - time.time()):
                return 0
            entry["mem_mib"] = int(min(weights, profile.memory_gib) * 1024 * i / steps)
            registry.register(state, entry)
            if i == 2 and cfg.moe_backend in SM100_ONLY_MOE and model.experts and profile.sm not in SM100_FAMILY:
                reason = say(
                    contract,
                    "moe_kernel_reason",
                    reason=say(contract, "moe_kernel_reason_device", device_name=profile.gpu_name),
                )
                oracle = "NvFp4" if (cfg.quantization or model.quant) == "modelopt_fp4" else "Unquantized"
                message = say(
                    contract,
                    "moe_backend_unsupported",
                    name=oracle,
                    lora="",
                    value=cfg.moe_backend.upper(),
                    since=f" since {reason}",
                )
                return _engine_failed(log, contract, f"ValueError: {message}")
            if i == 3 and weights + activation >= budget:
                hint = say(contract, "kv_cache_memory_hint")
                message = say(contract, "kv_cache_no_memory", hint=hint)
                return _engine_failed(log, contract, f"ValueError: {message}")
        log.line(f"GPU KV cache size: {kv_tokens:,} tokens", proc="EngineCore", where="kv_cache_utils.py:1")
        if await _wait(stop, t0 + load_s - time.time()):
            return 0
        # --- ready: listen, log, serve ---------------------------------------------------------------
        sock.listen(4096)
        sock.setblocking(False)
        keepalive = float(env.get("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "5") or 5)
        runner = web.AppRunner(server.app(), access_log=None, handle_signals=False, keepalive_timeout=keepalive)
        await runner.setup()
        host = cfg.host or "0.0.0.0"
        log.text("api_server_starting", listen_address=f"http://{host}:{cfg.port}")
        log.text("routes_header")
        for path, method in server.routes():
            log.text("route_line", fields={"path": path, "', '.join(methods)": method})
        await web.SockSite(runner, sock).start()
        if isinstance(server.scheduler, BatchScheduler):
            server.scheduler.start()
        # uvicorn's default formatter prefixes its level as "INFO:     " (not a recorded text)
        log.raw(f"INFO:     {say(contract, 'uvicorn_started') % pid}")
        log.raw(f"INFO:     {say(contract, 'uvicorn_waiting')}")
        log.raw(f"INFO:     {say(contract, 'ready')}")
        entry.update(status="ready", mem_mib=int(profile.memory_gib * cfg.gpu_memory_utilization * 1024))
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
                log.text("engine_dead", level="ERROR", proc="APIServer")
                if env.get("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH", "0") in ("", "0"):
                    if await _wait(stop, WATCHDOG_S):
                        return 0
                    log.raw("INFO:     Shutting down")
                    return 1
            if await _wait(stop, 0.2):
                break
            load.tick()
        return 0
    finally:
        ledger.record("engine_exit")
        registry.unregister(state, pid)
        children.stop(timeout=0.5)
        if isinstance(server.scheduler, BatchScheduler):
            await server.scheduler.stop()
        if runner is not None:
            await runner.cleanup()
        sock.close()


def _engine_failed(log: VllmLog, contract: Contract, exc_line: str) -> int:
    """The engine core's traceback, then the API server's RuntimeError (``launch_core_engines``)."""
    log.text("engine_core_failed", level="ERROR", proc="EngineCore")
    log.traceback(exc_line, "vllm/v1/engine/core.py")
    message = say(contract, "engine_core_init_failed", finished="{'EngineCore': 1}")
    log.traceback(f"RuntimeError: {message}", "vllm/v1/engine/utils.py")
    return 1


def parse(argv: Sequence[str], env: Mapping[str, str]) -> tuple[Contract, argparse.Namespace]:
    """The sim's own options, then vLLM's parser; exits 2 (SystemExit) like argparse on bad flags."""
    sp = sim_parser(env)
    sim, rest = sp.parse_known_args(list(argv))
    known = recorded_versions("vllm")
    if sim.sim_vllm_version not in known:
        sp.error(
            f"argument --sim-vllm-version: {sim.sim_vllm_version!r} is not a recorded vLLM version ({', '.join(known)})"
        )
    contract = load_contract("vllm", sim.sim_vllm_version)
    parser = build_parser(contract)
    ns = parser.parse_args(flexible_argv(rest))
    if ns.subparser != "serve":
        parser.print_help()
        raise SystemExit(0)
    spec = getattr(ns, "speculative_config", None)
    if isinstance(spec, str):
        try:
            json.loads(spec)
        except json.JSONDecodeError:
            line = bad_json_line(contract, spec)
            sys.stderr.write(f"usage: {contract.usage}\n{line}\n")
            raise SystemExit(2) from None
    for key, value in vars(sim).items():
        setattr(ns, key, value)
    return contract, ns


def bad_json_line(contract: Contract, value: str) -> str:
    """The recorded argparse line for a --speculative-config that is not JSON, with this value and this
    process's address of ``json.loads`` in it (vLLM's message shows the converter's repr)."""
    entry = contract.texts.get("speculative_config_bad_json")
    if entry is None or entry.text is None:
        return f"{contract.prog}: error: argument --speculative-config/-sc: invalid value: {value!r}"
    recorded = entry.render({"hex(id(type))": hex(id(json.loads))})
    head, _, rest = recorded.partition("Value ")
    _, sep, tail = rest.partition(" cannot be converted")
    return f"{head}Value {value}{sep}{tail}" if sep else recorded


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m workers.sim.vllm``; returns the exit code."""
    env = dict(os.environ)
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        contract, ns = parse(argv, env)
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2
    try:
        return uvloop.run(serve(contract, ns, env))
    except BenchbotError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
