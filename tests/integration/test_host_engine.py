"""Issue 13 items 2 and 3 end to end: the worker compiles the launch from *its* config, per host.

Real workers and Redis, the simulator as each host's engine. The bot (the dispatcher) may run with a
config that is out of date: what a job carries is intent only (preset words, flags, host), and the
worker builds the argv with its own config, so the engine listens where the worker waits for it. One
config may mix hosts whose engines differ (command, model, flags, env, API key variable).
"""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

import httpx
import pytest

from bot.dispatch import Dispatcher
from tests.integration.harness import CHANNEL, HOST, BenchbotHost, engine_pids, first
from tests.util import free_port
from workers.config import load_config, parse_config
from workers.jobs import events, queue
from workers.presets import build_launch

pytestmark = pytest.mark.slow

WORKER_MODEL = "nvidia/Qwen3.5-397B-A17B-NVFP4"  # what the harness's config (the workers') names
BOT_MODEL = "acme/stale-model-70B"


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def _nothing_listens(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def _bots_config(h: BenchbotHost, port: int) -> str:
    """The workers' config text with another engine port for the host and another model: a bot's stale copy."""
    text = h.config_path.read_text()
    assert f"port = {h.port}\n" in text and f'model = "{WORKER_MODEL}"' in text
    return text.replace(f"port = {h.port}\n", f"port = {port}\n").replace(
        f'model = "{WORKER_MODEL}"', f'model = "{BOT_MODEL}"'
    )


def test_the_engine_listens_where_the_workers_config_says_when_the_bots_config_differs(
    redis_url: str, tmp_path: Path
) -> None:
    with BenchbotHost(redis_url, tmp_path, workers=1) as h:
        bot_port = free_port()
        bot_config = parse_config(_bots_config(h, bot_port), "bot.toml")
        assert bot_config.host(HOST).port == bot_port and bot_config.host(HOST).engine.model == BOT_MODEL
        h.dispatcher = Dispatcher(bot_config, h.r, plots_dir=tmp_path / "plots")

        reply = h.run("alice", "/launch cutlass cudnn then bench 1 in=32 out=8 n=2")
        assert reply.ok and reply.job_id, reply.text
        launch = queue.job_payload(h.r, reply.job_id)["launch"]
        assert set(launch) == {"schema", "presets", "raw_flags", "label"}, launch  # intent only: no argv, port, model
        terminal, seen = h.wait(reply.job_id)
        assert terminal.type == "succeeded", (terminal.data, h.worker_logs())
        ready = first(seen, events.READY).data
        argv = ready["launch"]["argv"]
        assert _flag(argv, "--port") == str(h.port) and _flag(argv, "--model-path") == WORKER_MODEL
        assert ready["config"]["port"] == h.port and ready["config"]["server"]["model_path"] == WORKER_MODEL
        assert terminal.data["run_id"], "the bench measured the engine at the worker's URL"
        assert len(h.engine_pids()) == 1 and engine_pids(bot_port) == [] and _nothing_listens(bot_port)

        status = h.run("bob", "/status")  # the header names the port the worker observed, not the bot's
        assert f"{HOST} (port {h.port})" in status.text and str(bot_port) not in status.text, status.text


def test_a_queued_schema_1_launch_carrying_the_bots_argv_runs_as_the_workers_config_says(
    redis_url: str, tmp_path: Path
) -> None:
    with BenchbotHost(redis_url, tmp_path, workers=1) as h:
        bot_port = free_port()
        bot_config = parse_config(_bots_config(h, bot_port), "bot.toml")
        # What an older dispatcher queued: the whole LaunchSpec, argv and all, built from the bot's config.
        old = build_launch(bot_config, bot_config.host(HOST), ("cutlass", "cudnn")).to_dict()
        old.pop("version")
        assert old["schema"] == 1 and _flag(old["argv"], "--port") == str(bot_port)
        payload = {"schema": 1, "kind": "launch", "host": HOST, "user": "alice", "channel": CHANNEL, "launch": old}
        queued = queue.enqueue(
            h.r,
            HOST,
            "launch",
            payload,
            user="alice",
            channel=CHANNEL,
            summary="launch cutlass cudnn",
            job_timeout_s=600,
        )
        terminal, seen = h.wait(queued.job_id)
        assert terminal.type == "succeeded", (terminal.data, h.worker_logs())
        ready = first(seen, events.READY).data
        argv = ready["launch"]["argv"]
        assert _flag(argv, "--port") == str(h.port) and _flag(argv, "--model-path") == WORKER_MODEL
        assert ready["launch"]["presets"] == ["cutlass", "cudnn"]
        assert len(h.engine_pids()) == 1 and engine_pids(bot_port) == [] and _nothing_listens(bot_port)


SIM_HOST = "sim-b"
SIM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SIM_ENGINE = f"""command = ["{{python}}", "-m", "workers.sim.sglang"]
model = "{SIM_MODEL}"
flags = {{ "--tp-size" = 2 }}
env = {{ BENCHBOT_SIM_SGLANG_VERSION = "0.5.23" }}
api_key_env = "BENCHBOT_TEST_SIM_B_KEY"
launch_timeout_s = 45"""


def test_one_config_mixes_hosts_with_their_own_engines_each_launched_and_observed_by_its_worker(
    redis_url: str, tmp_path: Path
) -> None:
    key = f"sk-sim-b-{uuid.uuid4().hex}"
    with BenchbotHost(
        redis_url, tmp_path, workers=1, more_hosts={SIM_HOST: SIM_ENGINE}, env={"BENCHBOT_TEST_SIM_B_KEY": key}
    ) as h:
        config = load_config(str(h.config_path))
        assert config.host(HOST).engine is config.default_engine
        assert config.host(SIM_HOST).engine.model == SIM_MODEL

        # both at once: each host has its own queue, lease and worker
        default_job = h.run("alice", "/launch cutlass cudnn")
        own_job = h.run("bob", f"/launch cutlass cudnn on {SIM_HOST} then bench 1 in=32 out=8 n=2")
        assert default_job.ok and own_job.ok, (default_job.text, own_job.text)

        terminal, seen = h.wait(default_job.job_id)
        assert terminal.type == "succeeded", (terminal.data, h.worker_logs())
        ready = first(seen, events.READY).data
        argv = ready["launch"]["argv"]
        assert argv[1:3] == ["-m", "workers.sim.sglang"] and _flag(argv, "--model-path") == WORKER_MODEL
        assert _flag(argv, "--port") == str(h.ports[HOST]) and _flag(argv, "--tp-size") == "8"
        assert _flag(argv, "--quantization") == "modelopt_fp4"
        assert ready["engine"] == {"version": "0.5.9", "checked_against": "recorded"}
        assert ready["config"]["server"]["version"] == "0.5.9"

        terminal, seen = h.wait(own_job.job_id)
        assert terminal.type == "succeeded", (terminal.data, h.worker_logs())
        assert terminal.data["run_id"], "the bench (it needs this host's key) ran"
        ready = first(seen, events.READY).data
        argv = ready["launch"]["argv"]
        assert _flag(argv, "--model-path") == SIM_MODEL and _flag(argv, "--port") == str(h.ports[SIM_HOST])
        assert _flag(argv, "--tp-size") == "2" and "--quantization" not in argv  # its flags table, whole
        # the version probe and the engine both got the host engine's env: it imitates 0.5.23
        assert ready["engine"] == {"version": "0.5.23", "checked_against": "recorded"}
        assert ready["config"]["server"]["version"] == "0.5.23"
        assert ready["config"]["server"]["model_path"] == SIM_MODEL
        assert key not in str(ready)

        assert len(h.engine_pids(HOST)) == 1 and len(h.engine_pids(SIM_HOST)) == 1
        base = f"http://127.0.0.1:{h.ports[SIM_HOST]}"
        assert httpx.get(f"{base}/v1/models").status_code == 401, "this host's engine got its own key"
        assert httpx.get(f"{base}/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
        assert httpx.get(f"http://127.0.0.1:{h.ports[HOST]}/v1/models").status_code == 200  # the default: no key

        status = h.run("carol", "/status")  # each host observed afresh by its own worker, with its own key
        views = {view["host"]: view for view in status.data["hosts"]}
        assert views[HOST]["fresh"]["server"]["model_path"] == WORKER_MODEL
        assert views[SIM_HOST]["fresh"]["server"]["model_path"] == SIM_MODEL
        assert views[SIM_HOST]["fresh"]["port"] == h.ports[SIM_HOST]
        assert f"engine: sglang 0.5.23, model {SIM_MODEL}" in status.text, status.text
        assert f"engine: sglang 0.5.9, model {WORKER_MODEL}" in status.text, status.text
