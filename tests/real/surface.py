"""One script of requests for a vLLM server, real or simulated: what benchbot relies on, as comparable facts.

:func:`probe` sends the same requests to any ``vllm serve`` and returns ``{fact: value}``: the routes and
their status codes, the JSON keys of each answer, the SSE framing of a streamed completion and chat, the
usage fields, the ``/metrics`` names benchbot reads, and (from the log and the clock) the lines benchbot
waits on and the time from spawn to listening. Values are shapes, not numbers a model makes: keys,
codes, counts, booleans. ``tests/real/test_sim_vs_real.py`` runs it against the real CPU build and the
simulator's vLLM personality and requires every difference to be explained in docs/sim.md.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

#: ``/metrics`` names benchbot reads (observation, spec-decode stats) or a team would scrape per level.
METRIC_NAMES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:num_preemptions_total",
)
#: Log lines benchbot reads while an engine starts (readiness, args, version) and their patterns.
LOG_LINES = {
    "log_banner_version": r"version \d+\.\d+\.\d+",
    "log_non_default_args": r"non-default args: \{",
    "log_starting_server": r"Starting vLLM server on http://",
    "log_ready_line": r"Application startup complete\.",
    "log_route_list": r"Route: /v1/completions, Methods: POST",
}
ROUTES = (
    ("GET", "/health"),
    ("GET", "/version"),
    ("GET", "/v1/models"),
    ("GET", "/metrics"),
    ("GET", "/ping"),
    ("GET", "/load"),
    ("GET", "/server_info"),
    ("GET", "/get_server_info"),
    ("POST", "/generate"),
    ("GET", "/no-such-route"),
)


def spawn_and_wait(
    argv: list[str], env: Mapping[str, str], log: Path, port: int, timeout_s: float = 300
) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """Start a server, and time it: spawn -> port listening -> ``/health`` 200; what a client saw meanwhile."""
    t0 = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=dict(env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    facts: dict[str, Any] = {"while_loading": None}
    listening_at = None
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            raise AssertionError(f"{argv[:3]} exited {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        with socket.socket() as s:
            s.settimeout(0.5)
            up = s.connect_ex(("127.0.0.1", port)) == 0
        if not up:
            facts["while_loading"] = facts["while_loading"] or "connection refused"
        else:
            listening_at = listening_at or time.monotonic()
            try:
                code = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code
            except httpx.HTTPError as exc:
                code = type(exc).__name__
            if code == 200:
                facts["spawn_to_listening_s"] = round(listening_at - t0, 1)
                facts["spawn_to_healthy_s"] = round(time.monotonic() - t0, 1)
                return proc, facts
            facts["health_before_ready"] = code
        time.sleep(0.2)  # the poll interval of a deadline-bound wait (as tests.util.wait_until)
    raise AssertionError(f"{argv[:3]} not healthy within {timeout_s}s:\n{log.read_text(errors='replace')[-3000:]}")


def probe(base: str, model: str, log_text: str) -> dict[str, Any]:
    """The facts of one ready server (see the module docstring)."""
    facts: dict[str, Any] = {}
    with httpx.Client(base_url=base, timeout=60) as c:
        for method, path in ROUTES:
            resp = c.request(method, path, json={} if method == "POST" else None)
            facts[f"route {method} {path}"] = resp.status_code
        facts["health_body"] = c.get("/health").text
        facts["version_keys"] = sorted(c.get("/version").json())
        card = c.get("/v1/models").json()
        facts["models_object"] = card.get("object")
        entry = card["data"][0]
        facts["model_card_keys"] = sorted(entry)
        facts["model_owned_by"] = entry.get("owned_by")
        facts["model_root_is_id"] = entry.get("root") == entry.get("id")
        metrics = c.get("/metrics").text
        for name in METRIC_NAMES:
            facts[f"metric {name}"] = bool(re.search(rf"^{re.escape(name)}(_bucket|_sum|_count)?[{{ ]", metrics, re.M))

        body = {
            "model": model,
            "prompt": [1001, 1002, 1003, 1004],
            "max_tokens": 5,
            "temperature": 0,
            "ignore_eos": True,
        }
        plain = c.post("/v1/completions", json=body)
        facts["completion_status"] = plain.status_code
        answer = plain.json()
        facts["completion_keys"] = sorted(answer)
        facts["completion_object"] = answer.get("object")
        facts["completion_choice_keys"] = sorted(answer["choices"][0])
        facts["completion_finish_reason"] = answer["choices"][0].get("finish_reason")
        facts["completion_usage_keys"] = sorted(k for k, v in answer["usage"].items() if v is not None)
        facts["completion_usage_counts"] = [answer["usage"]["prompt_tokens"], answer["usage"]["completion_tokens"]]

        facts.update(
            stream_facts(
                c, "/v1/completions", {**body, "stream": True, "stream_options": {"include_usage": True}}, "completion"
            )
        )
        chat = {
            "model": model,
            "messages": [{"role": "user", "content": "Say hello"}],
            "max_tokens": 4,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        facts.update(stream_facts(c, "/v1/chat/completions", chat, "chat"))

        too_long = c.post("/v1/completions", json={**body, "max_tokens": 100000})
        facts["too_long_status"] = too_long.status_code
        facts["error_keys"] = (
            sorted(_json(too_long).get("error", {}))
            if isinstance(_json(too_long).get("error"), dict)
            else sorted(_json(too_long))
        )
        facts["unknown_model_status"] = c.post("/v1/completions", json={**body, "model": "no-such-model"}).status_code
    for key, pattern in LOG_LINES.items():
        facts[key] = re.search(pattern, log_text) is not None
    return facts


def stream_facts(c: httpx.Client, path: str, body: dict[str, Any], name: str) -> dict[str, Any]:
    """SSE framing of one streamed answer: content type, line shapes, the object, chunk and usage counts."""
    with c.stream("POST", path, json=body) as resp:
        content_type = resp.headers.get("content-type", "")
        raw = b"".join(resp.iter_raw()).decode()
    events = [e for e in raw.split("\n\n") if e.strip()]
    datas = [e[len("data: ") :] for e in events if e.startswith("data: ")]
    chunks = [json.loads(d) for d in datas if d != "[DONE]"]
    content = [ch for ch in chunks if ch.get("choices")]
    usage = [ch for ch in chunks if not ch.get("choices") and ch.get("usage")]
    return {
        f"{name}_stream_status": resp.status_code,
        f"{name}_stream_content_type": content_type.split(";")[0],
        f"{name}_stream_every_event_is_data": len(datas) == len(events),
        f"{name}_stream_ends_with_done": bool(datas) and datas[-1] == "[DONE]",
        f"{name}_stream_object": sorted({ch.get("object") for ch in chunks}),
        f"{name}_stream_content_chunks": len(content),
        f"{name}_stream_usage_chunks": len(usage),
        f"{name}_stream_usage_completion_tokens": usage[-1]["usage"].get("completion_tokens") if usage else None,
        f"{name}_stream_chunk_keys": sorted(set().union(*(set(ch) for ch in content))) if content else [],
    }


def _json(resp: httpx.Response) -> dict[str, Any]:
    try:
        data = resp.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def differences(real: Mapping[str, Any], sim: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{fact: (real, sim)}`` for every fact whose values differ (a fact one side lacks included)."""
    return {k: (real.get(k), sim.get(k)) for k in sorted(set(real) | set(sim)) if real.get(k) != sim.get(k)}
