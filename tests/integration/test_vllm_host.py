"""vLLM as the second engine behind the same commands (issue 15), end to end on a mixed fleet.

One config, two simulated hosts served by real workers: ``gpu-1`` runs SGLang's simulator, ``vllm-1`` runs
the vLLM personality (``[hosts.vllm-1.engine] kind = "vllm"``). On the vLLM host: ``/launch`` in vLLM's own
preset words (compiled to ``vllm serve MODEL --moe-backend ...``), ``/status`` from what vLLM reports
(argv read by the recorded parser, ``/version``, ``/v1/models``), ``/bench`` through its OpenAI API with
spec-decode acceptance from its counters, ``/compare`` beside an SGLang run, ``/stop``. A failed vLLM
launch ends with the diagnosis of vLLM's own recorded text. Benches are short (levels 1,4, out=16 n=8).
``/eval`` on the vLLM host scores its kernels as the SGLang host's would be scored (n=60).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.harness import HOST, VLLM_HOST_ENGINE, BenchbotHost
from tests.util import wait_until
from workers.jobs.outcomes import LaunchOutcome, parse_outcome
from workers.results import store

VLLM = "vllm-1"
BENCH = "1,4 in=64 out=16 n=8"
EVAL_N = 60  # the degraded path misses 7 of the first 60: enough for the gate (see test_eval_jobs.py)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fleet(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BenchbotHost]:
    """One SGLang host and one vLLM host, one worker each (the whole file shares them)."""
    with BenchbotHost(redis_url, tmp_path_factory.mktemp("fleet"), workers=1, more_hosts={VLLM: VLLM_HOST_ENGINE}) as h:
        yield h


def test_launch_status_bench_compare_stop_on_a_vllm_host(fleet: BenchbotHost) -> None:
    h = fleet
    _, seen = h.launch_ok("alice", f"/launch cutlass cudnn mtp on {VLLM}")
    ready = next(e for e in seen if e.type == "ready").data
    argv = ready["launch"]["argv"]
    # vLLM's words: `... workers.sim.vllm serve MODEL --host ... --port P --moe-backend flashinfer_cutlass ...`
    assert argv[argv.index("serve") + 1] == "nvidia/Qwen3.5-397B-A17B-NVFP4"
    assert argv[argv.index("--moe-backend") + 1] == "flashinfer_cutlass"
    assert argv[argv.index("--linear-backend") + 1] == "flashinfer_cudnn"
    assert argv[argv.index("--port") + 1] == str(h.ports[VLLM])
    assert "--model-path" not in argv and "--moe-runner-backend" not in argv
    config = ready["config"]
    assert config["engine_kind"] == "vllm-sim" and config["state"] == "running"
    assert config["server"]["version"] == "0.34.0"
    assert config["server"]["args"]["moe_backend"] == "flashinfer_cutlass"
    assert config["server"]["args"]["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 3}
    assert config["summary"].startswith("vLLM flashinfer_cutlass MoE, flashinfer_cudnn FP4 linear, MTP 3, TP8")
    assert ready["diff"] == [], ready["diff"]  # every requested flag is what the process runs

    status = h.run("bob", f"/status {VLLM}")
    assert status.ok, status.text
    observed = status.data["hosts"][0]["fresh"]
    assert observed["fingerprint"] == config["fingerprint"] and observed["managed"] is True
    assert observed["process"]["pid"] == h.engine_pids(VLLM)[0]
    assert "MTP 3" in status.text and "engine: vllm 0.34.0, model nvidia/Qwen3.5-397B-A17B-NVFP4" in status.text

    bench = h.run("alice", f"/bench {BENCH} on {VLLM}")
    done, _ = h.wait(bench.job_id)
    assert done.type == "succeeded", done.data
    vllm_run = store.get_run(h.r, done.data["run_id"])
    assert vllm_run is not None and vllm_run.valid
    assert vllm_run.params["api"] == "completions"  # vLLM has no /generate: a plain /bench uses its OpenAI API
    accept = [level["spec_accept_length"] for level in vllm_run.levels]
    assert all(a is not None and 1.0 < a <= 4.0 for a in accept), accept  # from vllm:spec_decode_* counters
    assert all(level["output_tok_s"] > 0 for level in vllm_run.levels)

    sglang_done, _ = h.launch_ok("alice", f"/launch cutlass cudnn then bench {BENCH}")
    sglang_run = store.get_run(h.r, sglang_done.data["bench"]["run_id"])
    assert sglang_run is not None and sglang_run.host == HOST
    assert sglang_run.fingerprint != vllm_run.fingerprint

    compare = h.run("carol", f"/compare {vllm_run.id} {sglang_run.id}")
    assert compare.ok, compare.text
    assert f"{vllm_run.id}  cutlass cudnn mtp  ({VLLM}, vLLM 0.34.0, fp {vllm_run.fingerprint[:8]})" in compare.text
    assert f"{sglang_run.id}  cutlass cudnn  ({HOST}, SGLang 0.5.9, fp {sglang_run.fingerprint[:8]})" in compare.text
    assert compare.files  # the overlay plots

    stop = h.run("alice", f"/stop {VLLM}")
    stopped, _ = h.wait(stop.job_id)
    assert stopped.type == "succeeded", stopped.data
    assert "stopped vLLM" in stopped.data["message"]
    wait_until(lambda: not h.engine_pids(VLLM), timeout=10, what="the vLLM engine to be gone")
    assert h.engine_pids(HOST)  # the SGLang host's server is untouched


def test_a_failed_vllm_launch_is_diagnosed_from_vllms_own_text(fleet: BenchbotHost) -> None:
    reply = fleet.run("alice", f"/launch trtllm on {VLLM}")  # trtllm-gen MoE on the simulated SM120 GPUs
    terminal, _ = fleet.wait(reply.job_id)
    assert terminal.type == "failed", terminal.data
    diagnosis = terminal.data["diagnosis"]
    assert diagnosis["category"] == "unsupported_gpu"
    assert "FLASHINFER_TRTLLM" in diagnosis["evidence_line"]
    assert "--moe-backend" in diagnosis["summary"]
    assert not fleet.engine_pids(VLLM)


def test_sglang_words_are_refused_on_the_vllm_host_before_anything_starts(fleet: BenchbotHost) -> None:
    reply = fleet.run("alice", f"/launch nextn on {VLLM}")
    assert not reply.ok and reply.job_id is None
    assert 'unknown preset "nextn" on vllm-1 (vLLM)' in reply.text and "mtp" in reply.text


def test_eval_on_the_vllm_host_flags_its_degraded_fp4_path(fleet: BenchbotHost) -> None:
    # The vLLM sim answers through the SGLang sim's Oracle (workers/sim/answers.py), its quality read from
    # vLLM's own flags: flashinfer_cutlass MoE + flashinfer_cudnn linear is right on every question...
    good_done, _ = fleet.launch_ok("alice", f"/launch cutlass cudnn on {VLLM} then eval n={EVAL_N}")
    good = parse_outcome(good_done.data)
    assert isinstance(good, LaunchOutcome) and good.eval is not None, good_done.data
    assert not good.eval.flagged and good.eval.baseline_run is None
    first = store.get_run(fleet.r, good.eval.run_id)
    assert first is not None and first.host == VLLM and first.eval is not None and first.eval["correct"] == EVAL_N
    # ... and flashinfer_cutlass linear (the degraded FP4 path, in vLLM's words) misses the same 7 of 60 as
    # SGLang's sim does, flagged against the vLLM host's own baseline.
    bad_done, _ = fleet.launch_ok("alice", f"/launch cutlass fp4-cutlass on {VLLM} then eval n={EVAL_N}")
    bad = parse_outcome(bad_done.data)
    assert isinstance(bad, LaunchOutcome) and bad.eval is not None, bad_done.data
    assert bad.eval.flagged and bad.eval.summary.startswith("ACCURACY DROP: 88.3 % (baseline 100.0 %")
    assert bad.eval.baseline_run == first.id
    stop = fleet.run("alice", f"/stop {VLLM}")
    stopped, _ = fleet.wait(stop.job_id)
    assert stopped.type == "succeeded", stopped.data
