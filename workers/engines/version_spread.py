"""Flags judged across every recorded release, for a host whose engine version benchbot could not learn.

When the version probe and the on-host option dump both fail, the worker used to check nothing but the
raw flags' policy: the base ``nextn`` preset then emitted ``--mamba-scheduler-strategy``, which SGLang
0.5.20+ rejects after minutes of start-up, and nobody could say in advance which release would refuse
what. So each flag of the compiled launch is now held against every recorded contract of the engine;
one that some supported release refuses is refused here, naming those releases and the reason, rather
than guessing which release the host runs. Flags every recorded release accepts pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from workers.engines.args import FlagValue
from workers.engines.contract import Contract, all_contracts
from workers.engines.registry import display_name


@dataclass(frozen=True)
class Spread:
    """How the recorded releases take one flag: who refuses it (with the first reason) and who accepts."""

    flag: str
    value: FlagValue
    refused_by: tuple[str, ...]
    accepted_by: tuple[str, ...]
    reason: str  # the oldest refusing release's own sentence

    @property
    def refused(self) -> bool:
        """True when at least one recorded release refuses the flag."""
        return bool(self.refused_by)


def version_ranges(versions: Sequence[str], recorded: Sequence[str]) -> str:
    """``0.5.9-0.5.13, 0.5.20``: ``versions`` (a subset of ``recorded``, oldest first) as runs of neighbours."""
    index = {v: i for i, v in enumerate(recorded)}
    runs: list[list[str]] = []
    for version in versions:
        if runs and index[version] == index[runs[-1][-1]] + 1:
            runs[-1].append(version)
        else:
            runs.append([version])
    return ", ".join(run[0] if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


def spread(flag: str, value: FlagValue, contracts: Sequence[Contract]) -> Spread:
    """``flag`` ``value`` judged by each contract (oldest first)."""
    refused: list[str] = []
    accepted: list[str] = []
    reason = ""
    for contract in contracts:
        problem = contract.problem(flag, value)
        if problem is None:
            accepted.append(contract.version)
        else:
            refused.append(contract.version)
            reason = reason or problem.message
    return Spread(flag, value, tuple(refused), tuple(accepted), reason)


def unknown_version_problems(
    flags: Iterable[tuple[str, FlagValue]],
    engine: str,
    *,
    ignore: Callable[[str], bool] = lambda flag: False,
    contracts: Sequence[Contract] | None = None,
) -> list[str]:
    """A sentence per flag that some recorded release of ``engine`` refuses (``ignore``: not the engine's)."""
    known = list(all_contracts(engine) if contracts is None else contracts)
    if not known:
        return []
    recorded = [c.version for c in known]
    name = display_name(engine)
    problems: list[str] = []
    for flag, value in flags:
        if ignore(flag):
            continue
        found = spread(flag, value, known)
        if not found.refused:
            continue
        shown = flag if value is True else f"{flag} {value}"
        accepted = (
            f"; {version_ranges(found.accepted_by, recorded)} accept it"
            if found.accepted_by
            else "; no release accepts it"
        )
        problems.append(
            f"{shown} is refused by {name} {version_ranges(found.refused_by, recorded)} ({found.reason}){accepted}. "
            f"This host's {name} version is unknown, so benchbot will not guess: fix the version probe "
            "(or set the host's version_command) and launch again"
        )
    return problems
