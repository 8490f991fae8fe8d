"""How many trials does /tune's search need? Against the grid, on the simulator's tune landscape.

The landscape (``workers/sim/landscape.py``: moe x nextn x max-running x cuda-graph-bs x chunked-prefill,
90 configs, some of which OOM or refuse to start) is scored in closed form, so the optimum is known by
scoring every config (what a grid search, like vLLM's ``benchmarks/auto_tune``, pays). The search is
/tune's own: ``workers.tune.study`` (the same sampler choice, the same ask that never relaunches a crashed
or measured config), in memory instead of on Redis. Cost = configs launched, crashes included. Prints
one JSON object; ``ok`` says whether the median over 5 seeds reaches 95 % of the best within 40 % of the
grid's trials.

    .venv/bin/python bench/tune_efficiency.py
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from workers.sim.landscape import evaluate  # noqa: E402
from workers.tune import study as tune_study  # noqa: E402
from workers.tune.space import GROUP, KNOB, SWITCH, Dimension, TuneSpace, label_of  # noqa: E402

SPACE = TuneSpace(
    (
        Dimension("moe", GROUP, ("cutlass", "triton", "trtllm")),
        Dimension("nextn", SWITCH, ("on", "off")),
        Dimension("max-running", KNOB, (32, 64, 128, 192, 256), flag="--max-running-requests"),
        Dimension("cuda-graph-bs", KNOB, (64, 256, 512), flag="--cuda-graph-max-bs"),
    )
)
TARGET, BUDGET_SHARE, SEEDS = 0.95, 0.40, (0, 1, 2, 3, 4)


def trials_to_target(seed: int, best: float, cap: int) -> int | None:
    """Configs launched until one scores within 5 % of ``best`` (None: not within ``cap``)."""
    study = tune_study.open_study(None, f"bench-{seed}", SPACE, SPACE.size, "goodput", seed=seed)
    skip: dict[str, str] = {}
    measured: dict[str, list[float]] = {}
    for launched in range(1, cap + 1):
        asked = tune_study.ask(study, SPACE, skip=skip, measured=measured)
        if asked is None:
            return None
        number, params = asked
        point = evaluate(params)
        if point.crashed:
            tune_study.tell_failed(study, number, point.crashed)
            skip[label_of(params)] = point.crashed
            continue
        tune_study.tell_done(study, number, [point.goodput_rps])
        measured[label_of(params)] = [point.goodput_rps]
        if point.goodput_rps >= TARGET * best:
            return launched
    return None


def main() -> int:
    scores = {label_of(p): evaluate(p) for p in SPACE.configs()}
    best_label, best = max(((k, v.goodput_rps) for k, v in scores.items()), key=lambda kv: kv[1])
    grid = len(scores)
    cap = grid
    needed = [trials_to_target(seed, best, cap) for seed in SEEDS]
    counted = [n if n is not None else cap for n in needed]
    median = statistics.median(counted)
    hits = sum(1 for v in scores.values() if v.goodput_rps >= TARGET * best)
    out = {
        "schema": 1,
        "configs": grid,
        "crash_configs": sum(1 for v in scores.values() if v.crashed),
        "best": {"config": best_label, "goodput_rps": round(best, 3)},
        "configs_within_target": sum(1 for v in scores.values() if v.goodput_rps >= TARGET * best),
        # a uniform random order without repeats needs (N + 1) / (hits + 1) trials on average: the baseline
        "random_expected_trials": round((grid + 1) / (hits + 1), 1),
        "grid_trials": grid,
        "search_trials_per_seed": needed,
        "search_trials_median": median,
        "share_of_grid": round(median / grid, 3),
        "target": f"within {round((1 - TARGET) * 100)} % of the best in at most {round(BUDGET_SHARE * 100)} % "
        "of the grid's trials (median of 5 seeds)",
        "ok": median <= BUDGET_SHARE * grid,
    }
    print(json.dumps(out, indent=2))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
