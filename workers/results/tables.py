"""Run history as text tables: ``/runs``, ``/compare`` and the per-level table of one bench."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

from workers.benchmark import stats
from workers.engines import registry
from workers.gang import fingerprints as gang_fingerprints
from workers.results import level_notes
from workers.results.record import RunRecord, error_count, level_key, load_label, metric, sub, whole
from workers.results.summary_diff import config_lines
from workers.telemetry import fingerprint
from workers.telemetry.summary import format_bytes, header_words


def _short_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M")


def _fmt_num(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _fmt_ms(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 1000:
        return f"{value / 1000:.2f}s"
    if value >= 100:
        return f"{value:.0f}ms"
    return f"{value:.1f}ms"


def _align(rows: list[list[str]], right: set[int]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        pairs = enumerate(zip(row, widths, strict=True))
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in pairs]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _state(record: RunRecord) -> str:
    if record.status == "failed":
        cat = record.failure_category
        return f"FAILED ({cat})" if cat else "FAILED"
    return "ok" if record.valid else "INVALID"


def format_runs_table(records: Iterable[RunRecord], note_counts: Mapping[str, int] | None = None) -> str:
    """The ``/runs`` table: id, when (UTC), user, host, label, best tok/s, accuracy, state and tags, and
    how many notes the team left in each run's thread (the column only when any run has one)."""
    records = list(records)
    if not records:
        return "no runs yet"
    counts = {k: v for k, v in (note_counts or {}).items() if v}
    rows = [["id", "when (UTC)", "user", "host", "label", "best tok/s", "accuracy", "state / tags"]]
    if counts:
        rows[0].append("notes")
    for r in records:
        label = r.label or r.config_summary or "-"
        if len(label) > 40:
            label = label[:39] + "…"
        state = _state(r)
        if r.tags:
            state += " " + ",".join(r.tags)
        best = _fmt_num(r.best_output_tok_s)
        evaluated = r.accuracy
        acc = evaluated.short.removeprefix("acc ") if evaluated is not None else "-"
        rows.append([r.id, _short_time(r.created_at), r.user, r.host, label, best, acc, state])
        if counts:
            rows[-1].append(str(counts.get(r.id, "")))
    return _align(rows, right={5, 6})


def _pct(value: float | None, ref: float | None) -> str:
    if value is None or ref is None or ref == 0:
        return ""
    return f"{(value - ref) / ref * 100:+.1f}%"


def compare_table(records: Iterable[RunRecord]) -> str:
    """The ``/compare`` table: one row per concurrency, per run output tok/s, TTFT p50 and ITL p50.

    Runs other than the first show the % change of tok/s vs the first run; invalid and failed runs
    are marked with ``*`` and explained in the legend above the table, which also carries each run's
    accuracy when it has an eval (``acc 94.7 % DROP``: the rows are loads, accuracy belongs to the run).
    """
    records = list(records)
    if not records:
        return "nothing to compare"
    legend = []
    # Runs of different engines side by side (SGLang beside vLLM): each version says whose it is.
    mixed = len({r.engine for r in records if r.engine}) > 1
    for r in records:
        bits = [r.host]
        if r.engine_version:
            name = registry.display_name(r.engine) if mixed and r.engine else ""
            bits.append(f"{name} {r.engine_version}".strip())
        if r.fingerprint:
            bits.append(f"fp {r.fingerprint[:8]}")
        note = ""
        if r.status == "failed":
            note = f"  * FAILED{': ' + r.failure_category if r.failure_category else ''}"
        elif not r.valid:
            note = f"  * INVALID{': ' + r.invalid_reason if r.invalid_reason else ''}"
        evaluated = r.accuracy
        acc = f"  {evaluated.short}" if evaluated is not None else ""
        legend.append(f"{r.id}  {r.label or r.config_summary or '-'}  ({', '.join(bits)}){acc}{note}")
    open_loop = any(r.open_loop for r in records)
    loads = sorted({x for r in records for x in r.loads})
    mark = {r.id: ("*" if r.status == "failed" or not r.valid else "") for r in records}
    header = ["rate" if open_loop else "conc"]
    sampled = any(lv.get("telemetry") for r in records for lv in r.levels)
    for r in records:
        header += [f"{r.id}{mark[r.id]} tok/s", "ttft p50", "itl p50", *(["J/tok", "PCIe/tok"] if sampled else [])]
    rows = [header]
    first = records[0]
    for load in loads:
        row = [load_label(load, open_loop)]
        ref = metric(first.level(load), "output_tok_s")
        for i, r in enumerate(records):
            level = r.level(load)
            tok = metric(level, "output_tok_s")
            cell = _fmt_num(tok)
            if i > 0 and (pct := _pct(tok, ref)):
                cell += f" ({pct})"
            row += [cell, _fmt_ms(metric(level, "ttft_ms", "p50")), _fmt_ms(metric(level, "itl_ms", "p50"))]
            if sampled:
                row += _telemetry_cells(level or {})
        rows.append(row)
    if len(rows) == 1:
        rows.append(["-"] + ["-"] * (len(header) - 1))
    table = _align(rows, right=set(range(len(header))))
    verdicts = verdict_lines(records)
    verdicts += config_lines([(r.id, r.config_summary, r.engine) for r in records])
    verdicts += fingerprint.compare_lines([(r.id, r.extra.get(fingerprint.EXTRA_KEY), r.engine) for r in records])
    verdicts += gang_fingerprints.compare_lines([(r.id, r.host, r.extra) for r in records])  # a gang's members
    return "\n".join(legend) + "\n\n" + table + ("\n\n" + "\n".join(verdicts) if verdicts else "")


def verdict_lines(records: list[RunRecord], metric_path: str = "output_tok_s") -> list[str]:
    """Per run after the first and per level: is its output tok/s really different from the first's?

    Uses every repeat a level stored (``repeat=N``); with one run a side the change is shown without
    a claim. Failed and invalid runs are left out: there is nothing honest to test.
    """
    usable = [r for r in records if r.status != "failed" and r.valid and r.levels]
    if len(usable) < 2:
        return []
    base = usable[0]
    what = {"output_tok_s": "output tok/s"}.get(metric_path, metric_path)
    lines = [f"verdict ({what} vs {base.id}, {stats.TEST_NAME}):"]
    open_loop = any(r.open_loop for r in usable)
    for other in usable[1:]:
        cells = []
        for load in sorted(set(base.loads) | set(other.loads)):
            a, b = base.level(load), other.level(load)
            v = stats.verdict(
                [stats.metric_value(x, metric_path) for x in (stats.runs_of(a) if a else [])],
                [stats.metric_value(x, metric_path) for x in (stats.runs_of(b) if b else [])],
                metric=metric_path,
                level=load,
            )
            name = f"rate={load_label(load, True)}" if open_loop else f"c={load_label(load, False)}"
            cells.append((name, v))
        # "1 run each: no confidence interval..." once for the line, not once per level (issue 36 item 5)
        notes = {stats.runs_note(v) for _, v in cells if v.kind == "single_run"}
        once = len(notes) == 1 and sum(v.kind == "single_run" for _, v in cells) > 1
        text = "; ".join(f"{name} {stats.render_verdict(v, runs_said=once)}" for name, v in cells)
        lines.append(f"  {other.id}: {text}" + (f" ({notes.pop()})" if once else ""))
    return lines


def _estimate_cell(level: Mapping[str, object], path: str) -> str:
    est = sub(sub(level.get("estimates")).get(path))
    mean = metric(est, "mean")
    if mean is None:
        return "-"
    e = stats.Estimate(whole(est["n"]), mean, metric(est, "sd"), metric(est, "half_width"))
    return stats.render_estimate(e)


def format_levels_table(record: RunRecord) -> str:
    """The bench table of one run: a row per concurrency level, the figures a serving engineer reports."""
    open_loop = record.open_loop
    repeated = any(level.get("estimates") for level in record.levels)
    sampled = any(level.get("telemetry") for level in record.levels)
    viewed = any(level.get("server_view") for level in record.levels)  # the server's own latency histograms
    rows = [
        [
            "rate" if open_loop else "conc",
            "ok/err",
            "out tok/s",
            "tok/s/user",
            "TTFT p50",
            "TTFT p99",
            "ITL p50",
            "ITL p99",
            "TPOT p50",
            "accept",
            *(["peak", "lag p99"] if open_loop else []),
            *(["tok/s mean ± 95%"] if repeated else []),
            *(["J/tok", "PCIe/tok"] if sampled else []),
            *(["TTFT mean client/server", "E2E mean client/server"] if viewed else []),
        ]
    ]
    notes: list[str] = []
    named: list[tuple[str, Mapping[str, object]]] = []
    for level in sorted(record.levels, key=level_key):
        conc = level.get("concurrency")
        name = load_label(level_key(level), open_loop)
        accept = metric(level, "spec_accept_length")
        lag = sub(sub(level.get("arrivals")).get("lag"))
        rows.append(
            [
                name,
                f"{level.get('completed', 0)}/{error_count(level)}",
                _fmt_num(metric(level, "output_tok_s")),
                _fmt_num(metric(level, "per_user_tok_s"))
                + (level_notes.ABOVE_AGGREGATE if level_notes.above_aggregate(level) else ""),
                _fmt_ms(metric(level, "ttft_ms", "p50")),
                _fmt_ms(metric(level, "ttft_ms", "p99")),
                _fmt_ms(metric(level, "itl_ms", "p50")),
                _fmt_ms(metric(level, "itl_ms", "p99")),
                _fmt_ms(metric(level, "tpot_ms", "p50")),
                f"{accept:.2f}" if accept else "-",
                *([str(conc), _fmt_ms(metric(lag, "p99_ms"))] if open_loop else []),
                *([_estimate_cell(level, "output_tok_s")] if repeated else []),
                *(_telemetry_cells(level) if sampled else []),
                *(level_notes.server_cells(level, _fmt_ms) if viewed else []),
            ]
        )
        where = f"rate={name}" if open_loop else f"c={conc}"
        named.append((where, level))
        bound = sub(level.get("telemetry")).get("bound")
        if isinstance(bound, list) and bound:
            notes.append(
                f"{where}: {' and '.join(map(str, bound))}-bound inside the server (queue depth / KV-cache usage)"
            )
        client = sub(level.get("client"))
        if client.get("bottleneck"):  # its own work; lag from cores it shares is said once (level_notes)
            notes.append(
                f"{where}: the CLIENT was the bottleneck ({client.get('reason')}); treat its figures as a lower bound"
            )
        if disturbed := sub(sub(level.get("telemetry")).get("sampler")).get("disturbed"):
            notes.append(f"{where}: {disturbed}")
        if lag.get("behind"):
            notes.append(f"{where}: BEHIND SCHEDULE ({lag.get('reason')}); the server did not see the asked rate")
        cut = sub(level.get("cut"))
        if cut:
            by = ", ".join(f"{n} by {k}" for k, n in sorted(cut.items()))
            cut_total = sum(whole(n) for n in cut.values())
            notes.append(
                f"{where}: {cut_total} request(s) CUT OFF by response limits ({by}): the server sent "
                "without end, flooded its head or went silent"
            )
    notes += level_notes.level_notes(named)
    table = _align(rows, right=set(range(len(rows[0]))))
    name = registry.display_name(record.engine)  # an old record without an engine was the default engine's
    engine = f" ({name} {record.engine_version})" if record.engine_version else ""
    header = f"{record.id} on {record.host}{engine}: {record.label or record.config_summary}"
    run_telemetry = sub(record.extra.get("telemetry"))
    if words := header_words({key: metric(run_telemetry, key) for key in ("j_per_tok", "pcie_bytes_per_tok")}):
        header += f"  ({words})"
    if not record.valid:
        header += f"  INVALID: {record.invalid_reason}"
    missing = run_telemetry.get("missing")
    if isinstance(missing, list) and missing:
        notes.append("telemetry missing: " + "; ".join(map(str, missing)))
    if members := gang_telemetry_hosts(record):
        notes.append(f"power, PCIe and J/tok summed over the gang's members: {', '.join(members)}")
    if host := fingerprint.HostFingerprint.from_dict(record.extra.get(fingerprint.EXTRA_KEY)):
        notes.append(f"host: {host.summary}" + (f" (not learnt: {'; '.join(host.missing)})" if host.missing else ""))
    return "\n".join([header, table, *notes])


def gang_telemetry_hosts(record: RunRecord) -> list[str]:
    """The hosts a gang's levels were sampled on, by rank (``telemetry.members``, workers/gang/telemetry.py)."""
    for level in record.levels:
        members = sub(level.get("telemetry")).get("members")
        if isinstance(members, list) and members:
            return [str(sub(m).get("host")) for m in members]
    return []


def _telemetry_cells(level: Mapping[str, object]) -> list[str]:
    """``J/tok`` and ``PCIe/tok`` of a sampled level, ``-`` where telemetry was missing."""
    tel = sub(level.get("telemetry"))
    j, pcie = metric(tel, "j_per_tok"), metric(tel, "pcie_bytes_per_tok")
    return [f"{j:.3f}" if j is not None else "-", format_bytes(pcie) if pcie is not None else "-"]
