"""TensorRT-LLM as the third engine behind the same commands (issue 21), end to end through real workers.

One config, two simulated hosts: ``gpu-1`` runs SGLang's simulator, ``trt-1`` the TensorRT-LLM personality
(``[hosts.trt-1.engine] kind = "trtllm"``). On the TensorRT-LLM host: ``/launch`` in its own preset words
(compiled to ``trtllm-serve serve MODEL --tp_size ...`` plus benchbot's private ``--config`` YAML for the
nested LLM API settings, kept while the server runs), ``/status`` from what it reports (argv read by the
recorded options, the ``--config`` file read back, ``/version``, ``/v1/models``), ``/bench`` through its
OpenAI API, ``/eval``, ``/stop`` (which removes the file). Two servers differing only in their ``--config``
file fingerprint apart, so a ``/bench`` meant for one refuses the other. A failed launch ends with the
diagnosis of its own recorded text. Benches are short (levels 1,4, out=16 n=8).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.harness import BenchbotHost
from tests.util import wait_until
from workers.engines import registry
from workers.jobs import lease, queue
from workers.jobs.outcomes import LaunchOutcome, parse_outcome
from workers.results import store

TRT = "trt-1"
#: The body of ``[hosts.trt-1.engine]``: TensorRT-LLM's simulator, its tensor parallelism in its own words.
TRTLLM_HOST_ENGINE = """kind = "trtllm"
command = ["{python}", "-m", "workers.sim.trtllm", "serve"]
flags = { "--tp_size" = 8 }
"""
BENCH = "1,4 in=64 out=16 n=8"
EVAL_N = 20

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fleet(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BenchbotHost]:
    """One SGLang host and one TensorRT-LLM host, one worker each (the whole file shares them)."""
    with BenchbotHost(
        redis_url, tmp_path_factory.mktemp("fleet"), workers=1, more_hosts={TRT: TRTLLM_HOST_ENGINE}
    ) as h:
        yield h


def test_launch_status_bench_eval_stop_on_a_trtllm_host(fleet: BenchbotHost) -> None:
    h = fleet
    done, seen = h.launch_ok("alice", f"/launch moe-cutlass mtp kv85 on {TRT} then bench {BENCH} then eval n={EVAL_N}")
    ready = next(e for e in seen if e.type == "ready").data
    argv = ready["launch"]["argv"]
    # TensorRT-LLM's words: `... workers.sim.trtllm serve MODEL --host ... --port P --tp_size 8 ...`
    assert argv[argv.index("serve") + 1] == "nvidia/Qwen3.5-397B-A17B-NVFP4"
    assert argv[argv.index("--tp_size") + 1] == "8"
    assert argv[argv.index("--kv_cache_free_gpu_memory_fraction") + 1] == "0.85"
    assert argv[argv.index("--port") + 1] == str(h.ports[TRT])
    assert not any(word.startswith("--moe_config") or word.startswith("--speculative") for word in argv)
    assert ready["launch"]["settings"] == {
        "moe_config": {"backend": "CUTLASS"},
        "speculative_config": {"decoding_type": "MTP", "num_nextn_predict_layers": 3},
    }
    config = ready["config"]
    assert config["engine_kind"] == "trtllm-sim" and config["state"] == "running"
    assert config["server"]["version"] == "1.3.0rc3"
    args = config["server"]["args"]
    assert args["tensor_parallel_size"] == 8 and args["free_gpu_memory_fraction"] == 0.85
    # the --config file's settings, read back from benchbot's own file the running process names
    assert args["moe_config.backend"] == "CUTLASS" and args["speculative_config.decoding_type"] == "MTP"
    assert args["speculative_config.num_nextn_predict_layers"] == 3
    settings_file = Path(args["extra_llm_api_options"])
    assert config["extra"]["settings_file"] == {
        "path": str(settings_file),
        "read": True,
        "settings": [
            "moe_config.backend",
            "speculative_config.decoding_type",
            "speculative_config.num_nextn_predict_layers",
        ],
    }
    assert oct(settings_file.stat().st_mode & 0o777) == "0o600"  # kept while the server runs
    assert config["summary"] == (
        "TensorRT-LLM pytorch, TP8, KV 0.85 of free memory, max batch 2048; from its --config file: MoE CUTLASS, MTP x3"
    )
    # every setting verified, the --config file's included: nothing differs, nothing goes unreported
    assert ready["diff"] == [], ready["diff"]

    outcome = parse_outcome(done.data)
    assert isinstance(outcome, LaunchOutcome) and outcome.eval is not None, done.data
    run = store.get_run(h.r, done.data["bench"]["run_id"])
    assert run is not None and run.valid and run.host == TRT
    assert run.params["api"] == "completions"  # no /generate: a plain /bench uses its OpenAI API
    assert all(level["output_tok_s"] > 0 for level in run.levels)
    # telemetry: the GPUs sampled, the server's /metrics (iteration stats, held open while it is busy) never
    # asked, and the run says why it has no load gauges
    no_gauges = registry.engine("trtllm").metrics.no_gauges
    for level in run.levels:
        telemetry = level["telemetry"]
        assert telemetry["missing"] == [f"no /metrics sample during the level ({no_gauges})"], telemetry
        assert telemetry["samples"] >= 1 and telemetry["j_per_tok"] is not None
    scored = store.get_run(h.r, outcome.eval.run_id)
    assert scored is not None and scored.eval is not None and scored.eval["correct"] == EVAL_N

    status = h.run("bob", f"/status {TRT}")
    assert status.ok, status.text
    observed = status.data["hosts"][0]["fresh"]
    assert observed["fingerprint"] == config["fingerprint"] and observed["managed"] is True
    assert observed["process"]["pid"] == h.engine_pids(TRT)[0]
    assert "engine: trtllm 1.3.0rc3" in status.text

    stop = h.run("alice", f"/stop {TRT}")
    stopped, _ = h.wait(stop.job_id)
    assert stopped.type == "succeeded", stopped.data
    assert "stopped TensorRT-LLM" in stopped.data["message"]
    wait_until(lambda: not h.engine_pids(TRT), timeout=10, what="the TensorRT-LLM engine to be gone")
    assert not settings_file.exists()  # removed with the server it belonged to


def test_servers_differing_only_in_their_config_file_fingerprint_apart_and_a_bench_refuses_the_other(
    fleet: BenchbotHost,
) -> None:
    h = fleet
    cutlass, _ = h.launch_ok("alice", f"/launch moe-cutlass on {TRT}")
    meant = cutlass.data["config"]
    held = lease.acquire(h.r, TRT, job="999999", user="carol", ttl_s=60, timeout_s=15)
    try:  # bob's launch runs first; erin's bench means the CUTLASS server running when she asked
        relaunch = h.run("bob", f"/launch moe-deepgemm on {TRT}")
        erin = h.run("erin", f"/bench {BENCH} on {TRT}")
        assert relaunch.ok and erin.ok and relaunch.job_id and erin.job_id, (relaunch.text, erin.text)
        assert queue.job_payload(h.r, erin.job_id)["expect"]["fingerprint"] == meant["fingerprint"]
    finally:
        held.release()
    replaced, _ = h.wait(relaunch.job_id)
    assert replaced.type == "succeeded", replaced.data
    now = replaced.data["config"]
    # the same argv (only the --config file differs): told apart by what the file says
    assert now["process"]["argv"] == meant["process"]["argv"]
    assert now["server"]["args"]["moe_config.backend"] == "DEEPGEMM" and now["fingerprint"] != meant["fingerprint"]
    assert "MoE DEEPGEMM" in now["summary"]
    refused, _ = h.wait(erin.job_id)
    assert refused.type == "failed", refused.data
    message = refused.data["message"]
    assert "the server changed since you asked" in message and "MoE DEEPGEMM" in message, message
    assert not any(r.user == "erin" for r in store.list_runs(h.r, n=100))
    # the file gone from under a running server: /status says its settings are not verified, and the
    # fingerprint is no longer the launch's
    os.unlink(now["server"]["args"]["extra_llm_api_options"])
    status = h.run("bob", f"/status {TRT}")
    observed = status.data["hosts"][0]["fresh"]
    assert observed["server"]["args"]["benchbot.settings_file_unread"] == "gone"
    assert observed["fingerprint"] != now["fingerprint"]
    assert "could not be read back (gone): the settings in it are not verified" in observed["detail"]
    stop = h.run("alice", f"/stop {TRT}")
    assert h.wait(stop.job_id)[0].type == "succeeded"


def test_a_failed_trtllm_launch_is_diagnosed_from_its_own_text(fleet: BenchbotHost) -> None:
    reply = fleet.run("alice", f"/launch moe-trtllm on {TRT}")  # trtllm-gen MoE on the simulated SM120 GPUs
    terminal, _ = fleet.wait(reply.job_id)
    assert terminal.type == "failed", terminal.data
    diagnosis = terminal.data["diagnosis"]
    assert diagnosis["category"] == "unsupported_gpu"
    assert "TRTLLMGenFusedMoE requires SM100 or SM103, got SM120" in diagnosis["evidence_line"]
    assert "CUTLASS" in diagnosis["summary"]
    assert not fleet.engine_pids(TRT)


def test_words_trtllm_refuses_never_start_anything(fleet: BenchbotHost) -> None:
    reply = fleet.run("alice", f"/launch nextn on {TRT}")
    assert not reply.ok and reply.job_id is None
    assert 'unknown preset "nextn" on trt-1 (TensorRT-LLM)' in reply.text
    # a YAML key's value is held against the recorded choices before anything starts
    bad = fleet.run("alice", f"/launch --moe_config.backend FLASHINFER on {TRT}")
    terminal, _ = fleet.wait(bad.job_id)
    assert terminal.type == "failed", terminal.data
    assert (
        "accepts only" in terminal.data["diagnosis"]["summary"] and "CUTLASS" in terminal.data["diagnosis"]["summary"]
    )
    assert "Nothing was stopped or started" in terminal.data["diagnosis"]["summary"]
    assert not fleet.engine_pids(TRT)
