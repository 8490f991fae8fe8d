"""workers.observation: RunningConfig, fingerprint, instance id, labels, diffs, and observe() on real sockets.

``observe`` runs through the real LocalTransport: the port owner is found in /proc (for the in-process
fixture server that is this very pytest process), GPUs come from an nvidia-smi stand-in script.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import stat
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.test_engine_sglang import SERVER_INFO_0523, SERVER_INFO_059, FakeSglang
from tests.util import async_wait_until, free_port
from workers.config import Preset
from workers.engines.args import parse_argv
from workers.engines.diagnosis import Diagnosis
from workers.engines.readiness import ReadyResult, is_garbage
from workers.engines.sglang.flags import requested_args
from workers.engines.sglang.observation import (
    FINGERPRINT_DROPPED_KEYS,
    config_fingerprint,
    describe_config,
    preset_words_for,
)
from workers.engines.sglang.readiness import smoke_test, wait_ready
from workers.engines.sglang.server_info import parse_server_info
from workers.errors import BenchbotError
from workers.host.local import LocalTransport
from workers.host.transport import HostFence
from workers.observation import (
    GpuInfo,
    RunningConfig,
    compare_requested,
    diff_requested,
    instance_id,
    parse_nvidia_smi,
)
from workers.observe_port import observe
from workers.secrets import REDACTED

SMI_CSV = (
    "0, NVIDIA RTX PRO 6000 Blackwell Server Edition, 90112, 97887, 35, 12.0\n"
    "1, NVIDIA RTX PRO 6000 Blackwell Server Edition, [N/A], 97887, [N/A], 12.0\n"
)


@pytest.fixture
def fake_smi(tmp_path: Path) -> list[str]:
    """An executable that prints nvidia-smi's CSV for the exact query observe() sends, and fails otherwise."""
    script = tmp_path / "nvidia-smi"
    script.write_text(
        "import sys\n"
        "want = ['--query-gpu=index,name,memory.used,memory.total,utilization.gpu,compute_cap',"
        " '--format=csv,noheader,nounits']\n"
        "if sys.argv[1:] != want:\n"
        "    sys.exit(2)\n"
        f"sys.stdout.write({SMI_CSV!r})\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return [sys.executable, str(script)]


def run_with_server(body: Any) -> Any:
    async def main() -> Any:
        server = await FakeSglang().start()
        try:
            return await body(server)
        finally:
            await server.stop()

    return asyncio.run(main())


# ---------------------------------------------------------------------------------------------------------
# observe() against a fixture server through the LocalTransport
# ---------------------------------------------------------------------------------------------------------


def test_observe_running_server(fake_smi: list[str]) -> None:
    async def body(server: FakeSglang) -> tuple[RunningConfig, list]:
        rc = await observe(
            LocalTransport(),
            host_name="gpu-1",
            port=server.port,
            api_key="sk-k",
            nvidia_smi=fake_smi,
            base_url=server.base_url,
        )
        return rc, server.requests

    rc, requests = run_with_server(body)
    assert rc.state == "running" and rc.is_running
    assert rc.process is not None and rc.process.pid == os.getpid()
    assert rc.process.argv and rc.process.start_ticks > 0 and rc.process.start_time > 1e9
    assert rc.instance_id == f"gpu-1:{os.getpid()}:{rc.process.start_ticks}"
    assert rc.server is not None and rc.server.version == "0.5.9"
    assert rc.server.args["api_key"] == REDACTED and "sk-very-secret" not in json.dumps(rc.to_dict())
    assert rc.server.model_path == "/models/Qwen3.5-397B-A17B-NVFP4" and rc.server.served_model_name == "qwen35"
    assert rc.server.max_total_num_tokens == 1234567
    assert rc.server.last_gen_throughput == 131.5 and rc.server.avg_spec_accept_length == 2.71
    assert re.fullmatch(r"[0-9a-f]{12}", rc.fingerprint or "")
    assert rc.fingerprint == config_fingerprint(rc.server.args, rc.server.model_path, "0.5.9")
    # The words are the server's; what follows them is each flag set away from its default, judged against the
    # process's command line (here pytest's own, so it varies with how pytest was started: serial or xdist).
    said = "flashinfer_cutlass MoE, flashinfer_cudnn FP4, triton attn, EAGLE 3/1/4, TP8, KV fp8_e4m3, custom AR off"
    assert rc.summary == said or rc.summary.startswith(said + ", --"), rc.summary
    assert all(part.startswith("--") for part in rc.summary.removeprefix(said).split(", ")[1:]), rc.summary
    assert [g.index for g in rc.gpus] == [0, 1] and rc.gpus[0].memory_used_mib == 90112
    assert rc.gpus[1].memory_used_mib is None and rc.gpus[1].compute_cap == "12.0"
    assert rc.managed is None and rc.launched_by is None
    info_request = next(r for r in requests if r[0] == "/server_info")  # /health is asked beside it
    assert info_request[1]["Authorization"] == "Bearer sk-k"
    # The JSON shape round-trips and is versioned.
    data = json.loads(json.dumps(rc.to_dict()))
    assert data["schema"] == 1
    assert RunningConfig.from_dict(data) == rc


def test_observe_always_looks_afresh(fake_smi: list[str]) -> None:
    """The seed: the server on the port changed; a second observation must see the new config."""

    async def body(server: FakeSglang) -> tuple[RunningConfig, RunningConfig]:
        baseline = {k: v for k, v in SERVER_INFO_059.items() if not k.startswith("speculative_")}
        baseline["speculative_algorithm"] = None
        server.server_info = baseline
        first = await observe(
            LocalTransport(), host_name="gpu-1", port=server.port, nvidia_smi=fake_smi, base_url=server.base_url
        )
        server.server_info = SERVER_INFO_059
        second = await observe(
            LocalTransport(), host_name="gpu-1", port=server.port, nvidia_smi=fake_smi, base_url=server.base_url
        )
        return first, second

    first, second = run_with_server(body)
    assert "no spec" in first.summary and "EAGLE 3/1/4" in second.summary
    assert first.fingerprint != second.fingerprint
    assert first.instance_id == second.instance_id  # same process, different config reported
    assert first.server is not None
    assert [d.arg for d in diff_requested({"speculative_algorithm": "NEXTN"}, first.server.args)] == [
        "speculative_algorithm"
    ]


def test_observe_nothing_on_the_port() -> None:
    port = free_port()
    rc = asyncio.run(
        observe(LocalTransport(), host_name="gpu-1", port=port, nvidia_smi=["/nonexistent/nvidia-smi"], timeout_s=2)
    )
    assert rc.state == "none"
    assert rc.process is None and rc.server is None and rc.gpus == ()
    assert rc.fingerprint is None and rc.instance_id is None
    assert RunningConfig.from_dict(rc.to_dict()) == rc


@pytest.mark.parametrize(
    ("setup", "state"),
    [
        ({"server_info_status": 503}, "starting"),
        ({"server_info_status": 500}, "unresponsive"),
        ({"server_info_paths": ("/get_server_info",)}, "running"),  # the deprecated alias only
        ({"server_info_paths": ()}, "not_sglang"),  # 404 on both
        ({"server_info": {"hello": "world"}}, "not_sglang"),
    ],
)
def test_observe_states(setup: dict[str, Any], state: str) -> None:
    async def body(server: FakeSglang) -> RunningConfig:
        for key, value in setup.items():
            setattr(server, key, value)
        return await observe(LocalTransport(), host_name="h", port=server.port, nvidia_smi=[], base_url=server.base_url)

    rc = run_with_server(body)
    assert rc.state == state
    assert rc.process is not None and rc.process.pid == os.getpid()  # the owner is seen in every state
    assert (rc.server is not None) == (state == "running")
    if state != "running":
        assert rc.detail and rc.fingerprint is None


@pytest.mark.parametrize(("health", "state"), [([503], "starting"), ([500], "unresponsive"), ([200], "running")])
def test_a_server_is_running_only_when_its_health_check_passes(health: list[int], state: str) -> None:
    """SGLang answers /server_info during its warm-up while /health says 503: that is warming up, not running."""

    async def body(server: FakeSglang) -> RunningConfig:
        server.health_codes = health
        return await observe(LocalTransport(), host_name="h", port=server.port, nvidia_smi=[], base_url=server.base_url)

    rc = run_with_server(body)
    assert rc.state == state and rc.is_running == (state == "running")
    if state == "starting":  # warming up: what it will serve is known, it is not ready to serve it
        assert rc.detail.startswith("warming up") and "/health says 503" in rc.detail
        assert rc.server is not None and rc.fingerprint and rc.summary
        assert RunningConfig.from_dict(json.loads(json.dumps(rc.to_dict()))) == rc
    if state == "unresponsive":
        assert "/health" in rc.detail and rc.server is None


def test_observe_port_owner_that_never_answers() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)  # accepts connections (backlog) but never speaks HTTP
        port = sock.getsockname()[1]
        rc = asyncio.run(observe(LocalTransport(), host_name="h", port=port, nvidia_smi=[], timeout_s=0.5))
    assert rc.state == "unresponsive"
    assert rc.process is not None and rc.process.pid == os.getpid()


def test_observe_redacts_the_api_key_in_argv(tmp_path: Path) -> None:
    """An unmanaged server started with --api-key must not leak it through /proc argv."""
    port = free_port()
    script = (
        "import socket, sys, time\n"
        "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(1); print('up', flush=True)\n"
        "time.sleep(60)\n"
    )

    async def main() -> RunningConfig:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", script, str(port), "--api-key", "sk-leak", stdout=asyncio.subprocess.PIPE
        )
        try:
            assert proc.stdout is not None
            assert (await asyncio.wait_for(proc.stdout.readline(), 10)).strip() == b"up"
            return await observe(LocalTransport(), host_name="h", port=port, nvidia_smi=[], timeout_s=0.5)
        finally:
            proc.kill()
            await proc.wait()

    rc = asyncio.run(main())
    assert rc.process is not None and rc.state == "unresponsive"
    assert "sk-leak" not in rc.process.argv and REDACTED in rc.process.argv


# ---------------------------------------------------------------------------------------------------------
# Pure parts
# ---------------------------------------------------------------------------------------------------------


def _args() -> dict[str, Any]:
    return parse_server_info(SERVER_INFO_059).args


def test_fingerprint_stable_under_volatile_changes() -> None:
    base = config_fingerprint(_args(), "/models/q", "0.5.9")
    volatile = dict(_args())
    volatile.update(
        port=30001,
        host="0.0.0.0",
        random_seed=42,
        nccl_port=12345,
        api_key="other",
        log_level="debug",
        served_model_name="renamed",
        launch_command="python -m sglang.launch_server --port 30001",
    )
    reordered = dict(reversed(list(volatile.items())))
    assert config_fingerprint(volatile, "/models/q", "0.5.9") == base
    assert config_fingerprint(reordered, "/models/q", "0.5.9") == base
    whole_float = dict(_args(), tp_size=8.0)
    assert config_fingerprint(whole_float, "/models/q", "0.5.9") == base
    assert len(base) == 12 and int(base, 16) >= 0


@pytest.mark.parametrize(
    "change",
    [
        {"tp_size": 4},
        {"moe_runner_backend": "cutlass"},
        {"fp4_gemm_runner_backend": "flashinfer_cutlass"},
        {"speculative_algorithm": None},
        {"speculative_num_steps": 2},
        {"disable_custom_all_reduce": False},
        {"mem_fraction_static": 0.8},
        {"enable_mscclpp": True},
        {"new_flag_from_a_future_version": 1},
    ],
)
def test_fingerprint_changes_with_real_config_changes(change: dict[str, Any]) -> None:
    base = config_fingerprint(_args(), "/models/q", "0.5.9")
    assert config_fingerprint({**_args(), **change}, "/models/q", "0.5.9") != base


def test_fingerprint_includes_model_and_version() -> None:
    base = config_fingerprint(_args(), "/models/q", "0.5.9")
    assert config_fingerprint(_args(), "/models/other", "0.5.9") != base
    assert config_fingerprint(_args(), "/models/q", "0.5.10") != base


def test_dropped_keys_are_documented() -> None:
    assert all(reason for reason in FINGERPRINT_DROPPED_KEYS.values())
    assert {"port", "host", "api_key", "random_seed", "log_level"} <= set(FINGERPRINT_DROPPED_KEYS)
    assert "tp_size" not in FINGERPRINT_DROPPED_KEYS and "moe_runner_backend" not in FINGERPRINT_DROPPED_KEYS


def test_instance_id() -> None:
    assert instance_id("gpu-1", 12345, 987654) == "gpu-1:12345:987654"
    assert instance_id("gpu-1", 12345, 987654) != instance_id("gpu-1", 12345, 987655)


def test_describe_config() -> None:
    nextn = {
        "moe_runner_backend": "flashinfer_cutlass",
        "fp4_gemm_runner_backend": "flashinfer_cudnn",
        "speculative_algorithm": "NEXTN",
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4,
        "tp_size": 8,
        "disable_custom_all_reduce": True,
    }
    assert describe_config(nextn) == "flashinfer_cutlass MoE, flashinfer_cudnn FP4, NEXTN 3/1/4, TP8, custom AR off"
    baseline = {
        "moe_runner_backend": "cutlass",
        "tp_size": 4,
        "quantization": "fp8",
        "fp4_gemm_runner_backend": "flashinfer_cutlass",
        "disable_custom_all_reduce": False,
        "disable_overlap_schedule": True,
        "ep_size": 4,
    }
    # Not an FP4 model: no FP4 backend shown; custom AR never claimed "on".
    assert describe_config(baseline) == "cutlass MoE, no spec, TP4, EP4, overlap off"
    assert describe_config(parse_server_info(SERVER_INFO_0523).args) == (
        "flashinfer_cutlass MoE, flashinfer_cutlass FP4, no spec, TP4"
    )


def test_diff_requested_with_nextn_equivalence() -> None:
    observed = _args()
    requested = requested_args({"--speculative-algorithm": "NEXTN", "--tp": "8", "--moe-runner-backend": "cutlass"})
    diffs = diff_requested(requested, observed)
    assert [(d.arg, d.requested, d.observed) for d in diffs] == [
        ("moe_runner_backend", "cutlass", "flashinfer_cutlass")
    ]
    notes = compare_requested(requested, observed).notes
    assert len(notes) == 1 and "NEXTN" in notes[0]


def test_parse_nvidia_smi() -> None:
    text = SMI_CSV + "2, Weird, Name, With Commas, 1, 2, 3, 9.0\nnot a row\n\n"
    gpus = parse_nvidia_smi(text)
    assert [g.index for g in gpus] == [0, 1, 2]
    assert gpus[0] == GpuInfo(0, "NVIDIA RTX PRO 6000 Blackwell Server Edition", 90112, 97887, 35, "12.0")
    assert gpus[1].utilization_pct is None and gpus[1].memory_total_mib == 97887
    assert gpus[2].name == "Weird, Name, With Commas" and gpus[2].compute_cap == "9.0"


def test_preset_words_for() -> None:
    presets = {
        "nextn": Preset(name="nextn", flags=(("--speculative-algorithm", "NEXTN"), ("--speculative-num-steps", "3"))),
        "cudnn": Preset(name="cudnn", flags=(("--fp4-gemm-backend", "flashinfer_cudnn"),)),
        "trtllm": Preset(name="trtllm", flags=(("--moe-runner-backend", "flashinfer_trtllm"),)),
        "noar": {"--disable-custom-all-reduce": True},
        "empty": Preset(name="empty", remove=("--x",)),
    }
    assert preset_words_for(_args(), presets) == ["cudnn", "nextn", "noar"]


def test_from_dict_rejects_other_schemas() -> None:
    rc = RunningConfig(host="h", port=1, observed_at=1.0, state="none")
    data = rc.to_dict()
    with pytest.raises(BenchbotError, match="schema"):
        RunningConfig.from_dict({**data, "schema": 2})
    with pytest.raises(BenchbotError, match="malformed"):
        RunningConfig.from_dict({"schema": 1, "host": "h"})


# ---------------------------------------------------------------------------------------------------------
# Against the real simulator process, through the LocalTransport (launch -> ready -> smoke -> observe)
# ---------------------------------------------------------------------------------------------------------

SIM_MODEL = "/models/Qwen3.5-397B-A17B-NVFP4"
REPO = str(Path(__file__).resolve().parents[1])


class SimRun:
    """One detached simulator process plus the readiness callables a launch job would build."""

    def __init__(self, transport: LocalTransport, tmp: Path, flags: list[str], port: int) -> None:
        self.t = transport
        self.tmp = tmp
        self.port = port
        self.argv = [
            sys.executable,
            "-m",
            "workers.sim.sglang",
            "--model-path",
            SIM_MODEL,
            *flags,
            "--port",
            str(port),
            "--sim-startup-s",
            "0",
            "--sim-state-dir",
            str(tmp / "sim-state"),
        ]
        self.proc: Any = None
        self.offset = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> SimRun:
        self.fence = HostFence.for_port(str(self.tmp), self.port, 1)
        await self.t.claim_host(self.fence)
        self.proc = await self.t.spawn_engine(self.argv, log_path=str(self.tmp / "sim.log"), cwd=REPO, fence=self.fence)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.t.signal_process(self.proc.pid, self.proc.start_ticks, "TERM", group=True, fence=self.fence)
        try:
            await async_wait_until(lambda: self._gone(), timeout=10, what="the simulator to stop")
        finally:
            await self.t.signal_process(self.proc.pid, self.proc.start_ticks, "KILL", group=True, fence=self.fence)

    async def _gone(self) -> bool:
        return not await self.t.is_alive(self.proc.pid)

    async def is_alive(self) -> bool:
        return await self.t.is_alive(self.proc.pid)

    async def read_new_log(self) -> str:
        text, self.offset = await self.t.read_log(str(self.tmp / "sim.log"), self.offset)
        return text

    async def wait_ready(self, api_key: str | None = None) -> ReadyResult | Diagnosis:
        return await wait_ready(
            self.base_url,
            deadline_s=30,
            is_alive=self.is_alive,
            read_new_log=self.read_new_log,
            api_key=api_key,
            poll_s=0.1,
        )


NEXTN_FLAGS = [
    "--tp",
    "8",
    "--quantization",
    "modelopt_fp4",
    "--moe-runner-backend",
    "flashinfer_cutlass",
    "--fp4-gemm-backend",
    "flashinfer_cudnn",
    "--speculative-algorithm",
    "NEXTN",
    "--mamba-scheduler-strategy",
    "extra_buffer",
    "--disable-custom-all-reduce",
]


def test_sim_launch_ready_smoke_and_observe(tmp_path: Path) -> None:
    """The seed's story end to end: a NEXTN server is observed as NEXTN (EAGLE), never as "baseline"."""
    port = free_port()

    async def main() -> tuple[Any, ...]:
        t = LocalTransport()
        async with SimRun(t, tmp_path, [*NEXTN_FLAGS, "--api-key", "sk-int"], port) as sim:
            ready = await sim.wait_ready(api_key="sk-int")
            smoke = await smoke_test(sim.base_url, api_key="sk-int")
            smi = [
                "env",
                f"BENCHBOT_SIM_STATE_DIR={tmp_path / 'sim-state'}",
                sys.executable,
                "-m",
                "workers.sim.nvidia_smi",
            ]
            rc = await observe(t, host_name="sim-1", port=port, api_key="sk-int", nvidia_smi=smi, timeout_s=10)
            return ready, smoke, rc, sim.proc

    ready, smoke, rc, proc = asyncio.run(main())
    assert isinstance(ready, ReadyResult)
    assert smoke.ok and smoke.completion_tokens and smoke.completion_tokens > 0, smoke
    assert rc.state == "running" and rc.process is not None
    assert rc.process.pid == proc.pid and rc.instance_id == instance_id("sim-1", proc.pid, proc.start_ticks)
    assert rc.server is not None and rc.server.args["speculative_algorithm"] == "EAGLE"
    assert "EAGLE 3/1/4" in rc.summary and "TP8" in rc.summary and "custom AR off" in rc.summary
    assert "sk-int" not in json.dumps(rc.to_dict())
    assert len(rc.gpus) == 8 and all(g.compute_cap == "12.0" for g in rc.gpus), rc.gpus
    assert all((g.memory_used_mib or 0) > 10_000 for g in rc.gpus)  # the sim's TP8 weights are on all 8
    requested = requested_args(dict(parse_argv(NEXTN_FLAGS)))
    comparison = compare_requested(requested, rc.server.args)
    assert comparison.diffs == [] and any("NEXTN" in n for n in comparison.notes)
    assert [d.arg for d in diff_requested({"speculative_algorithm": None}, rc.server.args)] == [
        "speculative_algorithm"
    ]  # a "baseline" request would be refused against this server


@pytest.mark.parametrize(
    ("flags", "category"),
    [
        (["--tp", "8", "--fp4-gemm-backend", "flashinfer_trtllm", "--quantization", "modelopt_fp4"], "unsupported_gpu"),
        # (0.5.9 only warns for NEXTN + no_buffer: it turns the radix cache off; this one it refuses)
        (
            [
                "--tp",
                "8",
                "--speculative-algorithm",
                "NEXTN",
                "--mamba-scheduler-strategy",
                "extra_buffer",
                "--mamba-track-interval",
                "2",
                "--speculative-num-steps",
                "3",
                "--speculative-eagle-topk",
                "1",
                "--speculative-num-draft-tokens",
                "4",
            ],
            "config_error",
        ),
        (["--tp", "8", "--moe-runner-backend", "flashinfer_trtllm"], "unsupported_gpu"),
    ],
)
def test_sim_failed_start_is_diagnosed_at_once(tmp_path: Path, flags: list[str], category: str) -> None:
    async def main() -> tuple[ReadyResult | Diagnosis, float]:
        async with SimRun(LocalTransport(), tmp_path, flags, free_port()) as sim:
            start = time.monotonic()
            return await sim.wait_ready(), time.monotonic() - start

    result, elapsed = asyncio.run(main())
    assert isinstance(result, Diagnosis), result
    assert result.category == category, result
    assert elapsed < 15  # long before the 30 s deadline


def test_sim_port_in_use_is_diagnosed(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]

        async def main() -> ReadyResult | Diagnosis:
            async with SimRun(LocalTransport(), tmp_path, ["--tp", "8"], port) as sim:
                return await sim.wait_ready()

        result = asyncio.run(main())
    assert isinstance(result, Diagnosis) and result.category == "port_in_use", result


def test_sim_garbage_output_fails_the_smoke_test(tmp_path: Path) -> None:
    async def main() -> Any:
        async with SimRun(
            LocalTransport(), tmp_path, ["--tp", "8", "--moe-runner-backend", "flashinfer_cutedsl"], free_port()
        ) as sim:
            assert isinstance(await sim.wait_ready(), ReadyResult)
            return await smoke_test(sim.base_url)

    smoke = asyncio.run(main())
    assert not smoke.ok and smoke.completion_tokens == 16
    assert smoke.reason == is_garbage(smoke.text)
