"""The search: an Optuna study in the project's Redis, driven ask-and-tell, one trial per step job.

Optuna is imported here only, and this module only by the tune's job body (a worker), so neither the
bot nor any other job pays its import (~0.3-0.6 s). The study's journal is a Redis LIST on the worker's
own connection (:mod:`workers.tune.journal`), so it survives a worker crash, a lost lease and a Sentinel
failover. A small space (``GRID_MAX`` configs or fewer) is searched as a grid in a seeded random order;
a bigger one by a seeded TPE sampler (multi-objective for ``objective=both``).

What the sampler proposes is checked against what the tune already knows before anything launches: a
pruned-before-launch or crashed config is told FAIL at once and asked again (never launched twice), a
config already measured is told its old value again (the sampler learns, the budget is not spent).

**A dead worker's trial.** With ask-and-tell, Optuna cannot know that the step running a trial died: the
trial stays RUNNING. The next step (``/tune resume ID``) finds it, tells it FAIL ("its worker died") and
enqueues the same config again, so the next ask returns it: the config is measured exactly once to the
end, no trial is lost and none is repeated in the tune's table (decision documented in README's /tune).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal, cast

import redis

from workers import keys
from workers.tune.journal import RedisListJournal
from workers.tune.objective import directions
from workers.tune.space import KNOB, TuneSpace, label_of

if TYPE_CHECKING:
    import optuna

#: A space of at most this many configs (after pruning) is searched as a grid.
GRID_MAX = 32
#: Asks in a row that only meet known configs before the search says the space is exhausted.
MAX_SKIPS = 200
REASON_ATTR = "benchbot_reason"


def _distributions(space: TuneSpace) -> dict[str, optuna.distributions.BaseDistribution]:
    from optuna.distributions import CategoricalDistribution, IntDistribution

    out: dict[str, optuna.distributions.BaseDistribution] = {}
    for dim in space.dimensions:
        if dim.kind == KNOB and len(dim.values) > 1:
            values = [int(v) for v in dim.values]
            step = values[1] - values[0]
            if all(b - a == step for a, b in itertools.pairwise(values)):
                out[dim.name] = IntDistribution(values[0], values[-1], step=step)
                continue
        out[dim.name] = CategoricalDistribution(list(dim.values))
    return out


def sampler_for(space: TuneSpace, n_kept: int, seed: int = 0) -> optuna.samplers.BaseSampler:
    """A seeded grid for a small space (every config once, in a random order), seeded TPE otherwise."""
    import optuna

    if n_kept <= GRID_MAX:
        return _ask_tell_grid({dim.name: list(dim.values) for dim in space.dimensions}, seed)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(8, max(2, n_kept // 10)))


def _ask_tell_grid(grid: dict[str, list[str | int]], seed: int) -> optuna.samplers.BaseSampler:
    """Optuna's grid sampler, driven ask-and-tell. Its ``after_trial`` calls ``Study.stop()`` once every point
    of the grid is told, which outside ``study.optimize()`` raises RuntimeError (after the tell is stored):
    the tell of a tune's last grid config would fail its step. Nothing needs stopping here (the tune's own
    budget and :func:`ask` end the search), so this grid never calls it."""
    from optuna.samplers import GridSampler

    class AskTellGrid(GridSampler):
        def after_trial(self, *args: object, **kwargs: object) -> None:
            return None

    return AskTellGrid(grid, seed=seed)


def open_study(
    r: redis.Redis | None,
    tune_id: str,
    space: TuneSpace,
    n_kept: int,
    objective: str,
    seed: int = 0,
) -> optuna.Study:
    """The tune's study, created on the first step and loaded on every later one (same sampler, same seed).
    Without ``r`` it lives in memory (``bench/tune_efficiency.py`` measures the search itself that way)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage: optuna.storages.BaseStorage = (
        optuna.storages.InMemoryStorage()
        if r is None
        else optuna.storages.JournalStorage(RedisListJournal(r, keys.tune_journal(tune_id)))
    )
    return optuna.create_study(
        study_name=f"benchbot-tune-{tune_id}",
        storage=storage,
        sampler=sampler_for(space, n_kept, seed),
        directions=cast("list[Literal['minimize', 'maximize']]", directions(objective)),
        load_if_exists=True,
    )


def fail_stale(study: optuna.Study) -> list[dict[str, str | int]]:
    """Tell FAIL to every trial a dead step left RUNNING and queue its config again; returns those configs."""
    from optuna.trial import TrialState

    stale = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.RUNNING]
    for trial in stale:
        study._storage.set_trial_user_attr(trial._trial_id, REASON_ATTR, "its worker died mid-trial; asked again")
        study.tell(trial.number, state=TrialState.FAIL)
        study.enqueue_trial(dict(trial.params), skip_if_exists=False)
    return [dict(t.params) for t in stale]


def ask(
    study: optuna.Study,
    space: TuneSpace,
    *,
    skip: Mapping[str, str],
    measured: Mapping[str, Sequence[float]],
) -> tuple[int, dict[str, str | int]] | None:
    """The next config worth launching: ``(optuna trial number, params)``, or None when only known configs
    remain. ``skip`` maps a label to why it may not run (pruned, crashed); ``measured`` a label to its values."""
    from optuna.trial import TrialState

    dists = _distributions(space)
    for _ in range(MAX_SKIPS):
        trial = study.ask(dists)
        params: dict[str, str | int] = {d.name: trial.params[d.name] for d in space.dimensions}
        label = label_of(params)
        if label in skip:
            trial.set_user_attr(REASON_ATTR, skip[label])
            study.tell(trial, state=TrialState.FAIL)
        elif label in measured:
            trial.set_user_attr(REASON_ATTR, "measured before: its value again, not launched again")
            study.tell(trial, list(measured[label]))
        else:
            return trial.number, params
    return None


def tell_done(study: optuna.Study, number: int, values: Sequence[float]) -> None:
    study.tell(number, list(values))


def tell_pruned(study: optuna.Study, number: int, reason: str) -> None:
    from optuna.trial import TrialState

    study._storage.set_trial_user_attr(study.trials[number]._trial_id, REASON_ATTR, reason)
    study.tell(number, state=TrialState.PRUNED)


def tell_failed(study: optuna.Study, number: int, reason: str) -> None:
    from optuna.trial import TrialState

    study._storage.set_trial_user_attr(study.trials[number]._trial_id, REASON_ATTR, reason)
    study.tell(number, state=TrialState.FAIL)
