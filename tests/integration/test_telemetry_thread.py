"""Issue 22 items 3 and 4 the whole way: a bench on the simulated host stores its host fingerprint and
its telemetry plot reaches the Slack thread (stand-in) with the other plots; a run without telemetry
gets its usual plots and no telemetry one."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from bot import job_threads
from bot.slack_standin import SlackHarness, UploadedFile
from tests.factories import make_run
from tests.integration.harness import BenchbotHost
from tests.util import wait_until
from workers.jobs import events
from workers.results import store, tables
from workers.telemetry.fingerprint import EXTRA_KEY, HostFingerprint

CHANNEL = "C0TEAM"


def _first_job(h: BenchbotHost) -> str | None:
    entries = h.r.xrange(events.GLOBAL_STREAM, count=1)
    return events.Event.from_entry(*entries[0]).job if entries else None


@pytest.mark.slow
def test_a_sim_bench_stores_its_host_and_uploads_its_telemetry_plot_to_the_thread(
    redis_url: str, tmp_path: Path
) -> None:
    with (
        BenchbotHost(redis_url, tmp_path, workers=1) as h,
        SlackHarness(h.config, redis_url, tmp_path, progress_interval_s=0.2) as slack,
    ):
        answer = slack.command(
            "/launch", "cutlass cudnn then bench 1,4 in=64 out=48 n=8", user="alice", channel=CHANNEL
        )
        assert answer.status == 200, answer
        job = wait_until(lambda: _first_job(h), timeout=10, what="the job to be queued")
        wait_until(lambda: events.is_terminal(h.r, job), timeout=60, what="the job to end")
        terminal = events.job_events(h.r, job)[-1]
        assert terminal.type == "succeeded", (terminal.data, h.worker_logs())
        run_id = str(terminal.data.get("run_id") or terminal.data["bench"]["run_id"])

        record = store.get_run(h.r, run_id)
        host = HostFingerprint.from_dict(record.extra.get(EXTRA_KEY))
        assert host is not None, record.extra.keys()
        assert host.gpu_name == "NVIDIA RTX PRO 6000 Blackwell Server Edition" and host.gpu_count == 8
        assert host.driver and host.cuda and host.engine_version == record.engine_version
        assert host.topology is not None and host.topology.kinds == ("NODE", "SYS")  # a PCIe host, two sockets
        assert dict(host.packages).keys() >= {"sglang", "torch", "flashinfer-python", "triton", "sgl-kernel"}
        assert host.missing == (), host.missing
        assert f"host: 8x {host.gpu_name}" in tables.format_levels_table(record)
        assert any(lv.get("telemetry", {}).get("timeline") for lv in record.levels)
        # the per-token rates survive the secret scrubber on the way into Redis ("..._per_token" is no secret)
        assert isinstance(record.extra["telemetry"]["j_per_tok"], float)
        assert all(isinstance(lv["telemetry"]["pcie_bytes_per_tok"], float) for lv in record.levels)

        headers = wait_until(lambda: slack.standin.top_level(CHANNEL), timeout=10, what="the header")
        ts = headers[0].ts

        def telemetry_png() -> list[UploadedFile]:
            items = slack.standin.thread(CHANNEL, ts)
            return [i for i in items if isinstance(i, UploadedFile) and i.filename == f"{run_id}-telemetry.png"]

        (png,) = wait_until(telemetry_png, timeout=30, what="the telemetry plot in the thread")
        assert png.data.startswith(b"\x89PNG") and png.completed and png.thread_ts == ts
        others = [i for i in slack.standin.thread(CHANNEL, ts) if isinstance(i, UploadedFile)]
        assert {f"{run_id}-throughput.png", f"{run_id}-latency.png"} <= {f.filename for f in others}


def test_a_run_without_telemetry_uploads_its_plots_and_no_telemetry_plot(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    r = redis_client
    run_id = store.save_run(r, make_run("r1", host="gpu-no-smi"))
    infos = job_threads.draw_plots(store.result_runs(r, [run_id]), "17", tmp_path)
    uploads = job_threads.plot_uploads(infos)
    names = [u["filename"] for u in uploads]
    assert names == [f"{run_id}-throughput.png", f"{run_id}-latency.png"]
    assert all(Path(u["file"]).read_bytes().startswith(b"\x89PNG") for u in uploads)
