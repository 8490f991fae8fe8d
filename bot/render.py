"""Events, observations and job listings -> plain text (console, ``say``, Slack fallbacks).

Block Kit lives in ``bot/blocks.py`` and reuses these sentences, so the two never disagree.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any


def ago(ts: float | None, now: float | None = None) -> str:
    """``"3 min ago"`` for a unix time."""
    if not ts:
        return "at an unknown time"
    seconds = max(0, int((now or time.time()) - ts))
    if seconds < 60:
        return f"{seconds} s ago"
    if seconds < 3600:
        return f"{seconds // 60} min ago"
    if seconds < 86400:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min ago"
    return f"{seconds // 86400} d ago"


def queued_text(data: Mapping[str, Any]) -> str:
    """``@alice: launch nextn cudnn on gpu-1, queued #17, 2 ahead``."""
    ahead = data.get("ahead") or 0
    where = "next in line" if ahead == 0 else f"{ahead} ahead"
    return f"@{data['user']}: {data['summary']} on {data['host']}, queued #{data['job_id']}, {where}"


def _gib(mib: float) -> str:
    return f"{mib / 1024:.0f} GiB" if mib >= 1024 else f"{mib:.0f} MiB"


def _gpu_lines(config: Mapping[str, Any]) -> list[str]:
    gpus = config.get("gpus") or []
    if not gpus:
        return []
    used = sum(g.get("memory_used_mib") or 0 for g in gpus)
    total = sum(g.get("memory_total_mib") or 0 for g in gpus)
    line = f"GPUs: {len(gpus)} x {gpus[0].get('name')}, memory {used / 1024:.0f}/{total / 1024:.0f} GiB"
    return [line]


def config_lines(config: Mapping[str, Any]) -> list[str]:
    """What runs, as observed: the server's own config, process, instance, GPUs."""
    state = config.get("state")
    port = config.get("port")
    process = config.get("process")
    if state == "none" or not process:
        lines = [f"nothing on port {port}"]
        held = config.get("gpu_processes") or {}
        if held:
            pids = ", ".join(str(p) for p in list(held)[:6])
            lines.append(f"GPU memory still held by other processes: {_gib(sum(held.values()))} (pids {pids})")
        return lines + _gpu_lines(config)
    server = config.get("server") or {}
    argv = " ".join(process.get("argv") or [])
    owner = f" as {config['owner_user']}" if config.get("owner_user") else ""
    if not config.get("engine_kind") and state != "running":
        return [
            f"port {port} is held by pid {process.get('pid')}{owner}, which is not an engine benchbot can "
            f"identify ({state}): {argv[:300]}",
            *_gpu_lines(config),
        ]
    lines = []
    if config.get("managed"):
        who = config.get("launched_by") or {}
        lines.append(f"launched by @{who.get('user')} (job {who.get('job')}) {ago(who.get('at'))}")
    elif config.get("managed") is False:
        lines.append("UNMANAGED: benchbot did not start this server")
    if state == "loading":
        lines.append(
            f"LOADING: an engine bound for port {port} is starting up and does not listen yet "
            f"(pid {process.get('pid')}{owner}, started {ago(process.get('start_time'))}); it owns "
            "the port: no other engine will be started over it"
        )
    else:
        lines.append(f"config: {config.get('summary') or 'unknown'}")
        if state != "running":
            lines.append(f"state: {state}")
    version = server.get("version") or config.get("engine_version") or "?"
    model = server.get("model_path") or (config.get("launch_args") or {}).get("--model-path") or "?"
    lines.append(f"engine: sglang {version}, model {model}")
    if state != "loading":
        lines.append(f"fingerprint {config.get('fingerprint') or '-'}, instance {config.get('instance_id') or '-'}")
    lines.append(f"pid {process.get('pid')}{owner} started {ago(process.get('start_time'))}: {argv[:400]}")
    if config.get("owner_gpu_mib") is not None:
        lines.append(f"GPU memory held by this engine: {_gib(config['owner_gpu_mib'])}")
    return lines + _gpu_lines(config)


def service_line(host: str, service: Mapping[str, Any] | None) -> str | None:
    """What is wrong with who serves ``host`` (no worker, or a worker that cannot reach it); None when fine."""
    if not service:
        return None
    if not service.get("served"):
        return f"no worker is serving {host}: its jobs wait until one starts (`benchbot worker --host {host}`)"
    if service.get("connect_error"):
        return f"the worker serving {host} cannot reach it ({ago(service.get('error_at'))}): {service['connect_error']}"
    return None


def status_text(views: Iterable[Mapping[str, Any]]) -> str:
    """``/status``: per host, the fresh observation, or the last one with its age."""
    blocks = []
    for view in views:
        head = f"{view['host']} (port {view['port']})"
        running = view.get("running_job")
        job_line = f"  running job: #{running['job_id']} {running['summary']} (@{running['user']})" if running else ""
        problem = service_line(view["host"], view.get("service"))
        if view.get("fresh"):
            body = [f"  {line}" for line in config_lines(view["fresh"])]
        elif view.get("last"):
            last = view["last"]
            why = problem or "no worker answered now"
            body = [f"  {why}; last observed {ago(last.get('observed_at'))}:"]
            body += [f"    {line}" for line in config_lines(last)]
        elif problem:
            body = [f"  {problem}; never observed"]
        else:
            body = [
                "  no worker is serving this host and it was never observed: start `benchbot worker --host "
                f"{view['host']}`"
            ]
        blocks.append("\n".join([head, *body, *([job_line] if job_line else [])]))
    return "\n\n".join(blocks)


def queue_text(
    listing: Mapping[str, list[Mapping[str, Any]]], services: Mapping[str, Mapping[str, Any]] | None = None
) -> str:
    """``/queue``: running and queued jobs per host (and, given ``services``, a host nobody can serve)."""
    out = []
    for host, jobs in listing.items():
        problem = service_line(host, (services or {}).get(host))
        if not jobs:
            out.append(f"{host}: idle, nothing queued" + (f"; {problem}" if problem else ""))
            continue
        out.append(f"{host}:" + (f" {problem}" if problem else ""))
        for job in jobs:
            state = job.get("state")
            ahead = int(job.get("position") or 1) - 1  # as enqueue counts: every unfinished job before it
            where = {"running": "running", "waiting": "next, waiting for the host"}.get(
                str(state), "queued, next in line" if ahead == 0 else f"queued, {ahead} ahead"
            )
            out.append(f"  #{job['job_id']} {where}: {job.get('summary')} (@{job.get('user')})")
    return "\n".join(out)


def diagnosis_lines(diagnosis: Mapping[str, Any] | None) -> list[str]:
    """A failed launch, explained: category, the line that says so, what to try."""
    if not diagnosis:
        return []
    lines = [f"diagnosis: {diagnosis.get('category', 'unknown')}: {diagnosis.get('summary', '')}"]
    if diagnosis.get("evidence_line"):
        lines.append(f"  log: {diagnosis['evidence_line']}")
    return lines


def event_text(event: Mapping[str, Any]) -> str:
    """One job event as a line (or a few), for ``say --wait`` and the console."""
    kind = event.get("type")
    data = event.get("data") or {}
    job = event.get("job")
    if kind == "queued":
        return f"[#{job}] queued: {data.get('summary', '')} ({data.get('ahead', 0)} ahead)"
    if kind == "started":
        return f"[#{job}] started on {data.get('worker', 'a worker')}"
    if kind == "progress":
        return f"[#{job}] {data.get('phase', '')}: {data.get('message', '')}"
    if kind == "ready":
        lines = [f"[#{job}] READY. Verified running config:"]
        lines += [f"    {line}" for line in config_lines(data.get("config") or {})]
        for diff in data.get("diff") or []:
            lines.append(f"    ! asked {diff['arg']}={diff['requested']}, server reports {diff['observed']}")
        replaced = data.get("replaced")
        if replaced:
            lines.append(f"    replaced: {(replaced.get('config') or {}).get('summary')} ({replaced.get('how')})")
        return "\n".join(lines)
    if kind == "succeeded":
        return f"[#{job}] done. " + succeeded_text(data)
    if kind == "failed":
        lines = [f"[#{job}] FAILED: {data.get('message', '')}"]
        lines += [f"    {line}" for line in diagnosis_lines(data.get("diagnosis"))]
        tail = (data.get("diagnosis") or {}).get("log_tail") or []
        if tail:
            lines.append("    last log lines:")
            lines += [f"      {line}" for line in tail[-8:]]
        return "\n".join(lines)
    if kind == "cancelled":
        return f"[#{job}] cancelled by @{data.get('by', '?')}"
    return f"[#{job}] {kind}: {data}"


def succeeded_text(data: Mapping[str, Any]) -> str:
    """The closing summary of a job."""
    kind = data.get("kind", "")
    if kind == "stop":
        return str(data.get("message", "stopped"))
    if kind == "launch":
        return f"launched: {(data.get('config') or {}).get('summary', '')}"
    if kind in ("bench", "launch+bench"):
        bench = data.get("bench", data)
        text = f"run {bench.get('run_id')}"
        if not bench.get("valid", True):
            text += f" (INVALID: {bench.get('invalid_reason')})"
        if bench.get("table"):
            text += "\n" + str(bench["table"])
        return text
    if kind == "sweep":
        lines = [f"sweep {data.get('sweep_id')}:"]
        for cell in data.get("cells") or []:
            if cell.get("status") == "ok":
                lines.append(f"  {cell['label']}: run {cell.get('run_id')}")
            else:
                category = (cell.get("diagnosis") or {}).get("category", "failed")
                lines.append(f"  {cell['label']}: FAILED ({category}) {cell.get('message', '')}")
        if data.get("table"):
            lines.append(str(data["table"]))
        return "\n".join(lines)
    return str(data)
