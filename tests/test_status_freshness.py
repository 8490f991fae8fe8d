"""/status answers from Redis: observers keep observations fresh on a timer, ages are shown, old ones are STALE.

Issue 23.1. Real Redis and a real observer process (``ObserverService``, as ``benchbot worker`` runs it) on
a local host with nothing listening: its observation is state ``none``, which is enough to watch the timer
refresh it unasked. Freshness is never faked: a stored observation past ``limits.observation_stale_s`` is
marked STALE in the text and ``stale: true`` in the JSON.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from bot.dispatch import Dispatcher
from bot.render import HostStatus, status_text
from tests.util import free_port, wait_until
from workers import keys, observer
from workers.config import Config, load_config
from workers.jobs.presence import HostService
from workers.observation import ObservedState, RunningConfig


def _config(tmp_path: Path, *, every_s: float = 1.0, stale_s: float = 60.0) -> Config:
    path = tmp_path / "benchbot.toml"
    path.write_text(
        f"""
default_host = "box"
[engine]
command = ["{{python}}", "-m", "workers.sim.sglang"]
model = "nvidia/Qwen3.5-397B-A17B-NVFP4"
[hosts.box]
transport = "local"
port = {free_port()}
log_dir = "{tmp_path / "logs"}"
nvidia_smi = ["{{python}}", "-m", "workers.sim.nvidia_smi"]
[limits]
observe_every_s = {every_s}
observation_stale_s = {stale_s}
status_deadline_s = 0.3
"""
    )
    return load_config(path)


def _store(r: redis.Redis, host: str, port: int, age_s: float) -> None:
    seen = RunningConfig(host=host, port=port, observed_at=time.time() - age_s, state=ObservedState.NONE)
    r.set(keys.host_observed(host), json.dumps(seen.to_dict()))


@pytest.fixture
def observer_for(redis_url: str) -> Iterator:
    services: list[observer.ObserverService] = []

    def start(config: Config) -> observer.ObserverService:
        service = observer.ObserverService(config, redis_url, list(config.hosts)).start()
        services.append(service)
        return service

    yield start
    for service in services:
        service.stop()


def test_the_observer_refreshes_a_host_on_its_timer_unasked(redis_client: redis.Redis, tmp_path: Path, observer_for):
    config = _config(tmp_path, every_s=1.0)
    observer_for(config)
    first = wait_until(lambda: observer.last_observation(redis_client, "box"), timeout=30, what="a first observation")
    assert first.state == ObservedState.NONE
    later = wait_until(
        lambda: (o := observer.last_observation(redis_client, "box")) and o.observed_at > first.observed_at and o,
        timeout=30,
        what="the timer to observe the host again",
    )
    assert later.observed_at > first.observed_at
    # Nobody asked: no request is left over and the observer wrote no reply for the unasked observations.
    assert redis_client.llen(keys.observe_requests("box")) == 0
    assert list(redis_client.scan_iter(match=keys.observe_reply("*"))) == []


def test_a_job_end_asks_at_most_a_bounded_number_of_times_when_no_observer_listens(redis_client: redis.Redis):
    for _ in range(observer.MAX_PENDING_REQUESTS * 3):
        observer.ask_observation(redis_client, "nobody")
    key = keys.observe_requests("nobody")
    assert redis_client.llen(key) == observer.MAX_PENDING_REQUESTS
    assert 0 < redis_client.ttl(key) <= observer.REQUEST_MAX_AGE_S
    # No id: nobody will wait for a reply to these.
    assert all("id" not in json.loads(raw) for raw in redis_client.lrange(key, 0, -1))


def test_status_answers_from_redis_with_the_age_and_marks_an_old_observation_stale(
    redis_client: redis.Redis, tmp_path: Path
):
    config = _config(tmp_path, stale_s=60.0)
    port = config.hosts["box"].port
    dispatcher = Dispatcher(config, redis_client)

    _store(redis_client, "box", port, age_s=5)
    began = time.monotonic()
    reply = dispatcher.handle("alice", "C1", "/status")
    took = time.monotonic() - began
    (host,) = reply.data["hosts"]
    assert reply.ok and host["fresh"] is None and host["stale"] is False
    assert 4 <= host["age_s"] < 60
    assert "STALE" not in reply.text and "as last observed" in reply.text
    # No observer alive: nothing is asked, so the answer does not wait for the deadline.
    assert took < config.limits.status_deadline_s + 5

    _store(redis_client, "box", port, age_s=600)
    reply = dispatcher.handle("alice", "C1", "/status")
    (host,) = reply.data["hosts"]
    assert host["stale"] is True and host["age_s"] >= 600
    assert "STALE: no worker is serving box" in reply.text


def test_status_asks_a_live_observer_and_shows_its_fresh_answer(
    redis_client: redis.Redis, tmp_path: Path, observer_for
):
    config = _config(tmp_path, every_s=600.0)
    observer_for(config)
    wait_until(lambda: redis_client.exists(keys.observer_alive("box")), timeout=30, what="the observer to come up")
    _store(redis_client, "box", config.hosts["box"].port, age_s=600)
    dispatcher = Dispatcher(config, redis_client)

    def fresh() -> dict | None:
        (host,) = dispatcher.handle("alice", "C1", "/status").data["hosts"]
        return host if host["fresh"] is not None else None

    host = wait_until(fresh, timeout=30, what="a fresh answer within the status deadline")
    assert host["stale"] is False and host["age_s"] < 30


def _view(age_s: float, service: HostService | None) -> HostStatus:
    seen = RunningConfig(host="box", port=30000, observed_at=time.time() - age_s, state=ObservedState.NONE)
    return HostStatus(host="box", port=30000, last=seen, service=service, stale_after_s=60.0)


def test_status_text_says_the_age_of_a_stored_observation_and_never_passes_it_off_as_new():
    served = HostService(host="box", served=True)
    assert status_text([_view(5, served)]).splitlines()[1].startswith("  observed ")
    assert "STALE" not in status_text([_view(5, served)])
    stale = status_text([_view(300, served)])
    assert "STALE: " in stale and "which may no longer hold" in stale


def test_one_observation_answers_everyone_waiting_for_the_host(redis_client: redis.Redis, tmp_path: Path, observer_for):
    # A burst of /status (three people at once) costs the host one look, and all three get that look.
    config = _config(tmp_path, every_s=600.0)
    pipe = redis_client.pipeline()
    ids = [f"burst-{i}" for i in range(3)]
    for request_id in ids:
        observer._push_request(pipe, "box", {"id": request_id, "at": time.time()})
    pipe.execute()
    observer_for(config)  # starts after the burst: every request is already waiting when it first looks

    def answers() -> list[dict] | None:
        got = [redis_client.lindex(keys.observe_reply(i), 0) for i in ids]
        return [json.loads(a) for a in got] if all(got) else None

    replies = wait_until(answers, timeout=30, what="an answer for every waiting request")
    seen = {reply["observation"]["observed_at"] for reply in replies}
    assert len(seen) == 1, seen  # one observation, not three
    assert redis_client.llen(keys.observe_requests("box")) == 0


def test_the_observer_runs_at_a_lower_cpu_priority(redis_client: redis.Redis, tmp_path: Path, observer_for):
    service = observer_for(_config(tmp_path, every_s=600.0))
    wait_until(lambda: redis_client.exists(keys.observer_alive("box")), timeout=30, what="the observer to come up")
    assert service.pid is not None
    nice = int(Path(f"/proc/{service.pid}/stat").read_text().rsplit(")", 1)[1].split()[16])
    assert nice == min(19, os.nice(0) + observer.OBSERVER_NICE) > os.nice(0), nice


def test_an_observer_busy_observing_still_says_it_is_alive(redis_client: redis.Redis, tmp_path: Path, observer_for):
    # An observation may take seconds on a busy host (here nvidia-smi takes 3 s): the observer must not look
    # dead meanwhile, or /status would say nobody serves the host and stop asking it.
    _config(tmp_path, every_s=600.0)
    toml = (tmp_path / "benchbot.toml").read_text()
    (tmp_path / "benchbot.toml").write_text(
        toml.replace(
            'nvidia_smi = ["{python}", "-m", "workers.sim.nvidia_smi"]',
            'nvidia_smi = ["{python}", "-c", "import time; time.sleep(3)"]',
        )
    )
    config = load_config(tmp_path / "benchbot.toml")
    observer_for(config)
    alive = keys.observer_alive("box")
    wait_until(lambda: redis_client.exists(alive), timeout=30, what="the observer to come up")
    lowest = observer.ALIVE_TTL_S * 1000
    began = time.monotonic()
    while not observer.last_observation(redis_client, "box"):  # its first observation, 3 s of nvidia-smi
        lowest = min(lowest, redis_client.pttl(alive))
        assert time.monotonic() - began < 30, "no first observation"
        redis_client.blpop(["nothing"], timeout=0.1)  # a 0.1 s pace that is not a sleep
    assert time.monotonic() - began >= 2  # the window really spanned the slow observation
    assert lowest > (observer.ALIVE_TTL_S - 2 * observer.HEARTBEAT_S) * 1000, lowest
