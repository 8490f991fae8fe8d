"""Every Redis key and stream benchbot uses, named in one place.

All of benchbot's own keys live under ``benchbot:``; RQ keeps its own under ``rq:``, and the one RQ
key benchbot reads itself (a host queue's list, in the lease's Lua) is named here too. Each function
says what the key holds, its Redis type and how long it lives. The spellings are a stored format:
data written by an older benchbot must still be found, so a value here never changes.

Everything stored under these keys is text (JSON, ids, names, counters): benchbot reads them through
a decoding client (:func:`workers.redis_conn.text_client`).
"""

from __future__ import annotations

#: The namespace of every benchbot key.
PREFIX = "benchbot:"

#: RQ queue names are ``benchbot-<host>`` (a name, not a key: RQ stores the list under ``rq:queue:``).
QUEUE_NAME_PREFIX = "benchbot-"
#: RQ's namespace for a queue's list of job ids (``rq.Queue.redis_queue_namespace_prefix``).
RQ_QUEUE_PREFIX = "rq:queue:"


def _key(*parts: object) -> str:
    return PREFIX + ":".join(str(p) for p in parts)


# ---- jobs: ids, enqueue, cancel -----------------------------------------------------------------

#: String (INCR counter), no TTL: the last job id handed out; job ids are its values ("cancel 17").
JOB_SEQ = _key("seq", "job")
#: String (a redis-py lock token), 10 s timeout: held while a job is enqueued, so per-user limits are
#: exact and RQ's list order equals job id order.
ENQUEUE_LOCK = _key("lock", "enqueue")


def queue_name(host: str) -> str:
    """The RQ queue name of ``host`` (``benchbot-<host>``)."""
    return QUEUE_NAME_PREFIX + host


def rq_queue(host: str) -> str:
    """List (RQ's), lives while jobs wait: ids of ``host``'s jobs no worker has taken yet."""
    return RQ_QUEUE_PREFIX + queue_name(host)


def rq_job(job_id: str) -> str:
    """Hash (RQ's), RQ's result/failure TTL once the job ended: RQ's record of a job (``status`` field)."""
    return f"rq:job:{job_id}"


def job_cancel(job_id: str) -> str:
    """String, JSON ``{"by", "at"}``, 24 h TTL: set by a cancel of a started job; its context and worker watch it."""
    return _key("job", job_id, "cancel")


def user_queued(user: str) -> str:
    """Set of ``<host>|<job id>``, no TTL (stale members dropped lazily): ``user``'s jobs not yet started."""
    return _key("user", user, "queued")


# ---- events -------------------------------------------------------------------------------------

#: Stream (field ``event``: JSON), trimmed by length: every event of every job, read by the notifier
#: through a consumer group.
EVENTS = _key("events")


def job_events(job_id: str) -> str:
    """Stream (field ``event``: JSON), 7 d TTL: one job's events, for ``say --wait`` and re-rendering."""
    return _key("job", job_id, "events")


def job_terminal(job_id: str) -> str:
    """String (the terminal event's type), 7 d TTL: present once the job has ended, written with that event."""
    return _key("job", job_id, "terminal")


# ---- the lease and the line of waiters ----------------------------------------------------------

#: Set of host names, no TTL: every host that ever had a job enqueued or a lease granted.
LEASE_HOSTS = _key("lease", "hosts")


def lease(host: str) -> str:
    """String, JSON holder ``{user, job, worker, since, fence, seq, ttl_ms}``, PX TTL renewed by heartbeats."""
    return _key("lease", host)


def lease_fence(host: str) -> str:
    """String (INCR counter), no TTL: the fencing token, incremented with every grant of ``host``'s lease."""
    return _key("fence", host)


def lease_last(host: str) -> str:
    """String, the holder JSON, no TTL until a clean release: still there after an expiry = its worker died."""
    return _key("lease", host, "last")


def lease_waiters(host: str) -> str:
    """Sorted set of job ids scored by job id, no TTL: the line of jobs waiting for ``host``."""
    return _key("lease", host, "waiters")


def lease_waiter_prefix(host: str) -> str:
    """Prefix of the per-waiter liveness strings (``+ job id``): "queued" (no TTL), then a worker name (PX TTL)."""
    return _key("lease", host, "waiter") + ":"


def lease_waiter(host: str, job_id: str) -> str:
    """String, the liveness of one waiter (see :func:`lease_waiter_prefix`)."""
    return lease_waiter_prefix(host) + job_id


# ---- hosts: state, observations, engine ---------------------------------------------------------


def host_state(host: str) -> str:
    """Hash field -> text (JSON for records), no TTL: host state written only under the current fence."""
    return _key("host", host, "state")


def host_effects(host: str) -> str:
    """Stream (field ``effect``: JSON), capped, 7 d TTL: every fenced action a job took on ``host`` through
    the host-side actuator (claim, spawn, signal, unlink), with the fence it carried and when it began and ended."""
    return _key("host", host, "effects")


def host_observed(host: str) -> str:
    """String, JSON, no TTL: the host's last observation (replaced by each new one)."""
    return _key("host", host, "observed")


def host_engine_version(host: str) -> str:
    """String, no TTL: the engine version last probed on ``host``."""
    return _key("host", host, "engine_version")


def engine_contract(engine: str, version: str) -> str:
    """String, JSON, no TTL: the probed contract (flags, endpoints) of one engine version."""
    return _key("contract", engine, version)


def observe_requests(host: str) -> str:
    """List of JSON requests ``{id?, at}``, newest first, at most 64, 30 s TTL: asks ``host``'s observer to look now."""
    return _key("observe", host, "requests")


def observe_reply(request_id: str) -> str:
    """List of one JSON reply, 60 s TTL: an observer's answer to one request."""
    return _key("observe", "reply", request_id)


def worker_connect_error(host: str) -> str:
    """String (JSON ``{error, at}``): the last error a worker met reaching ``host``; deleted once it gets
    through; expires on its own (``workers.jobs.presence.CONNECT_ERROR_TTL_S``)."""
    return _key("worker", host, "connect_error")


def observer_alive(host: str) -> str:
    """String "1", 5 s TTL refreshed each second: an observer serves ``host``."""
    return _key("observer", host, "alive")


# ---- run history --------------------------------------------------------------------------------

#: String (INCR counter), no TTL: behind the run ids ``r1``, ``r2``, ...
RUN_SEQ = _key("seq", "run")
#: Sorted set of run ids scored by ``created_at``, no TTL: every run, for newest-first listings.
RUNS = _key("runs")


def run(run_id: str) -> str:
    """String, the run record as JSON, no TTL."""
    return _key("run", run_id)


def run_eval(run_id: str) -> str:
    """String, JSON of the run's eval with every item (``EvalRun.to_dict()``), no TTL: kept apart from the
    record so that listings do not parse hundreds of items."""
    return _key("run", run_id, "eval")


def run_tags(run_id: str) -> str:
    """Hash tag -> JSON ``{"by", "at"}``, no TTL: who tagged a run with what, and when."""
    return _key("run", run_id, "tagged")


def run_notes(run_id: str) -> str:
    """List of JSON notes ``{"by", "at", "text"}`` (scrubbed), oldest first, capped, no TTL: a thread's
    discussion of a run, kept with it (:mod:`workers.results.notes`)."""
    return _key("run", run_id, "notes")


def host_runs(host: str) -> str:
    """Sorted set of run ids scored by ``created_at``, no TTL: one host's runs."""
    return _key("runs", "host", host)


def host_baselines(host: str) -> str:
    """Sorted set of run ids scored by tag time, no TTL: runs tagged ``baseline`` on ``host``."""
    return _key("baseline", host)


# ---- Slack front end ----------------------------------------------------------------------------

#: Hash event id -> steps done, no TTL (a field is deleted once its event is fully posted): how far
#: the notifier got with one event, so a restart does not post a step twice.
SLACK_STEPS = _key("slack", "steps")
#: Prefix of the per-job thread strings (``+ job id``).
SLACK_THREAD_PREFIX = _key("slack", "thread") + ":"
#: Prefix of the delivery markers (``+ Slack's delivery id``): String "1", SET NX with a 1 h TTL.
SLACK_DELIVERY_PREFIX = _key("slack", "delivery") + ":"
#: Prefix of the button-click markers (``+ user:action:value:ts``): String "1", SET NX with a 10 s TTL.
SLACK_CLICK_PREFIX = _key("slack", "click") + ":"


#: Prefix of the event markers (``+ Slack's event_id`` or ``msg:channel:ts``): String "1", SET NX, 1 h TTL.
SLACK_EVENT_PREFIX = _key("slack", "event") + ":"


def slack_talk(channel: str, thread_ts: str) -> str:
    """Hash job id -> the job's payload JSON, 30 d TTL: the jobs whose story is in the Slack thread
    (channel, thread_ts), so a mention there knows its host, bench and runs (:mod:`bot.thread_talk`)."""
    return _key("slack", "talk", channel, thread_ts)


def slack_thread(job_id: str) -> str:
    """String, JSON (channel, message ts, header state), 30 d TTL: where a job's Slack thread lives."""
    return SLACK_THREAD_PREFIX + job_id


# ---- operators' metrics (workers/jobs/job_metrics.py, workers/ops_metrics.py) -------------------

#: Hash, no TTL: counters of events that happen in forked job processes (endings by host/kind/state,
#: failures by diagnosis, engine launches); field = JSON list ``[metric, label values...]``, value an integer.
METRICS_COUNTERS = _key("metrics", "counters")
#: Hash, no TTL: the job-duration histogram; field = JSON ``[kind, "bucket", i]`` / ``[kind, "sum"]`` /
#: ``[kind, "count"]`` (bucket counts per bucket, not cumulative; the collector adds them up).
METRICS_DURATIONS = _key("metrics", "durations")


# ---- /tune (workers/tune/state.py): kept like runs, without a TTL: a study is history ----

#: Every tune's id (the first step's job id), newest last.
TUNES = _key("tunes")


def tune(tune_id: str) -> str:
    """STRING (JSON): a tune's record: request, status, current step job, trials, the winner once confirmed."""
    return _key("tune", tune_id)


def tune_control(tune_id: str) -> str:
    """STRING: ``cancel`` or ``pause`` by whom, read by the step between trials."""
    return _key("tune", tune_id, "control")


def tune_journal(tune_id: str) -> str:
    """LIST: the Optuna study's journal, one JSON log per entry (workers/tune/journal.py)."""
    return _key("tune", tune_id, "journal")
