"""Check a soak's history (``bench/soak.py``): each promise a named property with its counter-examples.

The history is a list of records (one JSON object a line), each with ``src``: ``event`` (a job's own
event: queued, started with its fence, progress, ready, the ending), ``effect`` (a fenced actuator
operation from the host's effect journal: its job, fence, outcome, the worker's wall-clock span and the
host's fence-lock ``window``, on its wall clock and, as ``window_boot``, on its boot clock), ``sim`` (the
simulated host's ledger: ``engine_start`` with the fence file's token, ``engine_signal``, ``engine_exit``,
``request``), ``run`` (a stored run), ``reply`` (every answer a user got), ``status`` (a ``/status HOST``
answer with the live engines read just before and after it), ``fault`` (what the soak broke, and when),
``final`` (each host's live engines and launch record at the end) and ``durations`` (each job kind's mean
hold, what ``/queue``'s ETAs are made of). The ``clock`` records (else the ``soak`` header's ``boot_to_wall``)
map a host's boot clock onto the history's clock: a host whose wall clock was stepped reports its lock windows
wrongly on its wall clock and rightly on its boot clock, so the windows are read off the boot clock when the
history says how (:class:`BootToWall`).

Properties (:func:`check`): ``no_job_lost``, ``none_ran_twice``, ``effects_fenced``, ``effects_never_overlap``,
``fences_increase``, ``no_unowned_engine``, ``runs_measured_what_they_said``, ``status_told_the_truth``,
``times_are_true``. Every
counter-example names the job, the host and the fence. The checker is plain code over the records; tests
plant violations to show that it fails (``tests/test_history_check.py``).
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

TERMINAL = ("succeeded", "failed", "cancelled")
DONE = ("ok", "sent", "removed")  # outcomes of an action that changed the host (a refusal or "gone" did not)
#: A spawn's record before the actuator ran (``workers.host.effect_record.ASKED``): asked for, no answer yet.
ASKED = "asked"
#: Kinds of job that send requests to the engine (a stop sends none).
REQUESTING = ("launch", "bench", "eval", "sweep")
#: A request that reached a frozen engine is read when it thaws: this long after the thaw it is still the
#: sender's (the sender was alive when the engine froze).
THAW_GRACE_S = 2.0

Record = Mapping[str, object]


@dataclass
class Property:
    """One promise checked over the history: how many cases it covered, and each counter-example."""

    name: str
    checked: int = 0
    counter_examples: list[dict[str, object]] = field(default_factory=list)

    def fail(self, why: str, *, job: object = None, host: object = None, fence: object = None, **more: object) -> None:
        self.counter_examples.append({"job": job, "host": host, "fence": fence, "why": why, **more})

    @property
    def ok(self) -> bool:
        return not self.counter_examples

    def to_dict(self) -> dict[str, object]:
        examples = self.counter_examples[:20]
        return {"checked": self.checked, "violations": len(self.counter_examples), "examples": examples}


def _f(value: object) -> float:
    return float(value) if isinstance(value, int | float) else 0.0


@dataclass
class Job:
    id: str
    host: str = ""
    kind: str = ""
    queued: float | None = None
    started: list[tuple[float, int | None]] = field(default_factory=list)
    endings: list[tuple[str, float, Mapping[str, object]]] = field(default_factory=list)
    refenced: set[int] = field(default_factory=set)
    ready_pids: set[int] = field(default_factory=set)

    @property
    def fence(self) -> int | None:
        return self.started[0][1] if self.started else None

    @property
    def fences(self) -> set[int]:
        return {f for _, f in self.started if f is not None} | self.refenced

    @property
    def ended(self) -> float | None:
        return self.endings[0][1] if self.endings else None


class History:
    """The records, indexed once: jobs, effects and ledger facts per host."""

    def __init__(self, records: Iterable[Record]) -> None:
        self.records = list(records)
        self.jobs: dict[str, Job] = {}
        self.effects: dict[str, list[Record]] = defaultdict(list)
        self.sim: dict[str, list[Record]] = defaultdict(list)
        self.by_src: dict[str, list[Record]] = defaultdict(list)
        to_wall = BootToWall(self.records)
        for r in self.records:
            if r.get("src") == "effect" and to_wall and isinstance(r.get("window_boot"), list):
                r = {**r, "window": to_wall.window(r), "window_wall": r.get("window")}
            self.by_src[str(r.get("src"))].append(r)
            if r.get("src") == "event":
                self._event(r)
            elif r.get("src") == "effect":
                self.effects[str(r.get("host"))].append(r)
            elif r.get("src") == "sim":
                self.sim[str(r.get("host"))].append(r)
        for host in self.effects:
            self.effects[host].sort(key=lambda e: _window(e)[0])

    def job(self, job_id: object) -> Job:
        key = str(job_id)
        if key not in self.jobs:
            self.jobs[key] = Job(key)
        return self.jobs[key]

    def _event(self, r: Record) -> None:
        job = self.job(r.get("job"))
        data = r.get("data") if isinstance(r.get("data"), Mapping) else {}
        assert isinstance(data, Mapping)
        ts, kind = _f(r.get("ts")), r.get("type")
        if kind == "queued":
            job.queued, job.host, job.kind = ts, str(data.get("host") or ""), str(data.get("kind") or "")
        elif kind == "started":
            fence = data.get("fence")
            job.started.append((ts, fence if isinstance(fence, int) else None))
            job.host = job.host or str(data.get("host") or "")
        elif kind in TERMINAL:
            job.endings.append((str(kind), ts, data))
        elif kind == "progress" and "now holds fence" in str(data.get("message")):
            word = str(data.get("message")).rsplit("fence", 1)[-1].strip().split()[0]
            if word.isdigit():
                job.refenced.add(int(word))
        elif kind == "ready":
            config = data.get("config") if isinstance(data.get("config"), Mapping) else {}
            assert isinstance(config, Mapping)
            process = config.get("process") if isinstance(config.get("process"), Mapping) else {}
            assert isinstance(process, Mapping)
            if isinstance(process.get("pid"), int):
                job.ready_pids.add(int(process["pid"]))  # type: ignore[arg-type]

    def holder(self, host: str, t: float) -> Job | None:
        """The job that last started on ``host`` at or before ``t``."""
        best: tuple[float, Job] | None = None
        for job in self.jobs.values():
            if job.host != host:
                continue
            for ts, _ in job.started:
                if ts <= t and (best is None or ts > best[0]):
                    best = (ts, job)
        return best[1] if best else None


class BootToWall:
    """Maps a host's boot-clock lock window onto the history's (wall) clock, with the offset of its time.

    The offsets are the soak's ``clock`` records (each from ``boot`` on), else the header's one. The box's own
    clock can step mid-run (a VM paused and resumed): a window is mapped with the offset in force at its boot
    time, or, when it lies just past a step the 0.2 s sampling had not yet seen, the next one, whichever puts
    it inside the worker's own span of the operation."""

    SLACK_S = 0.25

    def __init__(self, records: Iterable[Record]) -> None:
        records = list(records)
        samples = [(_f(r.get("boot")), _f(r.get("boot_to_wall"))) for r in records if r.get("src") == "clock"]
        header = next((r for r in records if r.get("src") == "soak"), {})
        if not samples and isinstance(header.get("boot_to_wall"), int | float):
            samples = [(float("-inf"), _f(header["boot_to_wall"]))]
        self.samples = sorted(samples)

    def __bool__(self) -> bool:
        return bool(self.samples)

    def window(self, e: Record) -> list[float]:
        boot = e.get("window_boot")
        assert isinstance(boot, list) and self.samples
        taken, released = _f(boot[0]), _f(boot[1])
        i = max(0, bisect.bisect_right(self.samples, (taken, float("inf"))) - 1)
        began, ended = _f(e.get("began")), _f(e.get("ended"))
        for _, offset in self.samples[i : i + 2]:
            if began - self.SLACK_S <= taken + offset and released + offset <= ended + self.SLACK_S:
                return [taken + offset, released + offset]
        offset = self.samples[i][1]
        return [taken + offset, released + offset]


def _window(e: Record) -> tuple[float, float]:
    window = e.get("window")
    if isinstance(window, list) and len(window) == 2:
        return _f(window[0]), _f(window[1])
    return _f(e.get("began")), _f(e.get("ended"))


def _done(e: Record) -> bool:
    return e.get("op") != "claim" and str(e.get("outcome")) in DONE


# ---- the properties -----------------------------------------------------------------------------------


def no_job_lost(h: History) -> Property:
    """Every job accepted (a reply named it, or it was queued) ended exactly once, and said why."""
    p = Property("no_job_lost")
    accepted = {str(r["job"]) for r in h.by_src["reply"] if r.get("ok") and r.get("job")}
    for job_id in sorted(accepted | {j for j, job in h.jobs.items() if job.queued is not None}, key=_order):
        job = h.job(job_id)
        p.checked += 1
        if job.queued is None:
            p.fail("accepted (the reply named it) but never queued", job=job_id, host=job.host or None)
        if not job.endings:
            p.fail("never ended", job=job_id, host=job.host, fence=job.fence)
            continue
        if len(job.endings) > 1:
            p.fail(f"ended {len(job.endings)} times: {[e[0] for e in job.endings]}", job=job_id, host=job.host)
        kind, _, data = job.endings[0]
        if kind == "failed" and not str(data.get("message") or "").strip():
            p.fail("failed without a reason", job=job_id, host=job.host, fence=job.fence)
    return p


def none_ran_twice(h: History) -> Property:
    """No job started twice, and no job acted on its host under two fences (but a fence it was given again)."""
    p = Property("none_ran_twice")
    fences_used: dict[str, set[int]] = defaultdict(set)
    for effects in h.effects.values():
        for e in effects:
            if isinstance(e.get("fence"), int) and str(e.get("outcome")) in (*DONE, "gone"):
                fences_used[str(e.get("job"))].add(int(e["fence"]))  # type: ignore[arg-type]
    for job_id, job in h.jobs.items():
        p.checked += 1
        if len(job.started) > 1:
            p.fail(
                f"started {len(job.started)} times (fences {[f for _, f in job.started]})",
                job=job_id,
                host=job.host,
                fence=job.fence,
            )
        extra = fences_used.get(job_id, set()) - job.fences
        if extra:
            p.fail(f"acted under fences {sorted(extra)} besides its own", job=job_id, host=job.host, fence=job.fence)
    return p


def effects_fenced(h: History) -> Property:
    """Every spawn, signal and request on a host carried the fence of the lease held then: its own job's fence,
    while that job lived, no newer claim before it; every engine the host saw start was a fenced spawn; every
    request reached the host while a job that sends requests held it."""
    p = Property("effects_fenced")
    for host, effects in h.effects.items():
        claims = [(_window(e)[1], e.get("fence")) for e in effects if e.get("op") == "claim"]
        for e in effects:
            if not _done(e):
                continue
            p.checked += 1
            job, fence = h.job(e.get("job")), e.get("fence")
            what = f"{e.get('op')} {e.get('signal') or ''} pid {e.get('pid')}".replace("  ", " ")
            if not isinstance(fence, int):
                p.fail(f"unfenced {what}", job=job.id, host=host, fence=None)
                continue
            if fence not in job.fences:
                why = f"{what} under fence {fence}, not its job's {sorted(job.fences)}"
                p.fail(why, job=job.id, host=host, fence=fence)
            began, ended = _window(e)
            newer = [f for t, f in claims if isinstance(f, int) and f > fence and t <= began]
            if newer:
                why = f"stale {what}: fence {max(newer)} had claimed the host before"
                p.fail(why, job=job.id, host=host, fence=fence)
            if not job.started or began < job.started[0][0]:
                p.fail(f"{what} before its job started", job=job.id, host=host, fence=fence)
            if job.ended is not None and ended > job.ended:
                p.fail(f"{what} after its job ended", job=job.id, host=host, fence=fence)
    spawned = {(str(e.get("host")), e.get("pid")) for es in h.effects.values() for e in es if e.get("op") == "spawn"}
    unanswered = _unanswered_spawns(h)
    thaws = _thaws(h)
    for host, facts in h.sim.items():
        for fact in facts:
            if fact.get("ev") == "engine_start":
                p.checked += 1
                if (host, fact.get("pid")) not in spawned and not _asked_for(unanswered, host, fact):
                    holder = h.holder(host, _f(fact.get("ts")))
                    p.fail(
                        f"engine pid {fact.get('pid')} started with no fenced spawn",
                        job=holder.id if holder else None,
                        host=host,
                        fence=fact.get("fence"),
                    )
            elif fact.get("ev") == "request" and not fact.get("own"):
                p.checked += 1
                t = _f(fact.get("ts"))
                holder = h.holder(host, t)
                live = holder is not None and (holder.ended is None or holder.ended >= t)
                if live and holder is not None and holder.kind in REQUESTING:
                    continue
                if _thawed_late(thaws, fact, t, h, host):
                    continue
                p.fail(
                    f"{fact.get('method')} {fact.get('path')} reached engine {fact.get('pid')} while "
                    + ("no job held the host" if not live or holder is None else f"a {holder.kind} job held it"),
                    job=holder.id if holder else None,
                    host=host,
                    fence=holder.fence if holder else fact.get("fence"),
                )
    return p


def _unanswered_spawns(h: History) -> dict[str, list[tuple[object, float]]]:
    """Per host, the spawns a job asked for whose answer it never journaled (fence, when asked): its horse was
    killed while the actuator ran, or the answer named no process (the actuator timed out)."""
    out: dict[str, list[tuple[object, float]]] = defaultdict(list)
    for host, effects in h.effects.items():
        spawns = [e for e in effects if e.get("op") == "spawn"]
        answered = {(e.get("job"), _f(e.get("began"))) for e in spawns if isinstance(e.get("pid"), int)}
        for e in spawns:
            if e.get("outcome") != ASKED or (e.get("job"), _f(e.get("began"))) in answered:
                continue
            out[host].append((e.get("fence"), _f(e.get("began"))))
    return out


def _asked_for(unanswered: dict[str, list[tuple[object, float]]], host: str, fact: Record) -> bool:
    """The engine started under the fence of a spawn its job asked for before, and never heard the answer of."""
    fence, ts = fact.get("fence"), _f(fact.get("ts"))
    return isinstance(fence, int) and any(f == fence and began <= ts for f, began in unanswered.get(host, []))


def _thaws(h: History) -> dict[int, list[tuple[float, float]]]:
    """Per frozen engine pid, its (frozen at, thawed at) spans, from the faults."""
    out: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for f in h.by_src["fault"]:
        if f.get("kind") == "engine_freeze" and isinstance(f.get("pid"), int):
            out[int(f["pid"])].append((_f(f.get("ts")), _f(f.get("ts")) + _f(f.get("seconds"))))  # type: ignore[arg-type]
    return out


def _thawed_late(thaws: Mapping[int, list[tuple[float, float]]], fact: Record, t: float, h: History, host: str) -> bool:
    """A request an engine read after a freeze: fine when a requesting job held the host when it froze."""
    for frozen, thawed in thaws.get(fact.get("pid"), []):  # type: ignore[call-overload]
        if frozen <= t <= thawed + THAW_GRACE_S:
            sender = h.holder(host, frozen)
            if sender is not None and sender.kind in REQUESTING and (sender.ended is None or sender.ended >= frozen):
                return True
    return False


def effects_never_overlap(h: History) -> Property:
    """Per host, no two actions' fence-lock windows overlap, and jobs never interleave: once another job acted,
    an earlier one never acts again."""
    p = Property("effects_never_overlap")
    for host, effects in h.effects.items():
        acted = [e for e in effects if _done(e) or (e.get("op") == "claim" and e.get("outcome") == "ok")]
        seen: list[str] = []
        for a, b in itertools.pairwise(acted):
            p.checked += 1
            if _window(a)[1] > _window(b)[0]:
                p.fail(
                    f"{a.get('op')} of job {a.get('job')} (fence {a.get('fence')}) overlaps {b.get('op')} of "
                    f"job {b.get('job')} (fence {b.get('fence')})",
                    job=b.get("job"),
                    host=host,
                    fence=b.get("fence"),
                    other_job=a.get("job"),
                )
        for e in acted:
            job = str(e.get("job"))
            if seen and seen[-1] != job and job in seen:
                p.fail(
                    f"{e.get('op')} of job {job} after job {seen[-1]} had acted on the host",
                    job=job,
                    host=host,
                    fence=e.get("fence"),
                    other_job=seen[-1],
                )
            if not seen or seen[-1] != job:
                seen.append(job)
    return p


def fences_increase(h: History) -> Property:
    """Per host, the fences of the jobs that started, and of the claims on the host, strictly increase in time."""
    p = Property("fences_increase")
    starts: dict[str, list[tuple[float, int, str]]] = defaultdict(list)
    for job in h.jobs.values():
        for ts, fence in job.started:
            if fence is not None:
                starts[job.host].append((ts, fence, job.id))
    for host, effects in h.effects.items():
        claims = [
            (_window(e)[0], int(e["fence"]), str(e.get("job")))
            for e in effects  # type: ignore[arg-type]
            if e.get("op") == "claim" and e.get("outcome") == "ok" and isinstance(e.get("fence"), int)
        ]
        for what, seq in (("started", sorted(starts.get(host, []))), ("claimed", claims)):
            for (_, f1, j1), (_, f2, j2) in itertools.pairwise(seq):
                p.checked += 1
                if f2 <= f1 and not (what == "claimed" and j1 == j2):
                    p.fail(f"job {j2} {what} under fence {f2} after job {j1} under {f1}", job=j2, host=host, fence=f2)
    return p


def no_unowned_engine(h: History) -> Property:
    """At the end every live engine is the one its host's launch record names, started by a job that made it ready."""
    p = Property("no_unowned_engine")
    for final in h.by_src["final"]:
        host = str(final.get("host"))
        record = final.get("launched") if isinstance(final.get("launched"), Mapping) else None
        engines = final.get("engines") if isinstance(final.get("engines"), list) else []
        assert isinstance(engines, list)
        for pid in engines:
            p.checked += 1
            owner = h.jobs.get(str(record.get("job"))) if record else None
            if record is None or record.get("pid") != pid or owner is None:
                p.fail(f"engine {pid} runs and no job owns it", job=None, host=host, fence=None)
            elif pid not in owner.ready_pids:
                p.fail(f"engine {pid} runs; its job never made it ready", job=owner.id, host=host, fence=owner.fence)
        if len(engines) > 1:
            p.fail(f"{len(engines)} engines run on one port: {engines}", host=host)
    return p


def runs_measured_what_they_said(h: History) -> Property:
    """Every stored run measured the server it names: each request its job sent on its host reached that pid."""
    p = Property("runs_measured_what_they_said")
    for run in h.by_src["run"]:
        job = h.jobs.get(str(run.get("job_id")))
        config = run.get("config") if isinstance(run.get("config"), Mapping) else {}
        assert isinstance(config, Mapping)
        process = config.get("process") if isinstance(config.get("process"), Mapping) else {}
        assert isinstance(process, Mapping)
        pid, host = process.get("pid"), str(run.get("host"))
        p.checked += 1
        if job is None or not job.started:
            p.fail(f"run {run.get('id')} was stored by no job that ran", job=run.get("job_id"), host=host)
            continue
        t0, t1 = job.started[0][0], job.ended or float("inf")
        hit = {f.get("pid") for f in h.sim.get(host, []) if f.get("ev") == "request" and t0 <= _f(f.get("ts")) <= t1}
        if job.kind in ("bench", "eval") and hit and hit != {pid}:
            p.fail(
                f"run {run.get('id')} names engine {pid}; its job's requests reached {sorted(map(str, hit))}",
                job=job.id,
                host=host,
                fence=job.fence,
            )
        if not run.get("valid", True) and not run.get("invalid_reason"):
            p.fail(f"run {run.get('id')} is invalid and says no reason", job=job.id, host=host, fence=job.fence)
    return p


def status_told_the_truth(h: History) -> Property:
    """Each ``/status HOST`` answer: a fresh one named an engine that ran during the call (or none, when no
    engine ran throughout it); an old one said how old it was."""
    p = Property("status_told_the_truth")
    for s in h.by_src["status"]:
        view = s.get("view") if isinstance(s.get("view"), Mapping) else None
        host = str(s.get("host"))
        p.checked += 1
        if view is None:
            p.fail("no answer for the host", host=host, text=s.get("text"))
            continue
        fresh = view.get("fresh") if isinstance(view.get("fresh"), Mapping) else None
        if fresh is None:
            if view.get("last") is not None and view.get("age_s") is None:
                p.fail("an old observation shown without its age", host=host, text=s.get("text"))
            continue
        process = fresh.get("process") if isinstance(fresh.get("process"), Mapping) else None
        pid = process.get("pid") if process else None
        before = s.get("truth_before") if isinstance(s.get("truth_before"), list) else []
        after = s.get("truth_after") if isinstance(s.get("truth_after"), list) else []
        assert isinstance(before, list) and isinstance(after, list)
        if pid is None:
            # Only an engine alive both before and after the call ran throughout it. Two different ones
            # (the old engine exiting, a job's new one spawned) leave a moment with none between them, and
            # the observation may have looked then (docs/reliability.md section 8).
            throughout = sorted(set(before) & set(after))
            extra = fresh.get("extra") if isinstance(fresh.get("extra"), Mapping) else {}
            unread = isinstance(extra, Mapping) and extra.get("process_table_unread")  # observation.UNREAD_TABLE
            if throughout and not unread:  # an answer that said it could not look claimed nothing
                p.fail(f"said nothing runs while engine {throughout} ran", host=host, text=s.get("text"))
        elif pid not in before and pid not in after:
            p.fail(f"named engine {pid}; the host ran {before or 'nothing'} then {after or 'nothing'}", host=host)
    return p


def times_are_true(h: History) -> Property:
    """Times taken on the workers' clock stay true whatever a host's clock did: every stored run's ``created_at``
    lies within its job's life, and each kind's mean hold (the basis of ``/queue``'s ETAs) lies between 0 and
    the longest life of a job of that kind."""
    p = Property("times_are_true")
    slack = 1.0  # the job's own events and the run's stamp are separate writes, a little apart
    for run in h.by_src["run"]:
        job = h.jobs.get(str(run.get("job_id")))
        if job is None or not job.started:
            continue  # runs_measured_what_they_said names it
        t, t0, t1 = _f(run.get("created_at")), job.started[0][0], job.ended or float("inf")
        p.checked += 1
        if not t0 - slack <= t <= t1 + slack:
            p.fail(
                f"run {run.get('id')} is stamped {t:.3f}, outside its job's life {t0:.3f}..{t1:.3f}",
                job=job.id,
                host=job.host,
                fence=job.fence,
            )
    longest: dict[str, float] = defaultdict(float)
    for job in h.jobs.values():
        if job.started and job.ended is not None:
            longest[job.kind] = max(longest[job.kind], job.ended - job.started[0][0])
    for record in h.by_src["durations"]:
        means = record.get("mean_held_s") if isinstance(record.get("mean_held_s"), Mapping) else {}
        assert isinstance(means, Mapping)
        for kind, mean in means.items():
            p.checked += 1
            if kind in longest and not 0.0 <= _f(mean) <= longest[kind] + slack:
                p.fail(
                    f"{kind} jobs held their host {_f(mean):.1f} s on average; the longest lived {longest[kind]:.1f} s"
                )
    return p


PROPERTIES = (
    no_job_lost,
    none_ran_twice,
    effects_fenced,
    effects_never_overlap,
    fences_increase,
    no_unowned_engine,
    runs_measured_what_they_said,
    status_told_the_truth,
    times_are_true,
)


def _order(job_id: str) -> tuple[int, str]:
    return (int(job_id), "") if job_id.isdigit() else (0, job_id)


def check(records: Iterable[Record]) -> list[Property]:
    """Every property over the history, in :data:`PROPERTIES` order."""
    history = History(records)
    return [prop(history) for prop in PROPERTIES]
