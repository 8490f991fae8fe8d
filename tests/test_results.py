"""Run history against a real Redis: save/get/list/filter/tag/baseline/export, scrubbing, tables."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import threading

import pytest

from tests.factories import make_run
from workers.errors import BenchbotError
from workers.results import export, store, tables
from workers.results.record import RunRecord, metric
from workers.secrets import REDACTED, is_secret_name


def _save_all(redis_client, *records: RunRecord) -> list[str]:
    return [store.save_run(redis_client, r) for r in records]


# ------------------------------------------------------------------------------------------ save / get


def test_save_assigns_sequential_ids_and_get_round_trips(redis_client):
    first = dataclasses.replace(make_run("r1"), id="")
    second = dataclasses.replace(make_run("r2", label="nextn cudnn"), id="")
    ids = _save_all(redis_client, first, second)
    assert ids == ["r1", "r2"]
    got = store.get_run(redis_client, "r2")
    assert got.to_dict() == dataclasses.replace(second, id="r2").to_dict()
    assert got.label == "nextn cudnn"
    assert got.levels[0]["ttft_ms"]["p50"] == second.levels[0]["ttft_ms"]["p50"]
    assert store.new_run_id(redis_client) == "r3"
    assert redis_client.zscore(store.INDEX_KEY, "r2") == second.created_at
    assert redis_client.zscore(store.host_index_key("gpu-1"), "r1") == first.created_at


def test_get_accepts_bare_numbers_and_unknown_ids_are_friendly(redis_client):
    _save_all(redis_client, make_run("r5"))
    assert store.get_run(redis_client, "5").id == "r5"
    assert store.get_run(redis_client, " R5 ").id == "r5"
    with pytest.raises(BenchbotError, match=r"no run r99; /runs lists them"):
        store.get_run(redis_client, "r99")
    with pytest.raises(BenchbotError, match="not a run id"):
        store.get_run(redis_client, "drop table")


def test_unknown_extra_keys_survive_and_dicts_are_accepted(redis_client):
    data = make_run("r1").to_dict()
    data["future_field"] = {"x": 1}
    data["levels"][0]["new_metric"] = 3.5
    rid = store.save_run(redis_client, data)
    got = store.get_run(redis_client, rid)
    assert got.extra == {"future_field": {"x": 1}}
    assert got.to_dict()["future_field"] == {"x": 1}
    assert got.levels[0]["new_metric"] == 3.5


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"schema": 2}, "schema 2"),
        ({"kind": "party"}, "kind 'party'"),
        ({"status": "meh"}, "status 'meh'"),
        ({"id": "x1"}, "not like r12"),
        ({"created_at": "yesterday"}, "created_at"),
        ({"levels": [{"output_tok_s": 3.0}]}, "concurrency"),
        ({"tags": ["Not OK"]}, "tags"),
        ({"host": ""}, "host"),
    ],
)
def test_malformed_records_are_rejected_with_a_reason(change, message):
    data = make_run("r1").to_dict() | change
    with pytest.raises(BenchbotError, match=message):
        RunRecord.from_dict(data)


def test_corrupt_stored_record_fails_clearly(redis_client):
    _save_all(redis_client, make_run("r1"))
    raw = json.loads(redis_client.get(store.run_key("r1")))
    raw["schema"] = 7
    redis_client.set(store.run_key("r1"), json.dumps(raw))
    with pytest.raises(BenchbotError, match="run r1 has schema 7"):
        store.get_run(redis_client, "r1")


def test_nan_metrics_are_stored_as_null(redis_client):
    run = make_run("r1")
    levels = [dict(run.levels[0], spec_accept_length=float("nan")), *run.levels[1:]]
    store.save_run(redis_client, dataclasses.replace(run, levels=tuple(levels)))
    got = store.get_run(redis_client, "r1")
    assert got.levels[0]["spec_accept_length"] is None
    assert metric(got.levels[0], "spec_accept_length") is None


# -------------------------------------------------------------------------------------- list / filter


def _history(redis_client) -> None:
    _save_all(
        redis_client,
        make_run("r3", created_at=3000.0, host="gpu-2", user="bob", label="fp8 flashinfer"),
        make_run("r1", created_at=1000.0, label="cutlass cudnn"),
        make_run("r2", created_at=2000.0, label="nextn cudnn", tags=("spec",)),
        make_run("r4", created_at=4000.0, label="trtllm", failure="unsupported_gpu"),
        make_run("r5", created_at=5000.0, label="cutlass", valid=False, invalid_reason="restarted"),
    )


def test_list_runs_newest_first_with_limit(redis_client):
    _history(redis_client)
    assert [r.id for r in store.list_runs(redis_client)] == ["r5", "r4", "r3", "r2", "r1"]
    assert [r.id for r in store.list_runs(redis_client, n=2)] == ["r5", "r4"]
    assert store.list_runs(redis_client, n=0) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpu-2", ["r3"]),
        ("bob", ["r3"]),
        ("spec", ["r2"]),
        ("cudnn", ["r2", "r1"]),
        ("CUDNN alice", ["r2", "r1"]),
        ("nextn gpu-1", ["r2"]),
        ("qwen3-8b gpu-2", ["r3"]),  # a word of the observed config summary
        ("failed", ["r4"]),
        ("invalid", ["r5", "r4"]),  # a failed run is not a valid measurement either
        ("nobody", []),
    ],
)
def test_list_runs_filter(redis_client, text, expected):
    _history(redis_client)
    assert [r.id for r in store.list_runs(redis_client, n=10, filter=text)] == expected


def test_list_runs_pages_through_long_histories(redis_client):
    for i in range(1, 251):
        store.save_run(redis_client, make_run(f"r{i}", created_at=float(i), host="gpu-9" if i == 3 else "gpu-1"))
    found = store.list_runs(redis_client, n=5, filter="gpu-9")
    assert [r.id for r in found] == ["r3"]
    assert len(store.list_runs(redis_client, n=300)) == 250


# ---------------------------------------------------------------------------------------- tags


@pytest.mark.parametrize("bad", ["Bad Tag", "", "-x", "a" * 33, "ü", "x;rm"])
def test_bad_tags_are_refused_and_change_nothing(redis_client, bad):
    _save_all(redis_client, make_run("r1"))
    with pytest.raises(BenchbotError, match="not a valid tag"):
        store.tag_run(redis_client, "r1", bad, by="alice")
    assert store.get_run(redis_client, "r1").tags == ()


def test_tag_unknown_run_is_friendly(redis_client):
    with pytest.raises(BenchbotError, match="no run r42"):
        store.tag_run(redis_client, "r42", "baseline", by="alice")


def test_tags_accumulate_are_idempotent_and_record_who(redis_client):
    _save_all(redis_client, make_run("r1"))
    store.tag_run(redis_client, "r1", "fp8-kv", by="alice")
    store.tag_run(redis_client, "r1", "Baseline", by="bob")
    updated = store.tag_run(redis_client, "r1", "fp8-kv", by="carol")
    assert updated.tags == ("fp8-kv", "baseline")
    assert store.get_run(redis_client, "r1").tags == ("fp8-kv", "baseline")
    info = store.tag_info(redis_client, "r1")
    assert info["baseline"]["by"] == "bob"
    assert info["fp8-kv"]["by"] == "carol"
    assert [r.id for r in store.list_runs(redis_client, filter="fp8-kv")] == ["r1"]
    removed = store.untag_run(redis_client, "r1", "fp8-kv", by="alice")
    assert removed.tags == ("baseline",)


def test_concurrent_taggers_lose_nothing(redis_client, redis_url):
    import redis as redis_lib

    _save_all(redis_client, make_run("r1"))
    tags = [f"t{i}" for i in range(12)]

    def tag(name: str) -> None:
        client = redis_lib.Redis.from_url(redis_url)
        try:
            store.tag_run(client, "r1", name, by="bot")
        finally:
            client.close()

    threads = [threading.Thread(target=tag, args=(t,)) for t in tags]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert sorted(store.get_run(redis_client, "r1").tags) == sorted(tags)


def test_baseline_is_per_host_and_follows_the_latest_tagging(redis_client):
    _save_all(
        redis_client,
        make_run("r1", label="cutlass cudnn"),
        make_run("r2", label="nextn cudnn"),  # a different config: baselines are config-independent
        make_run("r3", host="gpu-2"),
    )
    assert store.baseline_for(redis_client, "gpu-1") is None
    store.tag_run(redis_client, "r2", "baseline", by="alice")
    assert store.baseline_for(redis_client, "gpu-1").id == "r2"
    store.tag_run(redis_client, "r1", "baseline", by="bob")
    assert store.baseline_for(redis_client, "gpu-1").id == "r1"
    assert store.baseline_for(redis_client, "gpu-2") is None
    store.untag_run(redis_client, "r1", "baseline", by="bob")
    assert store.baseline_for(redis_client, "gpu-1").id == "r2"
    store.tag_run(redis_client, "r3", "baseline", by="bob")
    assert store.baseline_for(redis_client, "gpu-2").id == "r3"
    assert store.baseline_for(redis_client, "gpu-1").id == "r2"


def test_saving_a_run_already_tagged_baseline_makes_it_the_baseline(redis_client):
    _save_all(redis_client, make_run("r1", tags=("baseline",)))
    assert store.baseline_for(redis_client, "gpu-1").id == "r1"


# ------------------------------------------------------------------------------------------ secrets


def test_secrets_never_reach_redis(redis_client, monkeypatch):
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-1111-2222-abcdefghijkl")
    monkeypatch.setenv("MY_SERVICE_PASSWORD", "correct-horse-battery")
    run = make_run("r1")
    config = json.loads(json.dumps(run.config))
    config["server"]["args"]["api_key"] = "sk-live-0123456789abcdefXYZ"
    config["server"]["args"]["admin_api_key"] = "admin-secret-77"
    config["process"]["argv"] += ["--api-key", "argv-secret-1", "--hf-token=hf_abcdefghijklmnopqrstu"]
    config["env"] = {"HF_TOKEN": "hf_zzzzzzzzzzzzzzzzzzzzzz", "CUDA_VISIBLE_DEVICES": "0"}
    diagnosis = {
        "category": "crash",
        "summary": "engine died",
        "evidence_line": "auth failed with correct-horse-battery",
        "log_tail": ["posting with xoxb-1111-2222-abcdefghijkl", "Authorization: Bearer abc.def.ghi"],
    }
    store.save_run(redis_client, dataclasses.replace(run, config=config, diagnosis=diagnosis))
    raw = redis_client.get(store.run_key("r1")).decode()
    for secret in (
        "sk-live-0123456789abcdefXYZ", "admin-secret-77", "argv-secret-1", "hf_abcdefghijklmnopqrstu",
        "hf_zzzzzzzzzzzzzzzzzzzzzz", "xoxb-1111-2222-abcdefghijkl", "correct-horse-battery", "abc.def.ghi",
    ):  # fmt: skip
        assert secret not in raw, secret
    got = store.get_run(redis_client, "r1")
    assert got.config["server"]["args"]["api_key"] == REDACTED
    assert got.config["env"] == {"HF_TOKEN": REDACTED, "CUDA_VISIBLE_DEVICES": "0"}
    assert got.config["process"]["argv"][-3:] == [
        "--api-key",
        REDACTED,
        f"--hf-token={REDACTED}",
    ]
    # what is not a secret is kept as observed
    assert got.levels[0]["output_tokens"] == run.levels[0]["output_tokens"]
    assert got.config["server"]["args"]["model_path"] == "/models/Qwen3-8B"
    assert got.diagnosis["log_tail"][1].startswith("Authorization: ")


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("api_key", True), ("--api-key", True), ("HF_TOKEN", True), ("admin_api_key", True),
        ("password", True), ("SLACK_SIGNING_SECRET", True), ("token", True),
        ("output_tokens", False), ("max_new_tokens", False), ("tokenizer_path", False),
        ("input_tokens", False), ("keyframe", False), ("tp_size", False),
    ],
)  # fmt: skip
def test_secret_names(name, secret):
    assert is_secret_name(name) is secret


# ------------------------------------------------------------------------------------------- export


def test_export_jsonl_is_one_full_record_per_line_oldest_first(redis_client):
    _history(redis_client)
    out = io.StringIO()
    assert export.export_runs(redis_client, "jsonl", out) == 5
    lines = out.getvalue().splitlines()
    records = [RunRecord.from_dict(json.loads(line)) for line in lines]
    assert [r.id for r in records] == ["r1", "r2", "r3", "r4", "r5"]
    assert records[1].to_dict() == store.get_run(redis_client, "r2").to_dict()


def test_export_csv_parses_back_to_the_metrics(redis_client):
    _history(redis_client)
    out = io.StringIO()
    export.export_runs(redis_client, "csv", out)
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert list(rows[0].keys()) == list(export.CSV_COLUMNS)
    # 4 runs x 3 levels, plus one level-less row for the failed run
    assert len(rows) == 4 * 3 + 1
    r2 = store.get_run(redis_client, "r2")
    r2_rows = [row for row in rows if row["run_id"] == "r2"]
    assert [int(row["concurrency"]) for row in r2_rows] == [1, 8, 32]
    for row, level in zip(r2_rows, r2.levels, strict=True):
        assert float(row["output_tok_s"]) == pytest.approx(level["output_tok_s"], rel=1e-5)
        assert float(row["per_user_tok_s"]) == pytest.approx(level["per_user_tok_s"], rel=1e-5)
        assert float(row["ttft_p99_ms"]) == pytest.approx(level["ttft_ms"]["p99"], rel=1e-5)
        assert float(row["itl_p50_ms"]) == pytest.approx(level["itl_ms"]["p50"], rel=1e-5)
        assert float(row["e2e_p50_ms"]) == pytest.approx(level["e2e_ms"]["p50"], rel=1e-5)
        assert row["client_bottleneck"] == "server"
        assert row["errors"] == "0"
    assert r2_rows[0]["created_at"] == "1970-01-01T00:33:20Z"
    assert r2_rows[0]["tags"] == "spec"
    assert r2_rows[0]["fingerprint"] == r2.fingerprint
    assert r2_rows[0]["engine_version"] == "0.5.6"
    assert r2_rows[0]["spec_accept_length"] == ""
    failed = [row for row in rows if row["run_id"] == "r4"]
    assert len(failed) == 1
    assert (failed[0]["status"], failed[0]["failure_category"], failed[0]["concurrency"]) == (
        "failed", "unsupported_gpu", "",
    )  # fmt: skip
    assert {row["valid"] for row in rows if row["run_id"] == "r5"} == {"false"}


def test_export_filter_and_bad_format(redis_client):
    _history(redis_client)
    out = io.StringIO()
    assert export.export_runs(redis_client, "jsonl", out, filter="gpu-2") == 1
    assert json.loads(out.getvalue())["id"] == "r3"
    with pytest.raises(BenchbotError, match="use jsonl or csv"):
        export.export_runs(redis_client, "xlsx", io.StringIO())


# -------------------------------------------------------------------------------------------- tables


def test_runs_table_is_aligned_and_shows_state():
    records = [
        make_run("r12", label="cutlass cudnn", tags=("baseline",)),
        make_run("r3", label="trtllm", failure="unsupported_gpu"),
        make_run("r4", label="nextn", valid=False, user="bartholomew"),
    ]
    table = tables.format_runs_table(records)
    lines = table.splitlines()
    assert lines[0].split()[:2] == ["id", "when"]
    assert len(lines) == 4
    # the best tok/s column is right-aligned: every row's number ends at the header's end
    end = lines[0].index("best tok/s") + len("best tok/s")
    assert lines[1][:end].endswith(f"{records[0].best_output_tok_s:,.0f}")
    assert lines[2][:end].endswith("-")
    assert "ok baseline" in lines[1]
    assert "FAILED (unsupported_gpu)" in lines[2]
    assert "INVALID" in lines[3] and "bartholomew" in lines[3]
    assert tables.format_runs_table([]) == "no runs yet"


def test_compare_table_rows_are_levels_with_percent_change():
    base = make_run("r1", label="cutlass cudnn", levels=(1, 8, 32))
    faster = make_run("r2", label="nextn cudnn", speed=1.3, levels=(1, 8, 32, 64))
    bad = make_run("r3", label="fp8", valid=False, invalid_reason="server restarted mid-run")
    table = tables.compare_table([base, faster, bad])
    lines = table.splitlines()
    assert "r3  fp8" in table and "INVALID: server restarted mid-run" in table
    header = next(line for line in lines if line.lstrip().startswith("conc"))
    assert "r1 tok/s" in header and "r2 tok/s" in header and "r3* tok/s" in header
    body = lines[lines.index(header) + 1 :]
    rows = {int(line.split()[0]): line for line in body[: body.index("")]}
    assert sorted(rows) == [1, 8, 32, 64]
    # one run a side: the change is shown, no significance is claimed; the invalid run is not tested
    verdicts = body[body.index("") + 1 :]
    assert verdicts[0].startswith("verdict (output tok/s vs r1, Welch's t-test")
    assert verdicts[1].startswith("  r2: c=1 +30 %; c=8 +30 %; c=32 +30 %; c=64 not measured in the baseline")
    # said once for the line, not once per level (issue 36 item 5)
    assert verdicts[1].endswith(" (1 run each: no confidence interval; use repeat=3 or more)"), verdicts[1]
    assert verdicts[1].count("no confidence interval") == 1 and len(verdicts) == 2
    tok1 = base.level(8)["output_tok_s"]
    tok2 = faster.level(8)["output_tok_s"]
    assert f"({(tok2 - tok1) / tok1 * 100:+.1f}%)" in rows[8]
    assert "+30.0%" in rows[8]
    assert rows[64].split()[1] == "-"  # r1 did not measure 64
    assert tables.compare_table([]) == "nothing to compare"


def test_bench_table_names_the_engine_version_the_server_reported():
    from workers.results.tables import format_levels_table

    text = format_levels_table(make_run("r7", version="0.5.23"))
    assert text.splitlines()[0].startswith("r7 on gpu-1 (SGLang 0.5.23): ")


def _repeated(run_id: str, per_repeat: list[float]) -> RunRecord:
    """A run whose level c=8 was measured once per value (output tok/s), as repeat=N stores it."""
    from workers.benchmark.stats import combine_repeats

    template = make_run("tmp", levels=(8,)).levels[0]
    sweeps = [[{**template, "output_tok_s": tok}] for tok in per_repeat]
    return dataclasses.replace(make_run(run_id, levels=(8,)), levels=combine_repeats(sweeps))


def test_repeated_levels_store_the_median_run_every_repeat_and_estimates():
    run = _repeated("r1", [100.0, 104.0, 96.0])
    (level,) = run.levels
    assert level["output_tok_s"] == 100.0  # the median run, a real one
    assert [x["output_tok_s"] for x in level["repeats"]] == [100.0, 104.0, 96.0]
    est = level["estimates"]["output_tok_s"]
    assert est["n"] == 3 and est["mean"] == pytest.approx(100.0)
    # t(0.975, 2) = 4.303, sd = 4, half width = 4.303 * 4 / sqrt(3) = 9.94
    assert est["half_width"] == pytest.approx(9.94, abs=0.01)
    assert RunRecord.from_dict(json.loads(json.dumps(run.to_dict()))).levels[0]["estimates"] == level["estimates"]
    table = tables.format_levels_table(run)
    assert "tok/s mean ± 95%" in table and "100 ± 10 (n=3)" in table


def test_compare_of_repeated_runs_gives_a_significant_verdict_or_says_noise():
    base = _repeated("r1", [100.0, 102.0, 98.0])
    nextn = _repeated("r2", [195.0, 197.0, 193.0])
    noisy = _repeated("r3", [90.0, 115.0, 101.0])
    lines = tables.compare_table([base, nextn, noisy]).splitlines()
    r2 = next(line for line in lines if line.startswith("  r2:"))
    r3 = next(line for line in lines if line.startswith("  r3:"))
    assert r2 == "  r2: c=8 +95 % ± 4.5 % (significant)"  # Welch: se 1.63, df 4, t 2.776
    assert r3.startswith("  r3: c=8 no difference within noise (+2.0 % ±")


def test_a_run_is_mostly_failed_only_when_more_than_half_its_requests_failed():
    from workers.results.record import mostly_failed

    assert mostly_failed([{"num_requests": 4, "errors": 2}]) is None  # half: still a (poor) measurement
    assert mostly_failed([{"num_requests": 4, "errors": 0}, {"num_requests": 4, "errors": 4}]) is None
    assert mostly_failed([{"num_requests": 2, "errors": 2}]) == (
        "2 of 2 requests failed: the numbers describe errors, not the server"
    )
    assert mostly_failed([{"num_requests": 4, "errors": ["a", "b", "c"]}]) is not None
    assert mostly_failed([]) is None
