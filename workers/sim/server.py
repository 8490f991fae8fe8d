"""SGLang's HTTP surface on aiohttp: native /generate, OpenAI completions/chat, info, health, metrics.

Shapes follow the imitated version (docs/sim.md, "HTTP surface"): ``/server_info`` is
0.5.9's flat ServerArgs + scheduler info or 0.5.15+'s resolved fields + ``launch_command``,
``kv_events``, ``startup_time``, ``frontend``. The server only exists once loading is over (there is no
listener before), so every route answers from the first connection; only ``/health`` says 503 until
the warm-up has run, as SGLang's ``server_status`` does. Handlers turn a request
into ``Stream`` objects and hand them to the scheduler; token chunks are formatted from byte templates
and written by the scheduler's tick through ``Sink.direct`` (see ``_pump``), the rest by the handler.
Streamed chunks carry ``sim_t_recv``/``sim_t_sched``/``sim_t_emit`` in fixed timing (and with
``--sim-timestamps``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from workers.sim import answers, chunks, ledger, log, text
from workers.sim.args import Resolved, is_new_layout
from workers.sim.engine import LATENCY_BUCKETS, BaseScheduler, Sink, Stats, Stream
from workers.sim.perf import MemoryPlan, PerfModel
from workers.sim.profile import GpuProfile, ModelSpec
from workers.sim.profiler import SimProfiler

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
PREFIX_CACHE_LIMIT = 100_000


class BadRequest(Exception):
    """A client error answered with SGLang's 400 body."""


class WarmupFailed(Exception):
    """The warm-up request did not get a 200 (SGLang logs it and kills its process tree)."""


#: A 32x32 black PNG: SGLang's warm-up sends one this size to a vision-language model (images are ignored).
WARMUP_PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAACAAAAAgCAIAAAD8GO2jAAAAGUlEQVR42u3BMQEAAADCoPVP7WENoAAAAG4MIAABITLN7AAAAABJRU5ErkJggg=="
)


def _openai_error(message: str, status: int = 400, kind: str = "BadRequestError") -> web.Response:
    return web.json_response(
        {"object": "error", "message": message, "type": kind, "param": None, "code": status}, status=status
    )


class SimServer:
    """All state of one simulated engine; ``routes()`` wires it into an aiohttp app."""

    def __init__(
        self,
        res: Resolved,
        profile: GpuProfile,
        model: ModelSpec,
        perf: PerfModel,
        mem: MemoryPlan,
        stats: Stats,
        scheduler: BaseScheduler,
    ) -> None:
        self.res = res
        self.args: argparse.Namespace = res.args
        self.profile = profile
        self.model = model
        self.perf = perf
        self.mem = mem
        self.stats = stats
        self.scheduler = scheduler
        self.version = res.version
        self.up = False  # SGLang's ServerStatus.Up: set when the warm-up request has succeeded
        self.shutting_down = False
        self.t_start = time.time()
        self.load_s = self.args.sim_load_s
        self.oracle = answers.Oracle.for_server(self.args, self.version, profile.sm)  # eval questions
        self.garbage = self.oracle.garbage  # every token is "!" (answers.kernel_quality)
        self.timestamps = self.args.sim_timing == "fixed" or self.args.sim_timestamps
        self.prefix_cache: dict[bytes, int] = {}
        self.prefix_blocks: set[bytes] = set()
        self.served = self.args.served_model_name
        self._args_dict = res.server_args
        self.cache_report = bool(self.args.enable_cache_report)
        self.profiler = SimProfiler(int(self.args.tp_size or 1), lambda: self.scheduler.forwards, log.info)

    # -- plumbing ----------------------------------------------------------------------------------
    def app(self) -> web.Application:
        middlewares = [*ledger.middlewares(), *([self._auth] if self.args.api_key else [])]
        app = web.Application(middlewares=middlewares, client_max_size=64 * 1024 * 1024)
        r = app.router
        for path in ("/health", "/health_generate"):
            r.add_get(path, self.health)
        r.add_get("/ping", self.ping)
        for path in ("/server_info", "/get_server_info"):
            r.add_get(path, self.server_info)
        for path in ("/model_info", "/get_model_info"):
            r.add_get(path, self.model_info)
        r.add_get("/v1/models", self.list_models)
        r.add_get("/v1/models/{model:.+}", self.get_model)
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat)
        r.add_post("/generate", self.generate)
        r.add_put("/generate", self.generate)
        r.add_get("/flush_cache", self.flush_cache)
        r.add_post("/flush_cache", self.flush_cache)
        r.add_get("/get_load", self.get_load)
        for method in (r.add_get, r.add_post):
            method("/start_profile", self.start_profile)
            method("/stop_profile", self.stop_profile)
        if self.args.enable_metrics:
            r.add_get("/metrics", self.metrics)
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
        path = request.path
        if request.method == "OPTIONS" or path.startswith("/health") or path.startswith("/metrics"):
            return await handler(request)
        if request.headers.get("Authorization") != "Bearer " + self.args.api_key:
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    @property
    def ready(self) -> bool:
        return self.up and not self.shutting_down

    # -- building streams --------------------------------------------------------------------------
    def _cached(self, key: bytes, n: int, blocks: tuple[bytes, ...] = ()) -> int:
        """Prompt tokens the radix cache already holds: the whole prompt seen before (all but the last
        token, as SGLang), or its leading blocks shared with earlier prompts (a shared prefix)."""
        if self.args.disable_radix_cache:
            return 0
        prev = self.prefix_cache.get(key)
        matched = 0
        for block in blocks:
            if block not in self.prefix_blocks:
                break
            matched += text.PREFIX_BLOCK_TOKENS
        if len(self.prefix_cache) < PREFIX_CACHE_LIMIT:
            self.prefix_cache[key] = n
            self.prefix_blocks.update(blocks)
        whole = max(0, min(prev, n) - 1) if prev else 0  # the last token is always computed
        return max(whole, min(matched, n - 1))

    def make_streams(
        self,
        prompts: list[tuple[int, bytes, tuple[bytes, ...]]],
        max_new: int,
        ignore_eos: bool,
        sink: Sink,
        t_recv: float,
        rid: str | None = None,
        replies: list[str | None] | None = None,
    ) -> list[Stream]:
        """One Stream per prompt ``(prompt_tokens, key, prefix blocks)``; raises BadRequest on a context overflow.
        ``replies[i]``, when given and not None, is what prompt i is answered (answers.py), unless garbage."""
        ctx = self.args.context_length
        streams = []
        base = rid or uuid.uuid4().hex
        seed = self.args.sim_seed
        for i, (n_prompt, key, blocks) in enumerate(prompts):
            if n_prompt + max_new > ctx:
                raise BadRequest(
                    f"Requested token count exceeds the model's maximum context length of {ctx} tokens. "
                    f"You requested a total of {n_prompt + max_new} tokens: {n_prompt} tokens from the input "
                    f"messages and {max_new} tokens for the completion. Please reduce the number of tokens in "
                    "the input messages or the completion to fit within the limit."
                )
            rng = text.rng_for(seed, key)
            stop_at = None
            if not ignore_eos and self.args.sim_natural_eos:
                stop_at = text.natural_length(text.rng_for(seed + 7919, key))
            streams.append(
                Stream(
                    rid=base if len(prompts) == 1 else f"{base}_{i}",
                    index=i,
                    prompt_tokens=n_prompt,
                    cached_tokens=self._cached(key, n_prompt, blocks),
                    max_new=max_new,
                    stop_at=stop_at,
                    rng=rng,
                    sink=sink,
                    t_recv=t_recv,
                    garbage=self.garbage,
                )
            )
            reply = replies[i] if replies and i < len(replies) and not self.garbage else None
            if reply is not None:
                answers.apply(streams[-1], reply, max_new, stops=stop_at is not None)
        return streams

    async def run_to_end(self, streams: list[Stream], sink: Sink) -> None:
        """Wait until every stream finished (non-streaming requests, warmup, health probes)."""
        self.scheduler.submit(streams)
        left = len(streams)
        while left:
            for _s, _upto, _t, done in await sink.wait():
                left -= done

    async def probe(self, max_new: int) -> None:
        """SGLang's /health generation: ``input_ids=[0]``, one token, ``log_metrics=False`` (not counted)."""
        sink = Sink()
        streams = [
            Stream(
                rid=f"HEALTH_CHECK_{time.time()}",
                index=0,
                prompt_tokens=1,
                cached_tokens=0,
                max_new=max_new,
                stop_at=None,
                rng=text.rng_for(self.args.sim_seed, b"health"),
                sink=sink,
                t_recv=time.time(),
                garbage=self.garbage,
                counted=False,
            )
        ]
        await self.run_to_end(streams, sink)

    async def warmup(self) -> None:
        """SGLang's ``_execute_server_warmup``, over HTTP to itself: ``GET /model_info``, then one 8-token
        generation (``/v1/chat/completions`` with a tiny image for a vision-language model, else
        ``/generate``). It counts in the metrics like any request."""
        a = self.args
        host = f"[{a.host}]" if ":" in a.host else a.host
        url = f"http://{host}:{a.port}"
        headers = {"Authorization": f"Bearer {a.api_key}"} if a.api_key else {}
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(headers=headers, timeout=timeout) as session:
            async with session.get(url + "/model_info") as resp:
                if resp.status != 200:
                    body_text = await resp.text()
                    raise WarmupFailed(f"AssertionError: res=<Response [{resp.status}]>, res.text={body_text!r}")
                info = await resp.json()
            if info.get("has_image_understanding") and not getattr(a, "skip_tokenizer_init", False):
                path, body = (
                    "/v1/chat/completions",
                    {
                        "model": self.served,
                        "max_tokens": 8,
                        "stream": False,
                        "temperature": 0.0,
                        "messages": [
                            {
                                "role": "user",
                                "content": [
                                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{WARMUP_PNG}"}},
                                    {"type": "text", "text": "Describe the image."},
                                ],
                            }
                        ],
                    },
                )
            else:
                path, body = (
                    "/generate",
                    {
                        "sampling_params": {"temperature": 0, "max_new_tokens": 8},
                        "text": "The capital city of France is",
                    },
                )
            async with session.post(url + path, json=body) as resp:
                if resp.status != 200:
                    raise WarmupFailed(f"AssertionError: {await resp.text()}")

    # -- health / info ------------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        if not self.ready:
            return web.Response(status=503)
        if self.stats.running == 0 and self.args.sim_timing == "model":
            await self.probe(1)
        return web.Response(status=200)

    async def ping(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    def internal_state(self) -> dict:
        """``internal_states[0]``: the server args plus what the scheduler knows (shape per version)."""
        st = self.stats
        state = dict(self._args_dict)
        if is_new_layout(self.version):
            graphs = dict.fromkeys(
                ("prefill", "decode", "target_verify", "draft_prefill", "draft_decode", "draft_extend"), 0.0
            )
            graphs["decode"] = round(self.mem.graph_gb, 3)
            state.update(
                {
                    "world_size": self.args.tp_size * self.args.pp_size * max(1, self.args.dp_size or 1),
                    "startup_time": self.startup_time(),
                    "effective_max_running_requests_per_dp": self.res.max_running,
                    "last_gen_throughput": round(st.last_gen_throughput, 3),
                    "memory_usage": {
                        "weight": round(self.mem.weights_gb, 3),
                        "kvcache": round(self.mem.kv_pool_gb, 3),
                        "startup_available": round(self.mem.total_gb - 0.6, 3),
                        "token_capacity": self.mem.max_total_num_tokens,
                        "token_capacity_swa": None,
                        "graph": graphs,
                    },
                    "disaggregation_mode": "null",
                    "decode_cuda_graph_bs": [1, 2, 4, 8, *range(16, int(self.args.cuda_graph_max_bs) + 1, 16)],
                    "decode_cuda_graph_memory_gb": round(self.mem.graph_gb, 3),
                }
            )
        else:
            state.update(
                {
                    "last_gen_throughput": round(st.last_gen_throughput, 3),
                    "memory_usage": {
                        "weight": round(self.mem.weights_gb, 2),
                        "kvcache": round(self.mem.kv_pool_gb, 2),
                        "token_capacity": self.mem.max_total_num_tokens,
                        "graph": round(self.mem.graph_gb, 2),
                    },
                    "effective_max_running_requests_per_dp": self.res.max_running,
                }
            )
        if self.res.spec_on and st.avg_spec_accept_length:
            state["avg_spec_accept_length"] = round(st.avg_spec_accept_length, 4)
        return state

    def startup_time(self) -> dict:
        """0.5.15+'s ``startup_time`` (seconds per phase of the simulated load)."""
        graphs = dict.fromkeys(
            ("prefill", "decode", "target_verify", "draft_prefill", "draft_decode", "draft_extend"), 0.0
        )
        graphs["decode"] = round(self.load_s * 0.25, 3)
        if self.res.spec_on:
            graphs["target_verify"] = graphs["draft_decode"] = round(self.load_s * 0.05, 3)
        return {
            "load_weight": round(self.load_s * 0.45, 3),
            "kv_cache_allocation": round(self.load_s * 0.05, 3),
            "scheduler_e2e": round(self.load_s * 0.9, 3),
            "cuda_graph": graphs,
        }

    def server_info_dict(self) -> dict:
        """``GET /server_info`` in the imitated version's shape (its keys come from the recorded contract)."""
        scheduler_info = {
            "status": "ready",
            "max_total_num_tokens": self.mem.max_total_num_tokens,
            "max_req_input_len": self.args.context_length - 6,
        }
        info = dict(self._args_dict)
        if is_new_layout(self.version):
            info["launch_command"] = " ".join(self.args.sim_launch_argv)
            info.update(scheduler_info)
            info["hicache_object_layout"] = {
                "enabled": False,
                "backend": None,
                "page_size": self.args.page_size,
                "hicache_object_layout": {"pools": []},
                "reason": "Hierarchical cache is disabled",
            }
            info["kv_events"] = None
            info["startup_time"] = self.startup_time()
            info["internal_states"] = [self.internal_state()]
            info["version"] = self.version
            info["frontend"] = "python"
        else:
            info.update(scheduler_info)
            info["internal_states"] = [self.internal_state()]
            info["version"] = self.version
        info["sim"] = {
            "sglang_version": self.version,
            "timing": self.args.sim_timing,
            "seed": self.args.sim_seed,
            "profile": self.profile.to_dict(),
            "ttft_ms": self.args.sim_ttft_ms,
            "itl_ms": self.args.sim_itl_ms,
            "allreduce": self.perf.allreduce.mode,
            "spec_v2": self.res.spec_v2,
            "expected_single_stream_tok_s": round(self.perf.single_stream_tok_s(), 2),
        }
        return info

    async def server_info(self, request: web.Request) -> web.Response:
        """Never 503: there is no listener until the scheduler is up, so it always has an answer."""
        return web.Response(text=json.dumps(self.server_info_dict(), default=str), content_type="application/json")

    async def model_info(self, request: web.Request) -> web.Response:
        info = {
            "model_path": self.args.model_path,
            "tokenizer_path": self.args.tokenizer_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": self.model.arch.endswith("ForConditionalGeneration"),
            "has_audio_understanding": False,
            "model_type": self.model.model_type,
            "architectures": [self.model.arch],
        }
        if is_new_layout(self.version):
            info.update(
                {
                    "served_model_name": self.served,
                    "load_format": self.args.load_format,
                    "reasoning_parser": self.args.reasoning_parser,
                    "tool_call_parser": self.args.tool_call_parser,
                    "disaggregation_mode": "null",
                }
            )
        return web.json_response(info)

    def _model_card(self) -> dict:
        return {
            "id": self.served,
            "object": "model",
            "created": int(self.t_start),
            "owned_by": "sglang",
            "root": self.args.model_path,
            "parent": None,
            "max_model_len": self.args.context_length,
        }

    async def list_models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._model_card()]})

    async def get_model(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        if name not in (self.served, self.args.model_path):
            return web.json_response(
                {
                    "error": {
                        "message": f"The model '{name}' does not exist",
                        "type": "invalid_request_error",
                        "param": "model",
                        "code": "model_not_found",
                    }
                },
                status=404,
            )
        return web.json_response(self._model_card())

    async def flush_cache(self, request: web.Request) -> web.Response:
        if self.stats.running or self.stats.queued:
            return web.Response(
                status=400,
                text="Cache not flushed. Please check backend logs for more details. "
                "(When there are running or waiting requests, the operation will not be performed.)",
            )
        self.prefix_cache.clear()
        self.prefix_blocks.clear()
        return web.Response(
            status=200,
            text="Cache flushed.\nPlease check backend logs for more details. "
            "(When there are running or waiting requests, the operation will not be performed.)",
        )

    async def start_profile(self, request: web.Request) -> web.Response:
        """SGLang's ProfileReq: output_dir, num_steps, profile_id, profile_prefix (the rest is accepted)."""
        body: dict[str, object] = {}
        if request.can_read_body:
            try:
                raw = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError):
                return web.json_response({"detail": "invalid JSON body"}, status=422)
            body = raw if isinstance(raw, dict) else {}
        output_dir = body.get("output_dir") or os.environ.get("SGLANG_TORCH_PROFILER_DIR", "/tmp")
        profile_id = str(body.get("profile_id") or time.time())
        prefix = f"{body['profile_prefix']}-" if body.get("profile_prefix") else ""
        names = [f"{prefix}{profile_id}-TP-{rank}.trace.json.gz" for rank in range(self.profiler.ranks)]
        steps = body.get("num_steps")
        try:
            self.profiler.start(str(output_dir), names, steps if isinstance(steps, int) and steps > 0 else None)
        except ValueError:
            return web.Response(status=500, text="Internal Server Error")  # FastAPI's answer to the RuntimeError
        return web.Response(status=200, text="Start profiling.\n")

    async def stop_profile(self, request: web.Request) -> web.Response:
        try:
            self.profiler.stop()
        except ValueError:
            return web.Response(status=500, text="Internal Server Error")
        return web.Response(status=200, text="Stop profiling. This will take some time.\n")

    async def get_load(self, request: web.Request) -> web.Response:
        return web.json_response(
            [
                {
                    "dp_rank": 0,
                    "num_reqs": self.stats.running + self.stats.queued,
                    "num_waiting_reqs": self.stats.queued,
                    "num_tokens": 0,
                }
            ]
        )

    async def metrics(self, request: web.Request) -> web.Response:
        st = self.stats
        label = f'model_name="{self.served}"'
        glabel = f'{label},engine_type="unified",tp_rank="0"'
        out: list[str] = []

        def metric(name: str, kind: str, value: float, labels: str, help_: str) -> None:
            out.append(
                f"# HELP sglang:{name} {help_}\n# TYPE sglang:{name} {kind}\nsglang:{name}{{{labels}}} {float(value)}"
            )

        metric("prompt_tokens_total", "counter", st.prompt_tokens, label, "Number of prefill tokens processed.")
        metric("generation_tokens_total", "counter", st.generation_tokens, label, "Number of generation tokens.")
        metric("num_requests_total", "counter", st.requests, label, "Number of requests processed.")
        metric("cached_tokens_total", "counter", st.cached_tokens, label, "Number of cached prompt tokens.")
        metric("num_aborted_requests_total", "counter", st.aborted, label, "Number of aborted requests.")
        used = round(st.kv_usage_fn() * self.mem.max_total_num_tokens) if st.kv_usage_fn else 0
        metric("num_running_reqs", "gauge", st.running, glabel, "The number of running requests.")
        metric("num_queue_reqs", "gauge", st.queued, glabel, "The number of requests in the waiting queue.")
        metric("num_used_tokens", "gauge", used, glabel, "The number of used tokens.")
        metric("token_usage", "gauge", used / max(1, self.mem.max_total_num_tokens), glabel, "The token usage.")
        metric("max_total_num_tokens", "gauge", self.mem.max_total_num_tokens, glabel, "Maximum total tokens.")
        metric("gen_throughput", "gauge", st.last_gen_throughput, glabel, "The generation throughput (token/s).")
        metric("cache_hit_rate", "gauge", st.cached_tokens / max(1, st.prompt_tokens), glabel, "The cache hit rate.")
        metric("spec_accept_length", "gauge", st.avg_spec_accept_length, glabel, "The average acceptance length.")
        rate = (st.avg_spec_accept_length - 1) / max(1, self.perf.draft_tokens - 1) if st.avg_spec_accept_length else 0
        metric("spec_accept_rate", "gauge", rate, glabel, "The average acceptance rate.")
        metric("is_cuda_graph", "gauge", 1, glabel, "Whether the batch is using CUDA graph.")
        metric("utilization", "gauge", 1 if st.running else 0, glabel, "Engine utilization.")
        metric("engine_startup_time", "gauge", self.args.sim_startup_s, glabel, "Engine startup time.")
        metric("engine_load_weights_time", "gauge", self.args.sim_startup_s * 0.45, glabel, "Weight load time.")
        names = {
            "ttft": "time_to_first_token_seconds",
            "itl": "inter_token_latency_seconds",
            "e2e": "e2e_request_latency_seconds",
            "queue": "queue_time_seconds",
        }
        for key, name in names.items():
            counts, total, n = st.hist[key]
            lines = [f"# HELP sglang:{name} Histogram of {name}.", f"# TYPE sglang:{name} histogram"]
            acc = 0
            for le, c in zip((*LATENCY_BUCKETS, float("inf")), counts, strict=True):
                acc += c
                le_txt = "+Inf" if le == float("inf") else repr(float(le))
                lines.append(f'sglang:{name}_bucket{{le="{le_txt}",{label}}} {float(acc)}')
            lines.append(f"sglang:{name}_sum{{{label}}} {total}")
            lines.append(f"sglang:{name}_count{{{label}}} {float(n)}")
            out.append("\n".join(lines))
        return web.Response(text="\n".join(out) + "\n", content_type="text/plain", charset="utf-8")

    # -- request parsing ----------------------------------------------------------------------------
    @staticmethod
    async def _json(request: web.Request) -> dict:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BadRequest(f"Invalid JSON body: {exc}") from exc
        if not isinstance(body, dict):
            raise BadRequest("Request body must be a JSON object")
        return body

    @staticmethod
    def _prompt_list(prompt: object, field: str) -> list[tuple[int, bytes, tuple[bytes, ...]]]:
        """Normalise a prompt (str, [ids], [str], [[ids]]) into ``[(tokens, key)]``."""
        if isinstance(prompt, str):
            return [(text.count_text_tokens(prompt), text.prompt_key(prompt), text.prefix_blocks(prompt))]
        if isinstance(prompt, list) and prompt and all(isinstance(x, int) for x in prompt):
            return [(len(prompt), text.prompt_key(prompt), text.prefix_blocks(prompt))]
        if isinstance(prompt, list) and prompt and all(isinstance(x, str | list) for x in prompt):
            out: list[tuple[int, bytes, tuple[bytes, ...]]] = []
            for p in prompt:
                out.extend(SimServer._prompt_list(p, field))
            return out
        raise BadRequest(f"`{field}` must be a string, a list of token ids, or a list of those")

    @staticmethod
    def _int(body: dict, *names: str, default: int) -> int:
        for name in names:
            value = body.get(name)
            if value is not None:
                if not isinstance(value, int) or value < 0:
                    raise BadRequest(f"`{name}` must be a non-negative integer")
                return value
        return default

    # -- /generate -----------------------------------------------------------------------------------
    async def generate(self, request: web.Request) -> web.StreamResponse:
        t_recv = time.time()
        try:
            body = await self._json(request)
            replies = None
            if body.get("input_ids") is not None:
                ids = body["input_ids"]
                prompts = self._prompt_list(ids, "input_ids")
                batch = bool(ids) and isinstance(ids[0], list)
            elif body.get("text") is not None:
                prompts = self._prompt_list(body["text"], "text")
                batch = isinstance(body["text"], list)
                replies = self.oracle.replies(body["text"])
            else:
                raise BadRequest("Either text or input_ids should be provided.")
            sp = body.get("sampling_params") or {}
            if not isinstance(sp, dict):
                raise BadRequest("`sampling_params` must be an object")
            max_new = self._int(sp, "max_new_tokens", default=128)
            sink = Sink()
            streams = self.make_streams(
                prompts,
                max_new,
                bool(sp.get("ignore_eos")),
                sink,
                t_recv,
                rid=body.get("rid") if isinstance(body.get("rid"), str) else None,
                replies=replies,
            )
        except BadRequest as exc:
            return web.json_response({"error": {"message": str(exc)}}, status=400)
        if not body.get("stream"):
            await self.run_to_end(streams, sink)
            outs = [self._generate_obj(s, s.target, t_recv, None) for s in streams]
            return web.json_response(outs if batch else outs[0])
        resp = web.StreamResponse(headers=SSE_HEADERS)
        sock = await self._prepare_stream(request, resp)
        ts = self.timestamps
        fmts = {
            s.index: chunks.GenerateFormat(s.rid, s.prompt_tokens, s.cached_tokens, s.index if batch else None)
            for s in streams
        }

        def chunk(s: Stream, upto: int, t_sched: float, done: bool) -> bytes:
            if done:  # once per request: the full object (finish reason, e2e latency, spec stats)
                obj = self._generate_obj(s, upto, t_recv, t_sched if ts else None)
                if batch:
                    obj["index"] = s.index
                if ts:
                    obj["sim_t_emit"] = time.time()
                return b"data: " + chunks.j(obj) + b"\n\n"
            return fmts[s.index].chunk(s.pieces, upto, chunks.sim_fields(t_recv, t_sched, time.time()) if ts else b"")

        await self._pump(resp, sock, sink, streams, chunk)
        return resp

    async def _prepare_stream(self, request: web.Request, resp: web.StreamResponse) -> chunks.SocketWriter:
        """Send the SSE headers now and return the direct writer for this connection."""
        await resp.prepare(request)
        await resp.write(b"")  # aiohttp buffers the headers until the first body write: flush them
        chunked = resp.headers.get("Transfer-Encoding", "").lower() == "chunked"  # HTTP/1.1 without a length
        return chunks.SocketWriter(request.transport if chunked else None)

    async def _pump(
        self,
        resp: web.StreamResponse,
        sock: chunks.SocketWriter,
        sink: Sink,
        streams: list[Stream],
        chunk: Callable[[Stream, int, float, bool], bytes],
        tail: Callable[[], bytes] | None = None,
    ) -> None:
        """Run ``streams`` to the end: token chunks go out from the scheduler's tick (``Sink.direct``)
        while the socket keeps up; final chunks and anything the tick could not write go out here."""
        ready, send = sock.ready, sock.send

        def direct(event: tuple) -> bool:
            if event[3] or not ready():
                return False
            send(chunk(event[0], event[1], event[2], False))
            return True

        sink.direct = direct
        self.scheduler.submit(streams)
        left = len(streams)
        try:
            while left:
                parts = []
                for s, upto, t_sched, done in await sink.wait():
                    left -= done
                    parts.append(chunk(s, upto, t_sched, done))
                sock.busy = True
                await resp.write(parts[0] if len(parts) == 1 else b"".join(parts))
                sock.busy = False
            if tail is not None:
                await resp.write(tail())
            await resp.write(chunks.DONE)
        except (ConnectionError, RuntimeError):
            self.scheduler.abort(streams)
        finally:
            sink.direct = None

    def _generate_obj(self, s: Stream, upto: int, t_recv: float, t_sched: float | None) -> dict:
        done = upto >= s.target
        lo = 0
        meta: dict = {
            "id": s.rid,
            "finish_reason": None,
            "prompt_tokens": s.prompt_tokens,
            "weight_version": "default",
            "total_retractions": 0,
            "completion_tokens": upto,
            "cached_tokens": s.cached_tokens,
            "cached_tokens_details": None,
        }
        if done:
            meta["finish_reason"] = (
                {"type": "stop", "matched": text.EOS_TOKEN_ID}
                if s.finish == "stop"
                else {"type": "length", "length": upto}
            )
            meta["e2e_latency"] = round((s.t_done or time.time()) - t_recv, 6)
            if self.res.spec_on and s.verify_ct:
                draft = self.perf.draft_tokens
                accepted = max(0, upto - 1 - s.verify_ct)
                meta.update(
                    {
                        "spec_verify_ct": s.verify_ct,
                        "spec_accept_length": upto / s.verify_ct,
                        "spec_accept_rate": accepted / (s.verify_ct * max(1, draft - 1)),
                        "spec_accept_token_num": accepted,
                        "spec_draft_token_num": s.verify_ct * max(1, draft - 1),
                        "spec_accept_histogram": list(s.accept_hist),
                    }
                )
        ids = s.pieces[lo:upto]
        obj: dict[str, Any] = {
            "text": chunks.piece_text(s.pieces, 0, upto),
            "output_ids": [text.token_id(i) for i in ids],
            "meta_info": meta,
        }
        if t_sched is not None:
            obj["sim_t_recv"] = t_recv
            obj["sim_t_sched"] = t_sched
        return obj

    # -- OpenAI ---------------------------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, chat=True)

    async def _openai(self, request: web.Request, chat: bool) -> web.StreamResponse:
        t_recv = time.time()
        try:
            body = await self._json(request)
            if chat:
                messages = body.get("messages")
                if not isinstance(messages, list) or not messages:
                    raise BadRequest("`messages` must be a non-empty list")
                prompts = [(text.count_chat_tokens(messages), text.prompt_key(messages), text.prefix_blocks(messages))]
                replies = self.oracle.chat_replies(messages)
                max_new = self._int(
                    body, "max_completion_tokens", "max_tokens", default=self.args.context_length - prompts[0][0]
                )
            else:
                if "prompt" not in body:
                    raise BadRequest("`prompt` is required")
                prompts = self._prompt_list(body["prompt"], "prompt")
                replies = self.oracle.replies(body["prompt"])
                max_new = self._int(body, "max_tokens", default=16)
            sink = Sink()
            streams = self.make_streams(prompts, max_new, bool(body.get("ignore_eos")), sink, t_recv, replies=replies)
        except BadRequest as exc:
            return _openai_error(str(exc))
        rid = ("chatcmpl-" if chat else "cmpl-") + streams[0].rid
        created = int(t_recv)
        model = body.get("model") or self.served
        if not body.get("stream"):
            await self.run_to_end(streams, sink)
            return web.json_response(self._openai_full(streams, rid, created, model, chat))
        opts = body.get("stream_options") or {}
        include_usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
        continuous = isinstance(opts, dict) and bool(opts.get("continuous_usage_stats"))
        fmt = chunks.OpenAIFormat(rid, created, str(model), chat)
        resp = web.StreamResponse(headers=SSE_HEADERS)
        sock = await self._prepare_stream(request, resp)
        if chat:
            await resp.write(b"".join(fmt.role(s.index) for s in streams))
        sent = [0] * len(streams)
        ts = self.timestamps
        vocab = text.VOCAB_JSON

        def chunk(s: Stream, upto: int, t_sched: float, done: bool) -> bytes:
            i = s.index
            delta = b"".join([vocab[p] for p in s.pieces[sent[i] : upto]])
            sent[i] = upto
            tail = chunks.sim_fields(t_recv, t_sched, time.time()) if ts else b""
            usage = chunks.usage_bytes(s.prompt_tokens, upto) if continuous else chunks.NULL
            if not chat:  # every completions chunk carries the running usage
                return fmt.content(i, delta, s.finish if done else None, tail, usage)
            if done:  # chat: the content chunk does, the finish chunk does not
                return fmt.content(i, delta, None, tail, usage) + fmt.finish(i, s.finish)
            return fmt.content(i, delta, None, tail, usage)

        def usage() -> bytes:
            totals = self._usage(streams)
            if not chat:  # completions sends its usage chunk with exclude_none
                totals = {k: v for k, v in totals.items() if v is not None}
            return fmt.usage(totals)

        await self._pump(resp, sock, sink, streams, chunk, usage if include_usage else None)
        return resp

    def _usage(self, streams: list[Stream]) -> dict:
        """UsageInfo; ``prompt_tokens_details.cached_tokens`` only with --enable-cache-report and a hit."""
        cached = sum(s.cached_tokens for s in streams) if self.cache_report else None
        return chunks.usage_dict(sum(s.prompt_tokens for s in streams), sum(s.target for s in streams), cached)

    def _openai_full(self, streams: list[Stream], rid: str, created: int, model: str, chat: bool) -> dict:
        choices = []
        for s in streams:
            content = chunks.piece_text(s.pieces, 0, s.target)
            matched = text.EOS_TOKEN_ID if s.finish == "stop" else None
            if chat:
                choices.append(
                    {
                        "index": s.index,
                        "message": {
                            "role": "assistant",
                            "content": content,
                            "reasoning_content": None,
                            "tool_calls": None,
                        },
                        "logprobs": None,
                        "finish_reason": s.finish,
                        "matched_stop": matched,
                    }
                )
            else:
                choices.append(
                    {
                        "index": s.index,
                        "text": content,
                        "logprobs": None,
                        "finish_reason": s.finish,
                        "matched_stop": matched,
                    }
                )
        usage = self._usage(streams)
        return {
            "id": rid,
            "object": "chat.completion" if chat else "text_completion",
            "created": created,
            "model": model,
            "choices": choices,
            "usage": usage,
        }
