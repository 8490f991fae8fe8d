"""Redis key names: one module names them all, and their spellings (a stored format) never change."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import redis

from tests.factories import make_run
from workers import keys
from workers.jobs import lease, waiting_line
from workers.results import store

ROOT = Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("bot", "workers", "ops", "bench", "tools")
KEY_LITERAL = re.compile(r"benchbot:[A-Za-z]")
#: Strings that look like keys and are not: the container image's tag.
NOT_KEYS = {"benchbot:latest"}


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the constant nodes that are docstrings (their ``benchbot:...`` mentions are prose)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def key_literals(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line: text`` of every string constant in ``path`` that spells a benchbot key."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    prose = _docstrings(tree)
    hits = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in prose
            and KEY_LITERAL.search(node.value)
            and node.value not in NOT_KEYS
        ):
            hits.append(f"{path.relative_to(root)}:{node.lineno}: {node.value!r}")
    return hits


def test_no_redis_key_is_spelled_outside_the_keys_module() -> None:
    hits = [
        hit
        for directory in SOURCE_DIRS
        if (ROOT / directory).is_dir()
        for path in sorted((ROOT / directory).rglob("*.py"))
        if path != ROOT / "workers" / "keys.py"
        for hit in key_literals(path)
    ]
    assert hits == [], "name Redis keys in workers/keys.py, not here:\n" + "\n".join(hits)


def test_the_guard_sees_plain_and_f_string_keys(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""Mentions ``benchbot:events`` in prose: allowed."""\n'
        'A = "benchbot:events"\n'
        'def f(job):\n    return f"benchbot:job:{job}:cancel"\n'
        'IMAGE = "benchbot:latest"\n'
        'MESSAGE = "benchbot: failed"\n',
        encoding="utf-8",
    )
    assert [hit.split(": ", 1)[0] for hit in key_literals(sample, tmp_path)] == ["sample.py:2", "sample.py:4"]


def test_key_spellings_are_the_stored_format() -> None:
    """Data written by an older benchbot is only found again if none of these changes."""
    spelled = [
        (keys.JOB_SEQ, "benchbot:seq:job"),
        (keys.ENQUEUE_LOCK, "benchbot:lock:enqueue"),
        (keys.queue_name("h1"), "benchbot-h1"),
        (keys.rq_queue("h1"), "rq:queue:benchbot-h1"),
        (keys.rq_job("7"), "rq:job:7"),
        (keys.job_cancel("7"), "benchbot:job:7:cancel"),
        (keys.user_queued("alice"), "benchbot:user:alice:queued"),
        (keys.EVENTS, "benchbot:events"),
        (keys.job_events("7"), "benchbot:job:7:events"),
        (keys.job_terminal("7"), "benchbot:job:7:terminal"),
        (keys.LEASE_HOSTS, "benchbot:lease:hosts"),
        (keys.lease("h1"), "benchbot:lease:h1"),
        (keys.lease_fence("h1"), "benchbot:fence:h1"),
        (keys.lease_last("h1"), "benchbot:lease:h1:last"),
        (keys.lease_waiters("h1"), "benchbot:lease:h1:waiters"),
        (keys.lease_waiter_prefix("h1"), "benchbot:lease:h1:waiter:"),
        (keys.lease_waiter("h1", "7"), "benchbot:lease:h1:waiter:7"),
        (keys.host_state("h1"), "benchbot:host:h1:state"),
        (keys.host_observed("h1"), "benchbot:host:h1:observed"),
        (keys.host_engine_version("h1"), "benchbot:host:h1:engine_version"),
        (keys.engine_contract("sglang", "0.5.9"), "benchbot:contract:sglang:0.5.9"),
        (keys.observe_requests("h1"), "benchbot:observe:h1:requests"),
        (keys.observe_reply("abc"), "benchbot:observe:reply:abc"),
        (keys.observer_alive("h1"), "benchbot:observer:h1:alive"),
        (keys.worker_connect_error("h1"), "benchbot:worker:h1:connect_error"),
        (keys.RUN_SEQ, "benchbot:seq:run"),
        (keys.RUNS, "benchbot:runs"),
        (keys.run("r3"), "benchbot:run:r3"),
        (keys.run_tags("r3"), "benchbot:run:r3:tagged"),
        (keys.host_runs("h1"), "benchbot:runs:host:h1"),
        (keys.host_baselines("h1"), "benchbot:baseline:h1"),
        (keys.SLACK_STEPS, "benchbot:slack:steps"),
        (keys.slack_thread("7"), "benchbot:slack:thread:7"),
        (keys.SLACK_DELIVERY_PREFIX, "benchbot:slack:delivery:"),
        (keys.SLACK_CLICK_PREFIX, "benchbot:slack:click:"),
    ]
    assert [actual for actual, _ in spelled] == [expected for _, expected in spelled]


def test_data_an_older_benchbot_wrote_is_read_back(redis_client: redis.Redis) -> None:
    """Written under the literal spellings with a bytes client, read through the key module."""
    redis_client.sadd("benchbot:lease:hosts", "gpu-1")
    redis_client.zadd("benchbot:lease:gpu-1:waiters", {"4": 4})
    redis_client.set("benchbot:lease:gpu-1:waiter:4", "queued")
    redis_client.set(
        "benchbot:lease:gpu-1",
        '{"user": "alice", "job": "3", "worker": "w", "since": 1.0, "fence": 2, "seq": 3, "ttl_ms": 30000}',
        px=30_000,
    )
    redis_client.set("benchbot:run:r1", json.dumps(make_run("r1", host="gpu-1", tags=("baseline",)).to_dict()))
    redis_client.zadd("benchbot:baseline:gpu-1", {"r1": 1.0})
    assert waiting_line.known_hosts(redis_client) == ["gpu-1"]
    assert waiting_line.waiters(redis_client, "gpu-1") == [("4", "queued")]
    holder = lease.current_holder(redis_client, "gpu-1")
    assert holder is not None and (holder[0].job, holder[0].user, holder[0].fence) == ("3", "alice", 2)
    assert store.get_run(redis_client, "r1").host == "gpu-1"
    baseline = store.baseline_for(redis_client, "gpu-1")
    assert baseline is not None and baseline.id == "r1"
