"""Client-side cost of the telemetry sampler: one level on the simulator with and without sampling.

Prints JSON: output tok/s, TTFT p50 and the client's own timing error for each, alternating runs so a
loaded box affects both alike. The sampler runs nvidia-smi (the stand-in) twice per tick and scrapes
/metrics; its cost should be within the run-to-run spread of the level itself.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path

from workers.benchmark.client import run_bench
from workers.benchmark.settings import ClientSettings
from workers.benchmark.spec import BenchSpec
from workers.host.local import LocalTransport
from workers.ports import free_local_port
from workers.sim.launcher import BASELINE_ARGS, start_sim
from workers.telemetry.sampler import RunTelemetry

ROUNDS = 3


async def one(url: str, tel: RunTelemetry | None) -> dict[str, float]:
    params = ClientSettings(BenchSpec(levels=(8,), input_len=64, output_len=48, warmup=0))
    (level,) = await run_bench(url, params, around_level=tel.level if tel else None)
    m = level.metrics.to_dict()
    return {"output_tok_s": m["output_tok_s"], "ttft_p50_ms": m["ttft_ms"]["p50"]}


def main() -> None:
    state = Path(tempfile.mkdtemp())
    port = free_local_port()
    with start_sim(port, *BASELINE_ARGS, "--enable-metrics", env={"BENCHBOT_SIM_STATE_DIR": str(state)}):
        url = f"http://127.0.0.1:{port}"
        smi = (sys.executable, "-m", "workers.sim.nvidia_smi", f"--sim-state-dir={state}")
        out: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
        for _ in range(ROUNDS):
            out["off"].append(asyncio.run(one(url, None)))
            out["on"].append(asyncio.run(one(url, RunTelemetry(LocalTransport(), smi, url + "/metrics"))))
    summary = {
        mode: {
            key: {"mean": statistics.mean(r[key] for r in runs), "stdev": statistics.pstdev(r[key] for r in runs)}
            for key in runs[0]
        }
        for mode, runs in out.items()
    }
    print(json.dumps({"rounds": ROUNDS, "level": 8, **summary}, indent=1))


if __name__ == "__main__":
    main()
