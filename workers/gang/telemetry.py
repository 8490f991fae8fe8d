"""A gang's telemetry (issue 38 item 5): every member's GPUs sampled while a level runs, summed per level.

A gang's bench is measured through its head, but every member's GPUs draw power and move PCIe bytes for
the tokens the head serves. :func:`for_gang` gives the bench one sampler (a
:class:`~workers.telemetry.sampler.RunTelemetry`, so ``run_bench_measured(telemetry=...)`` and the SLO search
take it unchanged) that samples the head as a one-host bench does (its GPUs and its engine's ``/metrics``)
and, at the same time, every other member's GPUs through that member's own transport and nvidia-smi (a rank
above 0 serves no HTTP: nothing is scraped there). Reading is not a side effect: no fence check precedes it.

Per level (:meth:`GangTelemetry.combine_level`):

* ``members``: each member's own figures, by rank (``rank``, ``host``, ``samples``, ``gpus``, ``total``,
  ``energy_j``, ``pcie_bytes``, ``j_per_tok`` = its joules over the gang's tokens, ``missing``), so a reader
  sees which box drew what;
* ``total.power_w.mean`` / ``total.pcie_mbs.mean``: the sum of the members' means, so ``energy_j`` and
  ``pcie_bytes`` are the sums of theirs, and ``j_per_tok``, ``pcie_bytes_per_tok`` and ``tok_s_per_w`` are the
  gang's totals over the output tokens the head served; ``p95`` / ``max`` and the timeline's power and PCIe are
  of the summed series (each head tick plus every other member's nearest tick);
* never a sum of fewer members: when a member has no power (or PCIe) sample during the level, the gang's sum is
  left out (``None``) and ``missing`` names the member (``pair-b (rank 1): no nvidia-smi on the host ...``)
  and what was not summed. The head's per-GPU table moves into its member entry (``gpus`` is per member).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass

from workers.config import HostConfig
from workers.json_value import JsonObject, JsonValue, opt_float
from workers.telemetry import run as run_telemetry
from workers.telemetry.sampler import RunTelemetry, Sample, _Runner
from workers.telemetry.summary import Stat, derived, gpu_summary, sample_pcie, sample_power, stat

#: What a member that serves no HTTP is scraped for instead of ``/metrics`` (never said: members miss no gauges).
NO_SCRAPE = "a rank above 0 serves no HTTP: the head's /metrics is the gang's"
#: One tick's reading summed over a host's GPUs (``summary.sample_power`` / ``sample_pcie``).
SampleSum = Callable[[Sample], float | None]


@dataclass(frozen=True)
class MemberSampler:
    """One member other than the head: its rank, its host's name, and a sampler of its GPUs only."""

    rank: int
    host: str
    tel: RunTelemetry


@dataclass
class GangTelemetry(RunTelemetry):
    """The head's sampler (this object) that also samples every other member's GPUs, level for level."""

    head_rank: int = 0
    head_host: str = ""
    members: tuple[MemberSampler, ...] = ()

    @contextlib.asynccontextmanager
    async def level(self, position: int = 0, load: float = 0.0) -> AsyncIterator[list[Sample]]:
        """Every member sampled from entering until leaving, together (entered and left at once, not in turn)."""
        head = super().level(position, load)
        everyone = [head, *(m.tel.level(position, load) for m in self.members)]
        samples, *_ = await asyncio.gather(*(cm.__aenter__() for cm in everyone))
        try:
            yield samples
        finally:
            await asyncio.gather(*(cm.__aexit__(None, None, None) for cm in everyone), return_exceptions=True)

    def combine_level(self, index: int, summary: JsonObject, level: Mapping[str, object]) -> JsonObject:
        """The gang's level: every member's figures, and their sums in the level's own keys (module docstring)."""
        head = MemberSampler(self.head_rank, self.head_host, self)
        everyone = [head, *self.members]
        views = [_member_view(m, m.tel.levels[index] if index < len(m.tel.levels) else [], level) for m in everyone]
        head_gpu_missing = views[0].missing
        missing = [m for m in _str_list(summary.get("missing")) if m not in head_gpu_missing]  # the server's
        for view in views:
            missing += [f"{view.name}: {why}" for why in view.missing]
        total: dict[str, Stat | None] = {}
        for key, of_sample in (("power_w", sample_power), ("pcie_mbs", sample_pcie)):
            without = [v.name for v in views if v.total.get(key) is None]
            if without:
                what = "GPU power" if key == "power_w" else "PCIe"
                if len(without) < len(views):
                    missing.append(f"the gang's {what} is not summed: no {what} sample from {', '.join(without)}")
                total[key] = None
                continue
            total[key] = _summed(views, key, of_sample)
        out: JsonObject = {k: v for k, v in summary.items() if k != "gpus"}
        out["total"] = {k: dict(v) if v is not None else None for k, v in total.items()}
        out.update(derived(total, level))
        out["timeline"] = _summed_timeline(summary.get("timeline"), views)
        out["missing"] = missing
        tokens = opt_float(level.get("output_tokens")) or 0.0
        out["members"] = [view.to_dict(tokens) for view in views]
        return out


@dataclass(frozen=True)
class _MemberView:
    """One member's GPU side of a level: its samples and what they add up to."""

    rank: int
    host: str
    samples: Sequence[Sample]
    gpus: JsonObject
    total: dict[str, Stat | None]
    figures: dict[str, float | None]
    missing: list[str]

    @property
    def name(self) -> str:
        """``pair-b (rank 1)``, as ``missing`` names a member."""
        return f"{self.host} (rank {self.rank})"

    def to_dict(self, tokens: float) -> JsonObject:
        energy = self.figures.get("energy_j")
        return {
            "rank": self.rank,
            "host": self.host,
            "samples": len(self.samples),
            "gpus": self.gpus,
            "total": {k: dict(v) if v is not None else None for k, v in self.total.items()},
            "energy_j": energy,
            "pcie_bytes": self.figures.get("pcie_bytes"),
            "j_per_tok": round(energy / tokens, 5) if energy is not None and tokens else None,
            "missing": list(self.missing),
        }


def _member_view(member: MemberSampler, samples: Sequence[Sample], level: Mapping[str, object]) -> _MemberView:
    gpus, total, missing = gpu_summary(samples, member.tel.gpu_missing)
    return _MemberView(member.rank, member.host, samples, gpus, total, derived(total, level), missing)


def _summed(views: Sequence[_MemberView], key: str, of_sample: SampleSum) -> Stat:
    """The gang's ``key``: the mean is the sum of the members' means (energy adds up exactly); p95 and max are
    of the summed series (the head's ticks, each with every other member's nearest tick)."""
    means = [v.total[key]["mean"] for v in views]  # type: ignore[index]  # callers check every total is there
    series = [_aligned_sum(t.t_s, views, of_sample) for t in views[0].samples]
    peaks = stat([x for x in series if x is not None]) or {"p95": sum(means), "max": sum(means)}
    return {"mean": round(sum(means), 3), "p95": peaks["p95"], "max": peaks["max"]}


def _aligned_sum(t_s: float, views: Sequence[_MemberView], of_sample: SampleSum) -> float | None:
    """Every member's reading nearest to ``t_s`` seconds into the level, summed; None if one had none."""
    values = []
    for view in views:
        near = min(view.samples, key=lambda s: abs(s.t_s - t_s), default=None)
        value = of_sample(near) if near is not None else None
        if value is None:
            return None
        values.append(value)
    return sum(values)


def _summed_timeline(rows: object, views: Sequence[_MemberView]) -> list[JsonValue]:
    """The head's timeline rows (``[t_s, power_w, pcie_mbs, kv, queued]``) with power and PCIe the gang's sums."""
    out: list[JsonValue] = []
    for row in rows if isinstance(rows, list) else []:
        if not isinstance(row, list) or not row or not isinstance(row[0], int | float):
            continue
        t_s = float(row[0])
        out.append([row[0], _aligned_sum(t_s, views, sample_power), _aligned_sum(t_s, views, sample_pcie), *row[3:]])
    return out


def _str_list(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def for_gang(members: Sequence[tuple[int, HostConfig, _Runner]]) -> GangTelemetry:
    """The sampler of a gang's bench: ``members`` by rank, ``(rank, host as its rank runs, its transport)``, the
    head (measured through, its ``/metrics`` scraped) first; every other member's GPUs through its own transport."""
    (head_rank, head_host, head_transport), *rest = members
    head = run_telemetry.for_host(head_host, head_transport)
    others = tuple(
        MemberSampler(
            rank,
            host.name,
            dataclasses.replace(
                run_telemetry.for_host(host, transport), metrics_url=None, metrics_none=NO_SCRAPE, latency=None
            ),
        )
        for rank, host, transport in rest
    )
    fields = {f.name: getattr(head, f.name) for f in dataclasses.fields(head) if f.init}
    return GangTelemetry(**fields, head_rank=head_rank, head_host=head_host.name, members=others)
