"""The bot's App Home tab: what a teammate opens benchbot for every day, drawn from Redis alone.

``app_home_opened`` (tab ``home``) -> :func:`publish_home` -> ``views.publish``: each host's state
(engine, the config it last reported, who holds it, how many jobs wait), the person's own running and
queued jobs with a Cancel button each (the same ``cancel_job`` action as a job header's), and their
last runs. Built with ``slack_sdk.models`` so Slack's limits (100 blocks, 3,000 characters a
section) are checked here rather than answered as ``invalid_blocks``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.models.blocks import (
    ActionsBlock,
    Block,
    ButtonElement,
    ContextBlock,
    DividerBlock,
    HeaderBlock,
    MarkdownTextObject,
    SectionBlock,
)
from slack_sdk.models.views import View

from bot import blocks
from workers import observer
from workers.jobs import queue_view
from workers.jobs.events import JobState
from workers.results import store

if TYPE_CHECKING:
    import redis as redis_lib

    from bot.slack_app import SlackFrontEnd
    from workers.config import Config

log = logging.getLogger(__name__)

MAX_HOME_BLOCKS = 100
LAST_RUNS = 5


def _section(text: str) -> SectionBlock:
    return SectionBlock(text=MarkdownTextObject(text=blocks.truncate(text, 3000)))


def home_view(config: Config, r: redis_lib.Redis, user: str) -> View:
    """The Home view of ``user``: hosts, their own jobs (with Cancel), their last runs."""
    hosts = list(config.hosts)
    listing = queue_view.list_jobs_many(r, hosts)
    observed = observer.last_observations(r, hosts)
    out: list[Block] = [HeaderBlock(text="benchbot")]
    for host in hosts:
        jobs = listing.get(host, [])
        running = next((j for j in jobs if j.state == JobState.RUNNING), None)
        seen = observed.get(host)
        engine = config.host(host).engine.kind
        runs_now = seen.summary if seen is not None and seen.summary else "no config reported"
        owner = f"held by @{running.user} (#{running.job_id} {running.summary})" if running else "free"
        waiting = len(jobs) - (1 if running else 0)
        line = f"*{blocks.escape(host)}* ({engine}): {blocks.escape(runs_now)}"
        out.append(_section(f"{line}\n{blocks.escape(owner)}, {waiting} waiting"))
    mine = [j for jobs in listing.values() for j in jobs if j.user == user]
    out += [DividerBlock(), _section("*Your jobs*")]
    if not mine:
        out.append(ContextBlock(elements=[MarkdownTextObject(text="nothing of yours is queued or running")]))
    for job in mine[:30]:
        place = "running" if job.state == JobState.RUNNING else f"{job.state}, #{job.position} in line"
        out.append(_section(f"#{job.job_id} {blocks.escape(job.summary)} on {blocks.escape(job.host)}: {place}"))
        out.append(
            ActionsBlock(
                elements=[ButtonElement(text="Cancel", action_id="cancel_job", value=job.job_id, style="danger")]
            )
        )
    out += [DividerBlock(), _section("*Your last runs*")]
    runs = store.list_runs(r, n=LAST_RUNS, filter=user)
    lines = [f"{run.id} {run.host} {run.label or run.config_summary or '-'} ({run.status})" for run in runs]
    out.append(_section(blocks.escape("\n".join(lines)) if lines else "no runs yet"))
    return View(type="home", blocks=out[:MAX_HOME_BLOCKS])


def publish_home(front: SlackFrontEnd, user: str) -> None:
    """Draw and publish ``user``'s Home tab (a failure is logged: the tab keeps its last view)."""
    try:
        view = home_view(front.dispatcher.config, front.redis, user)
        front.client.views_publish(user_id=user, view=view.to_dict())
    except (SlackApiError, SlackClientError, OSError) as exc:
        log.warning("slack: Home of %s not published (%s)", user, type(exc).__name__)
