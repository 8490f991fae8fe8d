"""A tune whose budget covers its whole grid: the tell of the last config must not fail the step.

Optuna's GridSampler calls ``Study.stop()`` once every grid point is told, and outside ``study.optimize()``
that raises RuntimeError; a ``/tune`` of 2 configs with budget=2 (the demo's) failed its last trial so.
"""

from __future__ import annotations

from workers.tune import study as tune_study
from workers.tune.space import GROUP, Dimension, TuneSpace, label_of


def test_every_config_of_a_grid_is_told_and_then_the_search_says_it_is_spent() -> None:
    space = TuneSpace((Dimension("fp4", GROUP, ("fp4-cudnn", "fp4-cutlass")),))
    study = tune_study.open_study(None, "grid", space, n_kept=2, objective="goodput")
    measured: dict[str, list[float]] = {}
    for value in (1.0, 2.0):
        asked = tune_study.ask(study, space, skip={}, measured=measured)
        assert asked is not None
        number, params = asked
        tune_study.tell_done(study, number, [value])  # the second one is the grid's last point
        measured[label_of(params)] = [value]
    assert set(measured) == {"fp4=fp4-cudnn", "fp4=fp4-cutlass"}
    assert tune_study.ask(study, space, skip={}, measured=measured) is None
