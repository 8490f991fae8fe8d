"""SGLang as an engine: everything benchbot knows about it, one noun per module.

- :mod:`~workers.engines.sglang.processes`: which argv is an SGLang server (``launch_server``, ``sglang serve``)
- :mod:`~workers.engines.sglang.probe`: how to ask a host its SGLang version and, unrecorded, its options
- :mod:`~workers.engines.sglang.flags`: flag <-> server-arg names via the recorded contracts, requested
  args, what ``sglang serve`` hands on, what SGLang renamed or rewrites
- :mod:`~workers.engines.sglang.server_info`: parsing ``/server_info``, telling SGLang from other servers
- :mod:`~workers.engines.sglang.observation`: asking ``/server_info``, the fingerprint and label of what it says
- :mod:`~workers.engines.sglang.diagnosis`: the failure RULES, texts SGLang survives, hints fitted to versions
- :mod:`~workers.engines.sglang.readiness`: the ``/health`` wait with SGLang's rules, the ``/generate`` smoke test
- :mod:`~workers.engines.sglang.profile`: ``/start_profile`` for a bounded capture
- :mod:`~workers.engines.sglang.driver`: all of it behind :class:`workers.engines.interface.EngineDriver`

SGLang is the registry's default engine: its presets are the config's own ``[presets]`` (the seed's in
``workers/config/seed_presets.toml``), so it packages none here. Facts come from
docs/observe.md and the contracts recorded from the real wheels
(``workers/engines/contracts/sglang-<version>.json``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workers.engines.interface import Engine, MetricNames
from workers.engines.sglang import probe
from workers.engines.sglang.processes import DEFAULT_PORT, KIND, NEEDLES, recognise

if TYPE_CHECKING:
    from workers.engines.interface import EngineDriver


def _driver() -> EngineDriver:
    from workers.engines.sglang.driver import DRIVER

    return DRIVER


ENGINE = Engine(
    kind=KIND,
    name="SGLang",
    default_port=DEFAULT_PORT,
    default_command=("python3", "-m", "sglang.launch_server"),
    recognise=recognise,
    version_argv=probe.version_argv,
    load_driver=_driver,
    process_needles=NEEDLES,
    devices=("cuda",),
    option_dump_argv=probe.dump_argv,
    metrics=MetricNames(
        running=("sglang:num_running_reqs",),
        queued=("sglang:num_queue_reqs",),
        kv_usage=("sglang:token_usage",),
        ttft=("sglang:time_to_first_token_seconds",),
        itl=("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
        e2e=("sglang:e2e_request_latency_seconds",),
        off_hint="SGLang serves /metrics only when launched with --enable-metrics",
    ),
)
