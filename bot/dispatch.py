"""Request -> access check -> enqueue a job, or answer at once from Redis.

Every front end (Slack, console, ``say``) calls :class:`Dispatcher`; only the transport to the
person differs. Handlers are found by name: ``handle_<command>`` for each entry of the grammar
table in ``bot/commands/``. A refusal changes nothing and comes back as ``Reply(ok=False)``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import redis

from bot import group_status, render
from bot.commands import (
    COMMANDS,
    BenchRequest,
    CancelRequest,
    CompareRequest,
    EngineConfigWords,
    EvalRequest,
    HelpRequest,
    LaunchRequest,
    ParseError,
    QueueRequest,
    Request,
    RunsRequest,
    StatusRequest,
    StopRequest,
    SweepRequest,
    TuneRequest,
    help_text,
    parse_command,
)
from bot.replies import Reply, refused
from bot.tune_lines import tune_lines, with_tunes
from workers import observer
from workers.benchmark.spec import BenchSpec
from workers.config import Config, FlagValue
from workers.errors import BenchbotError
from workers.gang.hosts import launch_host, queue_host
from workers.jobs import eta, presence, queue, queue_view
from workers.jobs.events import JobState
from workers.jobs.payloads import (
    BenchPayload,
    EvalPayload,
    Expectation,
    JobKind,
    JobPayload,
    LaunchPayload,
    StopPayload,
    SweepPayload,
    TunePayload,
    parse_payload,
)
from workers.observation import UNREAD_TABLE, ObservedState
from workers.presets import LaunchIntent, LaunchSpec, build_launch, check_raw_flag
from workers.results import notes, store, tables

DEFAULT_BUTTON_LEVELS = (1, 8, 32)


class Dispatcher:
    """The one entry point from a person's command to benchbot's answer."""

    def __init__(
        self,
        config: Config,
        redis_client: redis.Redis,
        *,
        plots_dir: Path | None = None,
        observe_timeout_s: float = 5.0,
    ) -> None:
        self.config = config
        self.redis = redis_client
        self.plots_dir = plots_dir or Path("plots")
        self.observe_timeout_s = observe_timeout_s

    # ------------------------------------------------------------------ entry points

    def handle(self, user: str, channel: str, line: str) -> Reply:
        """A whole line such as ``/launch nextn cudnn`` (console, ``say``)."""
        name, _, rest = line.strip().partition(" ")
        return self.handle_command(user, channel, name or "/help", rest)

    def handle_command(self, user: str, channel: str, command: str, text: str) -> Reply:
        """A slash command as Slack delivers it: the name and the text separately."""
        request = parse_command(command, text, self.config)
        if isinstance(request, ParseError):
            return refused(request.message)
        return self.dispatch(user, channel, request)

    def dispatch(self, user: str, channel: str, request: Request) -> Reply:
        """Run the access check, then the command's handler."""
        spec = COMMANDS[request.command]
        denial = self.access_denial(user, channel, spec.action)
        if not denial and isinstance(request, RunsRequest) and request.tag_run:  # [access.commands] tag = [...]
            denial = self.access_denial(user, channel, "tag")
        if denial and isinstance(request, CancelRequest) and self._cancels_own_job(user, channel, request.job_id):
            denial = None
        if denial:
            return refused(denial, kind="denied")
        handler = getattr(self, f"handle_{request.command}")
        try:
            return handler(user, channel, request)
        except BenchbotError as exc:
            return refused(str(exc))

    def handle_action(self, user: str, channel: str, action_id: str, value: str) -> Reply:
        """A button press: cancel_job, bench_this, rerun_job, compare_baseline."""
        actions = {
            "cancel_job": lambda: self.dispatch(user, channel, CancelRequest(job_id=value)),
            "bench_this": lambda: self._bench_this(user, channel, value),
            "rerun_job": lambda: self._rerun(user, channel, value),
            "compare_baseline": lambda: self._compare_baseline(user, channel, value),
        }
        if action_id not in actions:
            return refused(f"unknown button {action_id!r}")
        try:
            return actions[action_id]()
        except BenchbotError as exc:
            return refused(str(exc))

    # ------------------------------------------------------------------ access

    def access_denial(self, user: str, channel: str, action: str) -> str | None:
        """Why ``user`` may not do ``action`` in ``channel``, or None when allowed."""
        access = self.config.access
        if access.is_admin(user):
            return None
        if access.users and user not in access.users:
            return f"sorry, {user} is not on this benchbot's access list; ask an admin to add you"
        if access.channels and channel not in access.channels:
            return "benchbot does not take commands in this channel; use one of the team's channels"
        allowed = access.commands.get(action)
        if allowed is not None and user not in allowed:
            return f"sorry, only {', '.join(allowed) or 'admins'} may {action} on this benchbot"
        return None

    def _cancels_own_job(self, user: str, channel: str, job_id: str) -> bool:
        """A person taken off the access list may still cancel their own jobs (in a channel benchbot
        serves): it only takes work away, and otherwise nobody but an admin could stop what they queued."""
        channels = self.config.access.channels
        if channels and channel not in channels:
            return False
        try:
            info = queue.job_info(self.redis, job_id)
        except BenchbotError:
            return False
        return info is not None and info.user == user

    # ------------------------------------------------------------------ immediate answers

    def handle_help(self, user: str, channel: str, request: HelpRequest) -> Reply:
        """The command list, or one command in detail."""
        return Reply(ok=True, kind="help", text=help_text(request.topic, self.config))

    def handle_status(self, user: str, channel: str, request: StatusRequest) -> Reply:
        """Every host from Redis at once: fresh observations asked for in parallel with a short deadline
        (``limits.status_deadline_s``), the stored ones (kept fresh by each observer's timer) with their
        age otherwise, an observation past ``limits.observation_stale_s`` shown as stale, and for a host
        that could not be refreshed, why (no worker, or the error it met reaching the host)."""
        hosts = list(self.config.hosts_named(request.host)) if request.host else list(self.config.hosts)
        limits = self.config.limits
        deadline = time.monotonic() + limits.status_deadline_s
        asked = observer.ask_observations(self.redis, hosts)
        # While the observers look, read everything else /status shows: the deadline is the whole answer's.
        stored = observer.last_observations(self.redis, hosts)
        listing = queue_view.list_jobs_many(self.redis, hosts)
        services = presence.host_services(self.redis, hosts)
        held = group_status.holders(self.redis, [h for h in hosts if self.config.groups_of(h)])
        tunes = tune_lines(self.redis, listing)
        observed = asked.collect(deadline)
        views = []
        for host in hosts:
            fresh = observed[host]
            last = stored.get(host) if fresh is None else None  # the stored one only stands in for a fresh one
            running = next((j for j in listing[host] if j.state == JobState.RUNNING), None)
            # The port the worker observed (its config decides); the bot's own config only when none answered.
            seen = fresh or last
            views.append(
                render.HostStatus(
                    host=host,
                    port=seen.port if seen is not None else self.config.host(host).port,
                    fresh=fresh,
                    last=last,
                    running_job=running,
                    service=services[host],
                    stale_after_s=limits.observation_stale_s,
                    group_line=group_status.member_line(self.config, host, held.get(host)),
                )
            )
        text = render.status_text(views)
        if request.host is not None and request.host in self.config.groups:
            text = group_status.group_header(self.config, request.host, held) + "\n\n" + text
        data = {"hosts": [v.to_dict() for v in views], "tunes": tunes}
        return Reply(ok=True, kind="status", text=with_tunes(text, tunes), data=data)

    def handle_queue(self, user: str, channel: str, request: QueueRequest) -> Reply:
        """Running and queued jobs per host."""
        hosts = list(self.config.hosts_named(request.host)) if request.host else list(self.config.hosts)
        listing = queue_view.list_jobs_many(self.redis, hosts)  # two pipelines for the whole fleet
        services = presence.host_services(self.redis, hosts)
        data = {
            "hosts": {host: [j.to_dict() for j in jobs] for host, jobs in listing.items()},
            "services": {host: service.to_dict() for host, service in services.items()},
        }
        etas = eta.waits_s(self.redis, listing)
        data["eta_s"] = etas
        data["tunes"] = tunes = tune_lines(self.redis, listing)
        text = with_tunes(render.queue_text(listing, services, etas), tunes)
        return Reply(ok=True, kind="queue", text=text, data=data)

    def handle_cancel(self, user: str, channel: str, request: CancelRequest) -> Reply:
        """Cancel a queued job or stop a running one (owner or admin); a tune ends after its current trial."""
        from bot.tune_commands import cancel_tune

        if (tuned := cancel_tune(self, user, request.job_id)) is not None:
            return tuned
        message = queue.cancel(self.redis, request.job_id, by=user, is_admin=self.config.access.is_admin(user))
        return Reply(ok=True, kind="cancel", text=message, job_id=request.job_id)

    def handle_runs(self, user: str, channel: str, request: RunsRequest) -> Reply:
        """List recent runs, or tag one."""
        if request.tag_run:
            return self._tag(user, request.tag_run, request.tag or "")
        records = store.list_runs(self.redis, n=request.limit, filter=request.filter)
        if not records:
            text = "no runs yet" + (f" matching {request.filter!r}" if request.filter else "")
            return Reply(ok=True, kind="runs", text=text, data={"runs": []})
        counts = notes.note_counts(self.redis, [r.id for r in records])
        return Reply(
            ok=True,
            kind="runs",
            text=tables.format_runs_table(records, counts),
            data={"runs": [{**r.to_dict(), "notes": counts[r.id]} for r in records]},
        )

    def _tag(self, user: str, run_id: str, tag: str) -> Reply:
        """Tag a run; a baseline tag says what it replaces and, for an admin, which flags it overrides."""
        is_baseline = tag.strip().lower() == store.BASELINE_TAG
        host = store.get_run(self.redis, run_id).host if is_baseline else ""
        previous = store.baseline_for(self.redis, host) if is_baseline else None
        record = store.tag_run(self.redis, run_id, tag, by=user, admin=self.config.access.is_admin(user))
        text = f"{record.id} is now tagged {tag}"
        if is_baseline:
            text += f": the baseline of {record.host} from now on"
            if previous is not None and previous.id != record.id:
                text += f", replacing {previous.id}"
            overrides = store.tag_info(self.redis, record.id).get(store.BASELINE_TAG, {}).get("overrides") or []
            if overrides:
                text += f". An admin override of its flags: {'; '.join(overrides)}"
        return Reply(ok=True, kind="tagged", text=text, data={"run": record.to_dict()})

    def handle_compare(self, user: str, channel: str, request: CompareRequest) -> Reply:
        """One table and plot across runs, drawn here from stored results (no worker needed)."""
        from bot import plots  # matplotlib is imported only when a plot is drawn

        records = [store.get_run(self.redis, run_id) for run_id in request.run_ids]
        paths = plots.plot_compare(records, self.plots_dir)
        return Reply(
            ok=True,
            kind="compare",
            text=tables.compare_table(records),
            ephemeral=False,
            data={"runs": list(request.run_ids), "plots": [str(p) for p in paths]},
            files=tuple(str(p) for p in paths),
        )

    # ------------------------------------------------------------------ jobs

    def handle_launch(self, user: str, channel: str, request: LaunchRequest) -> Reply:
        """Queue a launch (and its bench, under the same lease)."""
        spec = self._launch_spec(user, request.host, request.config)
        # intent only: the worker compiles the argv
        payload = LaunchPayload(
            request.host, user, channel, launch=spec.intent, bench=request.then_bench, eval=request.then_eval
        )
        summary = f"launch {spec.label}"
        if request.then_bench:
            summary += f" then bench {request.then_bench.label}"
        if request.then_eval:
            summary += f" then eval {request.then_eval.label}"
        return self._enqueue(payload, summary)

    def handle_bench(self, user: str, channel: str, request: BenchRequest) -> Reply:
        """Queue a bench stamped with the config the requester means."""
        group_status.refuse_gang_member(self.redis, self.config, request.host, "bench")
        expect = None if request.any_config else self._expected_config(user, request.host)
        payload = BenchPayload(
            request.host, user, channel, bench=request.spec, any_config=request.any_config, expect=expect
        )
        summary = f"bench {request.spec.label}" + (" (any config)" if request.any_config else "")
        return self._enqueue(payload, summary)

    def handle_eval(self, user: str, channel: str, request: EvalRequest) -> Reply:
        """Queue an accuracy check stamped with the config the requester means (as a bench is)."""
        group_status.refuse_gang_member(self.redis, self.config, request.host, "eval")
        expect = None if request.any_config else self._expected_config(user, request.host)
        payload = EvalPayload(
            request.host, user, channel, eval=request.spec, any_config=request.any_config, expect=expect
        )
        summary = f"eval {request.spec.label}" + (" (any config)" if request.any_config else "")
        return self._enqueue(payload, summary)

    def handle_stop(self, user: str, channel: str, request: StopRequest) -> Reply:
        """Queue a stop of whatever owns the engine port; ``force`` only from an admin."""
        if request.force and not self.config.access.is_admin(user):
            return refused(
                f"only an admin may /stop {request.host} force (stop a process benchbot did not start and could "
                "not show to be an engine); /stop without force stops what it can show",
                kind="denied",
            )
        summary = "stop the engine" + (" (force, by an admin)" if request.force else "")
        return self._enqueue(StopPayload(request.host, user, channel, force=request.force), summary)

    def handle_sweep(self, user: str, channel: str, request: SweepRequest) -> Reply:
        """Queue a sweep: launch + bench per config under one lease."""
        specs = [self._launch_spec(user, request.host, words) for words in request.configs]
        payload = SweepPayload(
            request.host, user, channel, configs=tuple(s.intent for s in specs), bench=request.spec, eval=request.eval
        )
        summary = f"sweep {' | '.join(s.label for s in specs)} bench {request.spec.label}"
        if request.eval:
            summary += f" eval {request.eval.label}"
        return self._enqueue(payload, summary)

    def handle_tune(self, user: str, channel: str, request: TuneRequest) -> Reply:
        """Queue a tune's first step, print its dry run, or pause/resume one (bot/tune_commands.py)."""
        from bot.tune_commands import handle_tune

        return handle_tune(self, user, channel, request)

    # ------------------------------------------------------------------ helpers

    def _launch_spec(self, user: str, host: str, words: EngineConfigWords) -> LaunchSpec:
        """Build the launch once here, for its friendly errors now; the worker compiles the real one."""
        self._check_flags(user, host, words.flags)
        return build_launch(self.config, launch_host(self.config, host), words.presets, words.flags)

    def _check_flags(self, user: str, host: str, flags: Iterable[tuple[str, FlagValue]]) -> None:
        """Reserved engine flags for nobody; options that name a path, module, class, URL or another
        model (``workers/engines/option_policy.toml``) for admins only; judged in the host's engine."""
        admin = self.config.access.is_admin(user)
        engine = launch_host(self.config, host).engine.kind
        for flag, value in flags:
            check_raw_flag(flag, value, admin=admin, engine=engine)

    def _enqueue(self, payload: JobPayload, summary: str) -> Reply:
        host, user, channel, kind = payload.host, payload.user, payload.channel, payload.kind
        limits = self.config.limits
        queued = queue.enqueue(
            self.redis,
            queue_host(self.config, host),  # a group's job waits in its first member's line (workers/gang)
            kind,
            payload.to_dict(),  # JSON from here: RQ carries it to the worker
            user=user,
            channel=channel,
            summary=summary,
            job_timeout_s=limits.job_timeout_s,
            max_queued_per_user=limits.max_queued_per_user,
            outcome_kind=payload.outcome_kind,
        )
        data: dict[str, object] = {
            "job_id": queued.job_id,
            "user": user,
            "channel": channel,
            "host": host,
            "kind": kind,
            "outcome_kind": payload.outcome_kind,
            "summary": summary,
            "position": queued.position,
            "ahead": queued.ahead,
        }
        if queued.ahead:  # while it waits: when it should start, from how long past jobs held a host
            wait_s = eta.waits_s(self.redis, {queued.host: queue.list_jobs(self.redis, queued.host)}).get(queued.job_id)
            if wait_s is not None:
                data["eta_s"] = round(wait_s)
        if isinstance(payload, BenchPayload | EvalPayload):  # say which server it will measure (issue 25 item 6)
            expect = None if payload.any_config else payload.expect
            data["measures"] = {"expect": expect.to_dict() if expect is not None else None}
        service = presence.host_service(self.redis, queued.host)
        problem = render.service_line(queued.host, service)
        text = render.queued_text(data) + (f"\n{problem}" if problem else "")
        data["service"] = service.to_dict()
        return Reply(ok=True, kind="queued", text=text, ephemeral=False, job_id=queued.job_id, data=data)

    def _expected_config(self, user: str, host: str) -> Expectation:
        """What the requester means by "the running server": their own queued launch, else what runs now.

        What runs now is pinned to its very instance when a launch, sweep or stop is queued ahead (it
        may replace that server before this job's turn). When nothing identifies a server (no observer
        answered, no stored observation, or the owner reports no config), the expectation is
        ``unknown`` and the job will refuse to measure: only ``any`` measures whatever runs.
        """
        jobs = queue.list_jobs(self.redis, queue_host(self.config, host))
        if host in self.config.groups:  # a gang is the server its head serves (workers/gang/bench.py)
            host = self.config.groups[host].head
        for job in reversed(jobs):
            if job.user == user and job.kind in (JobKind.LAUNCH, JobKind.SWEEP):
                return Expectation(after_job=job.job_id, label=job.summary)
        replacing = [job for job in jobs if job.kind in (JobKind.LAUNCH, JobKind.SWEEP, JobKind.STOP)]
        fresh = observer.request_observation(self.redis, host, timeout_s=self.observe_timeout_s)
        unread = fresh is not None and UNREAD_TABLE in fresh.extra  # nothing listened, a loading engine may be there
        if fresh is not None and fresh.process is None and fresh.state == ObservedState.NONE and not unread:
            return Expectation(nothing_running=True, label="nothing", fresh=True)
        observed = fresh or observer.last_observation(self.redis, host)
        if observed is not None and observed.fingerprint:
            return Expectation(
                fingerprint=observed.fingerprint,
                instance_id=observed.instance_id,
                label=observed.summary,
                fresh=fresh is not None,
                pinned=bool(replacing),
            )
        if observed is None:
            why = f"no worker for {host} answered in time and there is no stored observation of it"
        elif UNREAD_TABLE in observed.extra:
            unread_why = observed.extra[UNREAD_TABLE]
            why = f"nothing listened on {host}'s port, but its process table could not be read ({unread_why})"
        else:
            why = f"what owns {host}'s port was {observed.state.value} and reported no config"
        return Expectation(unknown=why)

    def _job(self, job_id: str) -> queue.JobInfo:
        info = queue.job_info(self.redis, job_id)
        if info is None:
            raise BenchbotError(f"there is no job {job_id}")
        return info

    def _bench_this(self, user: str, channel: str, job_id: str) -> Reply:
        self._job(job_id)
        host = parse_payload(queue.job_payload(self.redis, job_id)).host  # a gang's group, not its first member
        request = BenchRequest(host=host, spec=BenchSpec(levels=DEFAULT_BUTTON_LEVELS))
        return self.dispatch(user, channel, request)

    def _rerun(self, user: str, channel: str, job_id: str) -> Reply:
        info = self._job(job_id)
        denial = self.access_denial(user, channel, info.kind)
        if denial:
            return refused(denial, kind="denied")
        # Read through the typed payload: intent only, even when an older bot queued it with its argv (schema 1).
        original = parse_payload(queue.job_payload(self.redis, job_id))
        payload = replace(original, user=user, channel=channel)  # its host: a gang job's is its group
        # A re-run is a new request by whoever pressed the button: an admin's --trust-remote-code is not theirs.
        launches: tuple[LaunchIntent, ...] = ()
        if isinstance(payload, LaunchPayload):
            launches = (payload.launch,)
        elif isinstance(payload, SweepPayload):
            launches = payload.configs
        self._check_flags(user, payload.host, (pair for intent in launches for pair in intent.raw_flags))
        if isinstance(payload, BenchPayload | EvalPayload) and not payload.any_config:
            payload = replace(payload, expect=self._expected_config(user, payload.host))
        if isinstance(payload, TunePayload):
            from bot.tune_commands import rerun_payload, tune_summary

            payload = rerun_payload(payload)
            return self._enqueue(payload, tune_summary(payload))
        return self._enqueue(payload, info.summary)

    def _compare_baseline(self, user: str, channel: str, run_id: str) -> Reply:
        record = store.get_run(self.redis, run_id)
        baseline = store.baseline_for(self.redis, record.host)
        if baseline is None:
            raise BenchbotError(f"{record.host} has no baseline yet: tag one with /runs tag RUN baseline")
        if baseline.id == record.id:
            raise BenchbotError(f"{run_id} is the baseline itself")
        return self.dispatch(user, channel, CompareRequest(run_ids=(baseline.id, record.id)))
