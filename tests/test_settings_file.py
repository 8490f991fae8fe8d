"""Settings an engine takes from a file only (``Engine.settings_file``), as generic code handles them (issue 21).

No endpoint reports such settings, so benchbot writes them into its private 0600 file, keeps that file while
the server runs (when it holds no secret), reads it back for the observation, and removes it when it stops
the server. Here on real processes through the local transport and asyncssh's server (the read crosses SSH
as a quoted argument); the engine that uses it end to end is TensorRT-LLM
(``tests/integration/test_trtllm_host.py``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sshd import AsyncsshServer, asyncssh_server
from tests.util import wait_until
from workers.config import EngineConfig
from workers.engines.interface import SETTINGS_UNREAD_ARG, SettingsFile
from workers.host import engine_env
from workers.host.engine_stop import stop_engine
from workers.host.local import LocalTransport
from workers.host.transport import HostFence, Transport, settings_file_name
from workers.observed_settings import MAX_SETTINGS_BYTES, read_back, settings_path
from workers.presets import LaunchSpec

PY = sys.executable
PORT = 4242


def _flat(text: str) -> dict[str, object]:
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return {f"cfg.{k}": v for k, v in data.items()}


#: An engine whose ``--cfg.*`` flags live in its settings file (``{"cfg": {...}}`` flattened back).
SETTINGS = SettingsFile(
    split=lambda flags, version: (
        [(f, v) for f, v in flags if not f.startswith("--cfg.")],
        {f.removeprefix("--cfg."): v for f, v in flags if f.startswith("--cfg.")},
    ),
    read=_flat,
    path_flags=("--config", "--other_config"),
)


def _spec(settings: dict[str, object]) -> LaunchSpec:
    return LaunchSpec("h", (), (), (), ("engine", "serve"), (), settings=settings)


@pytest.fixture(scope="module")
def asyncssh_srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AsyncsshServer]:
    with asyncssh_server(tmp_path_factory.mktemp("asyncssh")) as server:
        yield server


@pytest.fixture(params=["local", "asyncssh"])
def transport(request: pytest.FixtureRequest) -> Transport:
    if request.param == "local":
        return LocalTransport(name="box")
    return request.getfixturevalue("asyncssh_srv").transport()


# ---- which file, and whether it is kept ---------------------------------------------------------------------


def test_settings_without_a_secret_get_a_kept_file_of_their_own_and_argv_names_it(tmp_path: Path) -> None:
    fence = HostFence.for_port(str(tmp_path), PORT, 1)
    spec = _spec({"backend": "CUTLASS"})
    private = engine_env.private_options(EngineConfig(), spec)
    assert private is None
    assert engine_env.kept_settings(spec, private) == {"backend": "CUTLASS"}
    assert engine_env.engine_argv(spec, fence, private) == ["engine", "serve", "--config", fence.engine_settings_path]
    assert os.path.basename(fence.engine_settings_path) == settings_file_name(PORT) != fence.engine_config_path
    # nothing to write: argv as compiled
    assert engine_env.engine_argv(_spec({}), fence, None) == ["engine", "serve"]


def test_settings_beside_a_key_or_named_like_a_secret_share_the_keys_file_and_are_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fence = HostFence.for_port(str(tmp_path), PORT, 1)
    monkeypatch.setenv("BB_KEY", "sk-settings-key")
    keyed = EngineConfig(api_key_env="BB_KEY")
    spec = _spec({"backend": "CUTLASS"})
    private = engine_env.private_options(keyed, spec)
    assert private == {"backend": "CUTLASS", "api-key": "sk-settings-key"}
    assert engine_env.kept_settings(spec, private) is None
    assert engine_env.engine_argv(spec, fence, private)[-1] == fence.engine_config_path
    secretive = _spec({"hub": {"hf_token": "hf_x"}})
    assert engine_env.private_options(EngineConfig(), secretive) == {"hub": {"hf_token": "hf_x"}}
    assert engine_env.kept_settings(secretive, engine_env.private_options(EngineConfig(), secretive)) is None


def test_the_settings_path_is_the_last_one_argv_names() -> None:
    flags = SETTINGS.path_flags
    assert settings_path(["e", "--config", "/a", "--other_config=/b"], flags) == "/b"
    assert settings_path(["e", "--config=/a"], flags) == "/a"
    assert settings_path(["e", "--configx", "/a", "--config"], flags) is None


# ---- written, read back, removed with the server ---------------------------------------------------------------


def test_a_kept_settings_file_is_read_back_and_removed_when_the_engine_is_stopped(
    transport: Transport, tmp_path: Path
) -> None:
    # The engine reads its file at start and says so; the file must outlive that, and the stop.
    engine = "import sys, time; print(open(sys.argv[2]).read(), flush=True); time.sleep(300)"

    async def scenario() -> None:
        async with transport as t:
            fence = HostFence.for_port(str(tmp_path), PORT, 1)
            await t.claim_host(fence)
            spec = LaunchSpec("h", (), (), (), (PY, "-c", engine), (), settings={"backend": "CUTLASS", "n": 3})
            argv = engine_env.engine_argv(spec, fence, None)
            spawned = await t.spawn_engine(
                argv, log_path=str(tmp_path / "engine.log"), fence=fence, settings=engine_env.kept_settings(spec, None)
            )
            kept = Path(fence.engine_settings_path)
            try:
                await asyncio.to_thread(wait_until, lambda: "CUTLASS" in (tmp_path / "engine.log").read_text(), 10)
                assert oct(kept.stat().st_mode & 0o777) == "0o600"
                assert json.loads(kept.read_text()) == {"backend": "CUTLASS", "n": 3}
                assert "CUTLASS" in (tmp_path / "engine.log").read_text()  # not a secret: the log keeps it
                read = await read_back(t, SETTINGS, argv, PORT, str(tmp_path))
                assert read.unread == "" and read.settings == {"cfg.backend": "CUTLASS", "cfg.n": 3}
                assert read.fold({"tp": 8}) == {"tp": 8, "cfg.backend": "CUTLASS", "cfg.n": 3}
                await stop_engine(t, fence, spawned.pid, spawned.start_ticks, group=True, grace_s=5)
            finally:
                if _alive(spawned.pid):
                    os.killpg(spawned.pgid, signal.SIGKILL)
            assert not kept.exists()
            gone = await read_back(t, SETTINGS, argv, PORT, str(tmp_path))
            assert gone.unread == "gone" and gone.fold({"tp": 8}) == {"tp": 8, SETTINGS_UNREAD_ARG: "gone"}
            assert "could not be read back (gone)" in gone.detail

    asyncio.run(scenario())


def test_only_benchbots_own_file_is_read_and_only_in_its_format(transport: Transport, tmp_path: Path) -> None:
    theirs = tmp_path / "their.yaml"
    theirs.write_text('{"backend": "secret stuff"}')
    ours = tmp_path / settings_file_name(PORT)

    async def scenario() -> None:
        async with transport as t:
            other = await read_back(t, SETTINGS, ["e", "--config", str(theirs)], PORT, str(tmp_path))
            assert other.unread == "not benchbot's settings file, so not read" and other.settings == {}
            ours.write_text("backend: CUTLASS\n")  # YAML someone wrote: not the JSON benchbot writes
            assert (await read_back(t, SETTINGS, ["e", "--config", str(ours)], PORT, str(tmp_path))).unread == (
                "not in the format benchbot writes"
            )
            ours.write_text(json.dumps({"x": "y" * MAX_SETTINGS_BYTES}))
            assert (await read_back(t, SETTINGS, ["e", "--config", str(ours)], PORT, str(tmp_path))).unread == (
                "larger than benchbot writes"
            )
            # a file of benchbot's name in another folder (a stranger's server can name any path) is not read
            elsewhere = tmp_path / "elsewhere"
            elsewhere.mkdir()
            (elsewhere / settings_file_name(PORT)).write_text('{"backend": "TRTLLM"}')
            named = ["e", "--config", str(elsewhere / settings_file_name(PORT))]
            assert (await read_back(t, SETTINGS, named, PORT, str(tmp_path))).unread == (
                "not benchbot's settings file, so not read"
            )
            # a log_dir named with shell words crosses SSH as one quoted argument: read, nothing run
            odd = tmp_path / "a dir; $(echo x) `y`"
            odd.mkdir()
            (odd / settings_file_name(PORT)).write_text('{"backend": "TRTLLM"}')
            argv = ["e", "--other_config", str(odd / settings_file_name(PORT))]
            read = await read_back(t, SETTINGS, argv, PORT, str(odd))
            assert read.settings == {"cfg.backend": "TRTLLM"}
            # no settings file named: nothing to say
            assert (await read_back(t, SETTINGS, ["e", "--port", "1"], PORT, str(tmp_path))).path is None

    asyncio.run(scenario())


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_a_secret_named_setting_sharing_the_keys_file_is_scrubbed_from_the_log(tmp_path: Path) -> None:
    # it prints the value alone, as a careless engine might: only the scrubber's list can hide it
    engine = (
        "import json, sys, time; print('x', json.load(open(sys.argv[2]))['hub']['password'], flush=True); "
        "time.sleep(300)"
    )
    spec = LaunchSpec("h", (), (), (), (PY, "-c", engine), (), settings={"hub": {"password": "plain words 77"}})
    log = tmp_path / "engine.log"

    async def scenario() -> None:
        async with LocalTransport(name="box") as t:
            fence = HostFence.for_port(str(tmp_path), PORT, 1)
            await t.claim_host(fence)
            private = engine_env.private_options(EngineConfig(), spec)
            spawned = await t.spawn_engine(
                engine_env.engine_argv(spec, fence, private), log_path=str(log), fence=fence, private_options=private
            )
            try:
                await asyncio.to_thread(wait_until, lambda: "x " in log.read_text(), 10)
                assert Path(fence.engine_config_path).exists() and not Path(fence.engine_settings_path).exists()
            finally:
                os.killpg(spawned.pgid, signal.SIGKILL)

    asyncio.run(scenario())
    assert log.read_text() == "x REDACTED\n"
