"""workers.engines.probe: the host's SGLang version and its real options, learnt from the host itself.

A fake ``sglang`` package (real files on disk, with package metadata) stands in for an installed SGLang
of a version nobody recorded; the probes run through the real LocalTransport as they would over SSH.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
import redis

from workers.engines.probe import (
    engine_facts,
    is_simulator,
    last_probed_version,
    parse_version_output,
    probe_version,
    version_argv,
)
from workers.engines.sglang.probe import VERSION_SCRIPT, dump_argv
from workers.host.local import LocalTransport

SERVER_ARGS = """
import argparse, dataclasses

@dataclasses.dataclass
class ServerArgs:
    model_path: str = ""
    port: int = 30000
    tp_size: int = 1
    moe_runner_backend: str = "auto"

    @staticmethod
    def add_cli_args(parser):
        parser.add_argument("--model-path", "--model", dest="model_path", required=True)
        parser.add_argument("--port", type=int, default=30000)
        parser.add_argument("--tp-size", type=int, default=1)
        parser.add_argument("--moe-runner-backend", choices=["auto", "triton", "brand_new"], default="auto")
        parser.add_argument("--enable-new-thing", action="store_true")
"""


@pytest.fixture
def fake_sglang(tmp_path: Path) -> LocalTransport:
    """A host whose python has SGLang 0.5.99 installed (package files + dist-info metadata)."""
    pkg = tmp_path / "site" / "sglang"
    (pkg / "srt").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "srt" / "__init__.py").write_text("")
    (pkg / "srt" / "server_args.py").write_text(SERVER_ARGS)
    (pkg / "version.py").write_text("__version__ = '0.5.99'\n")
    meta = tmp_path / "site" / "sglang-0.5.99.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.99\n")
    return LocalTransport(env={"PYTHONPATH": str(tmp_path / "site")})


REAL = [sys.executable, "-m", "sglang.launch_server"]

#: The console script pip writes for SGLang (``sglang = sglang.cli.main:main``), shebang and all.
CONSOLE_SCRIPT = "#!{python}\nimport sys\nfrom sglang.cli.main import main\nsys.exit(main())\n"
#: A stand-in of ``sglang/cli/main.py``: ``sglang version`` prints what the real one prints.
CLI_MAIN = (
    "import sys\n"
    "def main():\n"
    "    if sys.argv[1:2] == ['version']:\n"
    "        from sglang.version import __version__\n"
    "        print(f'sglang version: {__version__}')\n"
    "        print('git revision: N/A')\n"
    "        return 0\n"
    "    return 2\n"
)


@pytest.fixture
def sglang_script(tmp_path: Path, fake_sglang: LocalTransport) -> Path:
    """``venv/bin/sglang``: the console script of the fake SGLang 0.5.99 (found through the host's PYTHONPATH)."""
    cli = tmp_path / "site" / "sglang" / "cli"
    cli.mkdir()
    (cli / "__init__.py").write_text("")
    (cli / "main.py").write_text(CLI_MAIN)
    script = tmp_path / "venv" / "bin" / "sglang"
    script.parent.mkdir(parents=True)
    script.write_text(CONSOLE_SCRIPT.format(python=sys.executable))
    script.chmod(0o755)
    return script


def test_a_sglang_serve_command_is_asked_for_its_version_in_each_shape() -> None:
    # the bare console script: SGLang's own `sglang version`; a named interpreter: its package metadata
    assert version_argv(["/venv/bin/sglang", "serve"]) == ["/venv/bin/sglang", "version"]
    assert version_argv(["/venv/bin/python3", "/venv/bin/sglang", "serve"]) == [
        "/venv/bin/python3",
        "-c",
        VERSION_SCRIPT,
    ]
    assert version_argv(["python3", "-I", "/venv/bin/sglang", "serve"])[:3] == ["python3", "-I", "-c"]
    assert version_argv(["python3", "-m", "sglang.cli.main", "serve"]) == ["python3", "-c", VERSION_SCRIPT]
    assert version_argv(["/venv/bin/sglang", "generate"]) is None  # not a server: nothing to ask
    assert dump_argv(["/venv/bin/python3", "/venv/bin/sglang", "serve"])[:2] == ["/venv/bin/python3", "-c"]
    assert dump_argv(["/venv/bin/sglang", "serve"]) is None  # its interpreter is only in its shebang
    assert parse_version_output("sglang version: 0.5.23\ngit revision: N/A\n") == "0.5.23"


def test_a_sglang_serve_host_learns_its_version_and_options(
    sglang_script: Path, fake_sglang: LocalTransport, redis_client: redis.Redis
) -> None:
    assert asyncio.run(probe_version(fake_sglang, [str(sglang_script), "serve"])) == "0.5.99"
    named = [sys.executable, str(sglang_script), "serve"]
    facts = asyncio.run(engine_facts(redis_client, fake_sglang, "gpu-1", named))
    assert facts.version == "0.5.99" and facts.source == "host" and facts.contract is not None
    assert facts.contract.resolve("--moe-runner-backend").ok


def test_how_each_engine_command_is_asked_for_its_version() -> None:
    assert version_argv(["python3", "-m", "sglang.launch_server"])[:2] == ["python3", "-c"]
    assert version_argv(["/v/bin/python", "-X", "dev", "-m", "sglang.launch_server"])[:3] == [
        "/v/bin/python",
        "-X",
        "dev",
    ]
    assert version_argv(["python3", "-m", "workers.sim.sglang"]) == ["python3", "-m", "workers.sim.sglang", "--version"]
    assert is_simulator(["benchbot", "sim", "sglang"]) and not is_simulator(REAL)
    assert version_argv(["/opt/wrapper.sh"]) is None
    assert version_argv(["/opt/wrapper.sh"], ["/opt/wrapper.sh", "--print-version"]) == [
        "/opt/wrapper.sh",
        "--print-version",
    ]
    assert dump_argv(["python3", "-m", "workers.sim.sglang"]) is None


def test_version_output_is_read_leniently() -> None:
    assert parse_version_output("WARNING: something\n0.5.23\n") == "0.5.23"
    assert parse_version_output("v0.5.10.post1\n") == "0.5.10.post1"
    assert parse_version_output("no version here") is None


def test_the_installed_version_is_read_from_package_metadata(fake_sglang: LocalTransport) -> None:
    assert asyncio.run(probe_version(fake_sglang, REAL)) == "0.5.99"


def test_an_unrecorded_version_is_dumped_from_the_host_once_and_cached(
    fake_sglang: LocalTransport, redis_client: redis.Redis
) -> None:
    facts = asyncio.run(engine_facts(redis_client, fake_sglang, "gpu-1", REAL))
    assert facts.version == "0.5.99" and facts.source == "host" and facts.contract is not None
    c = facts.contract
    assert c.resolve("--moe-runner-backend").ok and c.problem("--moe-runner-backend", "brand_new") is None
    assert c.problem("--mamba-scheduler-strategy", "x") is not None  # not in this SGLang
    assert c.resolve("--model").flag == "--model" and c.server_arg("--tp-size") == "tp_size"
    assert last_probed_version(redis_client, "gpu-1") == "0.5.99"
    again = asyncio.run(engine_facts(redis_client, fake_sglang, "gpu-2", REAL))
    assert again.source == "cached" and again.contract == c


def test_a_recorded_version_uses_the_recorded_contract(tmp_path: Path, redis_client: redis.Redis) -> None:
    meta = tmp_path / "sglang-0.5.9.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.9\n")
    transport = LocalTransport(env={"PYTHONPATH": str(tmp_path)})
    facts = asyncio.run(engine_facts(redis_client, transport, "gpu-1", REAL))
    assert facts.source == "recorded" and facts.contract is not None and facts.contract.version == "0.5.9"


def test_a_host_without_sglang_says_so(redis_client: redis.Redis) -> None:
    facts = asyncio.run(
        engine_facts(
            redis_client,
            LocalTransport(env={"PYTHONPATH": "/nonexistent"}),
            "gpu-1",
            ["python3", "-m", "sglang.launch_server"],
        )
    )
    assert facts.version is None and facts.contract is None and "could not learn" in facts.note


def test_the_probe_runs_with_the_engines_own_env_over_the_hosts(fake_sglang: LocalTransport, tmp_path: Path) -> None:
    # a host whose default python has no SGLang: only the engine's env (its PYTHONPATH) finds the install
    bare = LocalTransport(env={"PYTHONPATH": "/nonexistent"})
    assert asyncio.run(probe_version(bare, REAL)) is None
    assert asyncio.run(probe_version(bare, REAL, env={"PYTHONPATH": str(tmp_path / "site")})) == "0.5.99"
    # the simulator says the version it will imitate, which its env chooses
    sim = [sys.executable, "-m", "workers.sim.sglang"]
    assert asyncio.run(probe_version(bare, sim, env={"BENCHBOT_SIM_SGLANG_VERSION": "0.5.23"})) == "0.5.23"
