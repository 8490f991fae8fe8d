"""Slash-command ack latency under a burst: N users x M commands, signed, over HTTP, to the real bolt app.

Slack gives an app 3 s to acknowledge a slash command; benchbot's goal is p99 < 50 ms on a 2-core box
so a burst of teammates never sees "operation_timeout". Each user is a thread that sends its commands
back to back (so a user's commands have an order to keep); all users start together. The app answers
through the local Slack stand-in (``bot/slack_standin/``) and a private Redis. Then it checks that
every command was acknowledged with 200, every job was queued exactly once, and each host's queue
holds each user's jobs in the order that user sent them. Prints one JSON object.

    .venv/bin/python bench/ack_latency.py            # 20 users x 10 commands
    .venv/bin/python bench/ack_latency.py --quick    # 5 x 4, for tests
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

HOSTS = ("gpu-1", "gpu-2", "gpu-3", "gpu-4")
GOAL_P99_MS = 50.0


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))] if ordered else float("nan")


def bench_config(commands_per_user: int):
    """The embedded presets on four simulated hosts; a per-user limit that lets the whole burst queue."""
    from workers.config import EMBEDDED_TOML, parse_config

    text = EMBEDDED_TOML.replace('default_host = "sim"', 'default_host = "gpu-1"')
    text = text.replace("[hosts.sim]", "[hosts.gpu-1]")
    for index, host in enumerate(HOSTS[1:], 2):
        text += f"\n[hosts.{host}]\nport = {30000 + index}\n"
    text += f"\n[limits]\nmax_queued_per_user = {max(5, commands_per_user)}\n"
    return parse_config(text, "ack-latency.toml")


def user_commands(user_index: int, count: int) -> list[tuple[str, str]]:
    """A user's commands: launches and benches spread over the hosts (every one queues a job)."""
    out = []
    for i in range(count):
        host = HOSTS[(user_index + i) % len(HOSTS)]
        if i % 2 == 0:  # the index rides in each command so the queue order can be checked
            out.append(("/launch", f"cutlass cudnn --served-model-name v{i} on {host}"))
        else:
            out.append(("/bench", f"1,8 in={64 + i} out=16 on {host} any"))
    return out


def client_burst(url: str, webhook: str, users: int, commands_per_user: int) -> dict:
    """The load side, in its own process (as Slack is): every user's commands, signed, back to back."""
    import urllib.error
    import urllib.request
    from urllib.parse import urlencode

    from bot.slack_standin import signed_headers

    latencies: list[float] = []
    statuses: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(users)

    def one_user(index: int) -> None:
        name = f"u{index:02d}"
        bodies = [
            urlencode(
                {
                    "team_id": "T0STANDIN",
                    "channel_id": "C0TEAM",
                    "user_id": name,
                    "user_name": name,
                    "command": command,
                    "text": text,
                    "api_app_id": "A0STANDIN",
                    "response_url": webhook,
                    "trigger_id": f"{index}.{i}.{time.time_ns()}",
                }
            )
            for i, (command, text) in enumerate(user_commands(index, commands_per_user))
        ]
        start.wait()
        for body in bodies:
            request = urllib.request.Request(url, data=body.encode(), headers=signed_headers(body), method="POST")
            began = time.perf_counter()
            try:
                with urllib.request.urlopen(request, timeout=10) as resp:
                    resp.read()
                    status = resp.status
            except urllib.error.HTTPError as exc:
                status = exc.code
            except OSError:  # refused or reset: counted, never fatal to the burst
                status = 0
            elapsed = (time.perf_counter() - began) * 1000
            with lock:
                latencies.append(elapsed)
                statuses.append(status)

    threads = [threading.Thread(target=one_user, args=(i,)) for i in range(users)]
    began = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"latencies_ms": latencies, "statuses": statuses, "burst_s": time.monotonic() - began}


def run(users: int, commands_per_user: int) -> dict:
    import re
    import subprocess

    import redis

    from bot.slack_standin import SlackHarness
    from workers import redis_conn
    from workers.jobs import events, queue

    work = Path(tempfile.mkdtemp(prefix="bb-ack-"))
    sock = redis_conn.start_redis_server(work / "redis")
    url = f"unix://{sock}"
    r = redis.Redis.from_url(url)
    os.environ["BENCHBOT_STATE_DIR"] = str(work / "state")
    config = bench_config(commands_per_user)
    try:
        with SlackHarness(config, url, work, notifier=False) as h:
            h.command("/help")  # warm the app's first-request paths once
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--client",
                    h.server.url,
                    h.standin.webhook_url(),
                    str(users),
                    str(commands_per_user),
                ],
                capture_output=True,
                text=True,
                check=True,
                timeout=300,
            )
            burst = json.loads(out.stdout)
            latencies, statuses = burst["latencies_ms"], burst["statuses"]
            total = users * commands_per_user
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and len(h.standin.calls_to("chat.postMessage")) < total:
                time.sleep(0.05)
            headers = len(h.standin.calls_to("chat.postMessage"))
            queued_ids = [
                events.Event.from_entry(i, f).job
                for i, f in r.xrange(events.GLOBAL_STREAM)
                if json.loads(f[b"event"])["type"] == events.QUEUED
            ]
            order_ok = True
            per_host: dict[str, int] = {}
            for host in HOSTS:
                jobs = queue.list_jobs(r, host)
                per_host[host] = len(jobs)
                order_ok &= [j.seq for j in jobs] == sorted(j.seq for j in jobs)
                for index in range(users):
                    sent = [
                        i
                        for i, (_, text) in enumerate(user_commands(index, commands_per_user))
                        if text.split(" on ")[1].split()[0] == host
                    ]
                    got = [
                        int(re.search(r"(?:--served-model-name v|in=)(\d+)", j.summary).group(1))
                        - (64 if "in=" in j.summary else 0)
                        for j in jobs
                        if j.user == f"u{index:02d}"
                    ]
                    order_ok &= got == sent
        return {
            "schema": 1,
            "bench": "ack_latency",
            "users": users,
            "commands_per_user": commands_per_user,
            "commands": total,
            "acked_200": sum(1 for s in statuses if s == 200),
            "ack_ms": {
                "p50": round(_pct(latencies, 0.5), 2),
                "p99": round(_pct(latencies, 0.99), 2),
                "max": round(max(latencies), 2),
                "mean": round(sum(latencies) / len(latencies), 2),
            },
            "burst_s": round(burst["burst_s"], 3),
            "jobs_queued": len(queued_ids),
            "distinct_jobs": len(set(queued_ids)),
            "jobs_per_host": per_host,
            "headers_posted": headers,
            "lost": total - len(set(queued_ids)),
            "order_per_host_ok": bool(order_ok),
            "goal_p99_ms": GOAL_P99_MS,
            "meets_goal": _pct(latencies, 0.99) < GOAL_P99_MS,
            "cpus": os.cpu_count(),
        }
    finally:
        r.close()
        redis_conn.stop_redis_server(work / "redis")
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="5 users x 4 commands (for tests)")
    parser.add_argument("--users", type=int, default=20)
    parser.add_argument("--commands", type=int, default=10, help="commands per user")
    parser.add_argument(
        "--client", nargs=4, metavar=("URL", "WEBHOOK", "USERS", "COMMANDS"), help=argparse.SUPPRESS
    )  # the load side, run as a subprocess
    args = parser.parse_args()
    if args.client:
        url, webhook, users, commands = args.client
        print(json.dumps(client_burst(url, webhook, int(users), int(commands))))
        return 0
    users, commands = (5, 4) if args.quick else (args.users, args.commands)
    print(json.dumps(run(users, commands), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
