"""How much error does our bench client add? Measured against the simulator's ground-truth mode.

Starts the simulator (``workers.sim.launcher.start_sim``, ``--sim-timing fixed``: token i of a request
is due at exactly sim_t_recv + TTFT + i*ITL, and every chunk carries the server's ``sim_t_recv``,
``sim_t_sched`` and ``sim_t_emit`` wall times), runs ``workers.benchmark.level.run_level`` at each concurrency and
prints JSON per level. Client and server share one machine and one clock (``time.time()``), so:

The client's errors (what the benchmark adds to what it reports):
- ``ttft_err_ms``: client TTFT - true TTFT from the same send instant
  = (first-token receive - send) - (first-token sim_t_emit - send) = receive - emit of the first token;
- ``itl_abs_err_ms``: |client gap between token events - the server's emit gap|, per token;
- ``lag_ms``: receive - sim_t_emit for every token;
- throughput: client-received tokens/s vs server-emitted tokens/s in the steady window
  (``throughput.client_vs_server``).

The simulator's own lateness (reported apart, so a slow simulator is not mistaken for a slow client):
- ``server.accept_delay_ms``: sim_t_recv - client send (connection accept, HTTP parse, dispatch);
- ``server.emit_jitter_ms``: sim_t_emit - sim_t_sched (lateness against its absolute schedule);
- ``server.ttft_err_ms``: first-token sim_t_emit - send - TTFT (what a perfect client would see);
- ``throughput.sim_delivery``: server-emitted tokens/s / the closed-loop ideal
  C * out / (TTFT + (out-1) * ITL); ``throughput.ideal_tok_s`` is C / ITL (C x 100 at 10 ms).

``goal_met`` per level: ``client`` (ttft_err p99 < 5 ms, ITL err p99 < 2 ms, >= 99 % of the emitted
tokens received, no errors), ``simulator`` (emit jitter p99 < 1 ms, server TTFT error p99 < 5 ms,
>= 99 % of the closed-loop ideal) and ``both``. With ``--repeat N`` each level runs N times and the row
holds the medians of every figure (goals judged on the medians; each run's key figures in ``runs``).

``--fence`` sends every request through the gate a job uses (``workers.jobs.lease`` fence check with a
margin, behind ``workers.jobs.faults``' pause point) on a real lease held in a private Redis with its
heartbeat running, to show what the fenced side-effect rule costs on the hot path (docs/metrics.md).

Usage: ``python bench/client_accuracy.py [--quick] [--levels 1,32,128,256,512] [--api completions]
[--realtime] [--repeat 3] [--fence]`` (JSON on stdout, one line per level on stderr as it finishes; figures and
machine conditions in docs/metrics.md). ``--realtime`` (root) pins the client to the first CPU and the
simulator to the last one, both SCHED_FIFO (``taskset``/``chrt``), as docs/metrics.md
("Client accuracy") describes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workers import redis_conn  # noqa: E402
from workers.benchmark.level import run_level  # noqa: E402
from workers.benchmark.metrics import RequestRecord, percentile, steady_window, tokens_between  # noqa: E402
from workers.benchmark.settings import ClientSettings  # noqa: E402
from workers.benchmark.spec import APIS, BenchSpec  # noqa: E402
from workers.jobs import faults, lease  # noqa: E402
from workers.ports import free_local_port  # noqa: E402
from workers.sim.launcher import SimProcess, start_sim  # noqa: E402

GOAL = {
    "ttft_err_p99_ms": 5.0,
    "itl_abs_err_p99_ms": 2.0,
    "throughput_ratio_min": 0.99,
    "server_emit_jitter_p99_ms": 1.0,
    "server_ttft_err_p99_ms": 5.0,
}


@contextlib.contextmanager
def held_lease() -> Iterator[lease.Lease]:
    """A real lease (TTL 30 s, heartbeat running) on a private Redis, as a job holds while it benches."""
    directory = Path(tempfile.mkdtemp(prefix="bb-accuracy-redis-"))
    sock = redis_conn.start_redis_server(directory)
    client = redis.Redis(unix_socket_path=str(sock))
    try:
        got = lease.try_acquire(client, "client-accuracy", job="1", user="bench", ttl_s=30.0)
        assert isinstance(got, lease.Lease), got
        got.start_heartbeat()
        try:
            yield got
        finally:
            got.release()
    finally:
        client.close()
        redis_conn.stop_redis_server(directory)
        shutil.rmtree(directory, ignore_errors=True)


def start_fixed_sim(port: int, ttft_ms: float, itl_ms: float) -> SimProcess:
    return start_sim(
        port, "--sim-timing", "fixed", "--sim-ttft-ms", str(ttft_ms), "--sim-itl-ms", str(itl_ms), timeout=60
    )


def realtime(server_pid: int, client_prio: int = 10, server_prio: int = 20) -> bool:
    """Client (this process) on the first CPU, the simulator on the last, both SCHED_FIFO (root).

    The simulator gets the higher priority: when both want a CPU, a late emit would be the server's
    fault and is measured as such (emit jitter), while a late client shows up as client error.
    """
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return False
    for pid, cpu, prio in ((server_pid, cpus[-1], server_prio), (os.getpid(), cpus[0], client_prio)):
        subprocess.run(["taskset", "-a", "-p", "-c", str(cpu), str(pid)], check=True, capture_output=True)
        subprocess.run(["chrt", "-f", "-a", "-p", str(prio), str(pid)], check=True, capture_output=True)
    return True


def server_field(event: dict[str, Any], key: str) -> float | None:
    """The simulator's ground-truth stamps, at the top level of a chunk or inside ``meta_info``."""
    value = event.get(key)
    if value is None:
        value = (event.get("meta_info") or {}).get(key)
    return float(value) if value is not None else None


def p(values: list[float], q: float) -> float | None:
    return round(percentile(sorted(values), q), 3) if values else None


def dist(values: list[float]) -> dict[str, float | None]:
    return {"p50": p(values, 50), "p99": p(values, 99), "max": round(max(values), 3) if values else None}


def concurrency_held(records: tuple[RequestRecord, ...], concurrency: int) -> float | None:
    """Share of the time from the first moment ``concurrency`` requests were in flight to the last send
    during which exactly that many were: a closed loop dips each time a request ends, until the client
    sends the next one, so a slow client shows here as well as in its CPU."""
    if not records:
        return None
    last_send = max(r.t_send_ns for r in records)
    edges = sorted([(r.t_send_ns, 1) for r in records] + [(r.t_end_ns, -1) for r in records])
    now, start, held, since = 0, None, 0, 0
    for t, step in edges:
        t = min(t, last_send)
        if start is not None and now >= concurrency:
            held += t - since
        now += step
        since = t
        if start is None and now >= concurrency:
            start = t
    if start is None or last_send <= start:
        return None
    return round(held / (last_send - start), 4)


def analyse(
    records: tuple[RequestRecord, ...], concurrency: int, output_len: int, ttft_ms: float, itl_ms: float
) -> dict[str, Any]:
    """All figures of one level from the client's records and the server's stamps (ms unless named)."""
    ttft_err, itl_err, lag = [], [], []
    accept, jitter, server_ttft_err = [], [], []
    first_wave: list[float] = []  # TTFT errors of the first C requests (sent together at the start)
    later: list[float] = []  # ... and of the rest (each sent when an earlier request ended)
    wave_end = sorted(r.t_send_ns for r in records)[min(concurrency, len(records)) - 1] if records else 0
    missing = 0
    emitted: list[tuple[float, int]] = []  # (emit time on the client's perf_counter clock, tokens)
    for r in records:
        if not r.ok or not r.events:
            continue
        emits = [server_field(e, "sim_t_emit") for e in r.events]
        scheds = [server_field(e, "sim_t_sched") for e in r.events]
        recv0 = server_field(r.events[0], "sim_t_recv")
        if recv0 is None or any(x is None for x in emits) or any(x is None for x in scheds):
            missing += 1
            continue
        em = [float(x) for x in emits]  # type: ignore[arg-type]
        off = r.wall_offset_s
        got = [t / 1e9 + off for t in r.chunk_t_ns]  # client receive times, wall clock
        send = r.t_send_ns / 1e9 + off
        ttft_err.append((got[0] - em[0]) * 1000)  # (got0 - send) - (em0 - send)
        (first_wave if r.t_send_ns <= wave_end else later).append(ttft_err[-1])
        accept.append((recv0 - send) * 1000)
        server_ttft_err.append((em[0] - send) * 1000 - ttft_ms)
        for i in range(1, len(em)):
            itl_err.append(abs((got[i] - got[i - 1]) - (em[i] - em[i - 1])) * 1000)
        for g, e, sc in zip(got, em, scheds, strict=True):
            lag.append((g - e) * 1000)
            jitter.append((e - sc) * 1000)  # type: ignore[operator]
        emitted.extend((e - off, k) for e, k in zip(em, r.chunk_tokens, strict=True))
    window = steady_window(records, concurrency)
    received_rate = emitted_rate = None
    if window is not None:
        s, e = window[0] / 1e9, window[1] / 1e9
        emitted_rate = sum(k for t, k in emitted if s <= t <= e) / (e - s)
        received_rate = tokens_between(records, window[0], window[1]) / (e - s)
    ideal = concurrency * 1000 / itl_ms
    closed = concurrency * output_len / ((ttft_ms + (output_len - 1) * itl_ms) / 1000)
    abs_ttft = [abs(x) for x in ttft_err]
    return {
        "ttft_err_ms": {
            **dist(ttft_err),
            "mean": round(sum(ttft_err) / len(ttft_err), 3) if ttft_err else None,
            "abs_p50": p(abs_ttft, 50),
            "abs_p99": p(abs_ttft, 99),
            "first_wave_p99": p(first_wave, 99),
            "later_p99": p(later, 99),
        },
        "itl_abs_err_ms": dist(itl_err),
        "lag_ms": dist(lag),
        "server": {
            "accept_delay_ms": dist(accept),
            "emit_jitter_ms": dist(jitter),
            "ttft_err_ms": dist(server_ttft_err),
        },
        "throughput": {
            "ideal_tok_s": round(ideal, 1),
            "closed_loop_ideal_tok_s": round(closed, 1),
            "server_emitted_tok_s": round(emitted_rate, 1) if emitted_rate else None,
            "client_received_tok_s": round(received_rate, 1) if received_rate else None,
            "client_vs_server": round(received_rate / emitted_rate, 4) if emitted_rate and received_rate else None,
            "sim_delivery": round(emitted_rate / closed, 4) if emitted_rate else None,
            "sim_delivery_vs_c_x_rate": round(emitted_rate / ideal, 4) if emitted_rate else None,
        },
        "records_without_server_stamps": missing,
    }


def judge(row: dict[str, Any]) -> dict[str, bool]:
    """The goal, split by who is responsible (see the module docstring)."""

    def below(value: float | None, limit: float) -> bool:
        return value is not None and value < limit

    def at_least(value: float | None, limit: float) -> bool:
        return value is not None and value >= limit

    tp, srv = row["throughput"], row["server"]
    client = bool(
        row["errors"] == 0
        and row["records_without_server_stamps"] == 0
        and below(row["ttft_err_ms"]["abs_p99"], GOAL["ttft_err_p99_ms"])
        and below(row["itl_abs_err_ms"]["p99"], GOAL["itl_abs_err_p99_ms"])
        and at_least(tp["client_vs_server"], GOAL["throughput_ratio_min"])
    )
    simulator = bool(
        below(srv["emit_jitter_ms"]["p99"], GOAL["server_emit_jitter_p99_ms"])
        and below(srv["ttft_err_ms"]["p99"], GOAL["server_ttft_err_p99_ms"])
        and at_least(tp["sim_delivery"], GOAL["throughput_ratio_min"])
    )
    return {"client": client, "simulator": simulator, "both": client and simulator}


def _median_tree(rows: list[Any]) -> Any:
    """Median of every number across repeated rows of the same shape (first value for the rest)."""
    first = rows[0]
    if isinstance(first, dict):
        return {k: _median_tree([r.get(k) for r in rows]) for k in first}
    if isinstance(first, bool) or not isinstance(first, int | float):
        return first
    values = [v for v in rows if isinstance(v, int | float)]
    return round(statistics.median(values), 4) if values else None


async def measure_level(url: str, c: int, args: argparse.Namespace) -> dict[str, Any]:
    n = max(args.min_requests, args.waves * c)
    spec = BenchSpec(
        levels=(c,),
        num_requests=n,
        input_len=args.input_len,
        output_len=args.output_len,
        warmup=min(c, 8),
        api=args.api,
    )
    settings = ClientSettings(spec, processes=args.processes, client=args.client)
    res = await run_level(url, settings, seed=c, keep_events=True, gate=args.gate)
    m = res.metrics
    row: dict[str, Any] = {"concurrency": c, "requests": n, "completed": m.completed, "errors": m.errors}
    row["concurrency_held"] = concurrency_held(res.records, c)
    row["hot_path"] = args.client
    row.update(analyse(res.records, c, args.output_len, args.ttft_ms, args.itl_ms))
    received = row["throughput"]["client_received_tok_s"] or m.output_tok_s
    row["achieved_steady_tok_s"] = round(received, 1)
    row["achieved_vs_ideal"] = round(received / row["throughput"]["closed_loop_ideal_tok_s"], 4)
    row["client"] = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in m.client.items()}
    row["reported"] = {
        "ttft_p50_ms": m.ttft_ms["p50"],
        "itl_p50_ms": m.itl_ms["p50"],
        "itl_p99_ms": m.itl_ms["p99"],
        "tpot_mean_ms": m.tpot_ms["mean"],
    }
    return row


async def measure(url: str, levels: list[int], args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for c in levels:
        runs = []
        for _ in range(max(1, args.repeat)):
            run = await measure_level(url, c, args)
            run["goal_met"] = judge(run)
            runs.append(run)
        row = _median_tree(runs) if len(runs) > 1 else runs[0]
        row["goal_met"] = judge(row)
        if len(runs) > 1:
            row["runs"] = [
                {
                    "ttft_err_p99": r["ttft_err_ms"]["abs_p99"],
                    "itl_err_p99": r["itl_abs_err_ms"]["p99"],
                    "client_vs_server": r["throughput"]["client_vs_server"],
                    "emit_jitter_p99": r["server"]["emit_jitter_ms"]["p99"],
                    "sim_delivery": r["throughput"]["sim_delivery"],
                    "goal_met": r["goal_met"],
                }
                for r in runs
            ]
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="levels 1,32, short streams (a few seconds)")
    ap.add_argument("--levels", default="1,32,128,256,512")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--waves", type=int, default=2, help="requests per level = waves x concurrency")
    ap.add_argument("--min-requests", type=int, default=8)
    ap.add_argument("--api", choices=APIS, default="generate")
    ap.add_argument("--processes", type=int, default=None, help="client processes (default: auto)")
    ap.add_argument(
        "--client", choices=("auto", "wire", "aiohttp"), default="auto", help="the hot path (auto: wire for http)"
    )
    ap.add_argument("--ttft-ms", type=float, default=50.0)
    ap.add_argument("--itl-ms", type=float, default=10.0)
    ap.add_argument("--url", default=None, help="measure this running fixed-timing server instead")
    ap.add_argument(
        "--realtime",
        action="store_true",
        help="(root) pin client to CPU 0 and the sim to the last CPU, both SCHED_FIFO, so other "
        "work on a small shared box does not pollute the figures",
    )
    ap.add_argument("--repeat", type=int, default=1, help="runs per level; the row holds the medians")
    ap.add_argument(
        "--fence",
        action="store_true",
        help="check a real lease (private Redis, heartbeat on) before every request, as a job does",
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.levels, args.output_len, args.min_requests = "1,32", 32, 4
    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    import uvloop

    load0 = os.getloadavg()
    pinned = False
    with contextlib.ExitStack() as stack:
        held = stack.enter_context(held_lease()) if args.fence else None
        args.gate = faults.PausingGate(faults.BEFORE_BENCH_REQUEST, held.checker) if held is not None else None
        if args.url:
            rows = uvloop.run(measure(args.url, levels, args))
        else:
            with start_fixed_sim(free_local_port(), args.ttft_ms, args.itl_ms) as sim:
                if args.realtime:
                    pinned = realtime(sim.pid)
                rows = uvloop.run(measure(sim.base_url, levels, args))
        redis_checks = None if held is None else held.checker.redis_checks
    out = {
        "schema": 1,
        "tool": "client_accuracy",
        "cpus": os.cpu_count(),
        "realtime": pinned,
        "fence": args.fence,
        "fence_redis_checks": redis_checks,
        "loadavg_before": [round(x, 2) for x in load0],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "api": args.api,
        "truth": {"ttft_ms": args.ttft_ms, "itl_ms": args.itl_ms},
        "input_len": args.input_len,
        "output_len": args.output_len,
        "repeat": args.repeat,
        "goal": GOAL,
        "levels": rows,
    }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
