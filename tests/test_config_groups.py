"""``[groups.NAME]``: hosts that serve one model together; each mistake a one-sentence error naming the key and fix."""

from __future__ import annotations

import pytest

from workers.config import EMBEDDED_TOML, load_config, parse_config
from workers.config.schema import DEFAULT_RENDEZVOUS_PORT
from workers.errors import ConfigError

HOSTS = """
[engine]
flags = { "--tp-size" = 8 }
[hosts.gpu-b]
[hosts.gpu-a]
port = 30001
[hosts.gpu-c]
port = 30002
[hosts.v]
port = 30003
[hosts.v.engine]
kind = "vllm"
"""


def test_a_group_has_its_hosts_head_port_and_engine_over_the_heads() -> None:
    config = parse_config(
        HOSTS
        + '[groups.big]\nhosts = ["gpu-b", "gpu-a"]\nport = 5000\n'
        + '[groups.big.engine]\nflags = { "--tp-size" = 16, "--nnodes" = 2 }\n'
        + '[groups.other]\nhosts = ["gpu-a", "gpu-c"]\nhead = "gpu-c"\n'
    )
    big = config.groups["big"]
    assert big.hosts == ("gpu-b", "gpu-a") and big.head == "gpu-b" and big.port == 5000
    assert big.members == ("gpu-a", "gpu-b")  # the lease order: sorted, whatever the file's order
    assert big.engine.kind == "sglang" and dict(big.engine.flags) == {"--tp-size": "16", "--nnodes": "2"}
    assert dict(config.hosts["gpu-b"].engine.flags) == {"--tp-size": "8"}  # the hosts' own engines are untouched
    other = config.groups["other"]
    assert other.head == "gpu-c" and other.port == DEFAULT_RENDEZVOUS_PORT
    assert other.engine == config.hosts["gpu-c"].engine  # no engine table: the head's engine
    assert config.hosts_named("big") == ("gpu-a", "gpu-b") and config.hosts_named("gpu-c") == ("gpu-c",)
    assert [g.name for g in config.groups_of("gpu-a")] == ["big", "other"] and config.groups_of("v") == ()


def test_the_embedded_default_has_a_pair_of_simulated_hosts(state_dir) -> None:
    for config in (parse_config(EMBEDDED_TOML), load_config()):
        pair = config.groups["pair"]
        assert pair.members == ("pair-a", "pair-b") and pair.head == "pair-a"
        assert all(config.hosts[h].engine.kind == "sglang" for h in pair.hosts)
        assert dict(pair.engine.flags)["--tp-size"] == "16"
    embedded = load_config()  # this user's own ports, kept in the state dir like the other simulated hosts'
    assert (state_dir / "pair-a-port").read_text().strip() == str(embedded.hosts["pair-a"].port)
    assert (state_dir / "pair-rendezvous-port").read_text().strip() == str(embedded.groups["pair"].port)


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        (
            '[groups.g]\nhosts = ["gpu-a", "gpu-z"]',
            r"groups\.g\.hosts\[1\]: 'gpu-z' is not one of the hosts .*add \[hosts\.gpu-z\]",
        ),
        (
            '[groups.gpu-a]\nhosts = ["gpu-b", "gpu-c"]',
            r"groups\.gpu-a: 'gpu-a' is also a host's name.*rename the group",
        ),
        (
            '[groups.g]\nhosts = ["gpu-a", "gpu-b"]\nhead = "gpu-c"',
            r"groups\.g\.head: 'gpu-c' is not one of the group's hosts",
        ),
        ('[groups.g]\nhosts = ["gpu-a"]', r"groups\.g\.hosts: a group needs at least two hosts"),
        ("[groups.g]\nport = 5000", r"groups\.g: a group names its hosts: add hosts = "),
        ('[groups.g]\nhosts = ["gpu-a", "gpu-a"]', r"groups\.g\.hosts\[1\]: 'gpu-a' is listed twice"),
        (
            '[groups.g]\nhosts = ["gpu-a", "v"]',
            r"groups\.g\.hosts\[1\]: 'v' runs vLLM but 'gpu-a' runs SGLang.*same engine kind",
        ),
        ('[groups.g]\nhosts = ["gpu-a", "gpu-b"]\nport = 0', r"groups\.g\.port: 0 is out of range 1\.\.65535"),
        ('[groups.g]\nhosts = ["gpu-a", "gpu-b"]\nport = "5000"', r"groups\.g\.port: expected an integer"),
        (
            '[groups.g]\nhosts = ["gpu-a", "gpu-b"]\nport = 30001',
            r"groups\.g\.port: 30001 is the engine port of the head 'gpu-a'",
        ),
        (
            '[groups.g]\nhosts = ["gpu-a", "gpu-b"]\nrank = 1',
            r"groups\.g\.rank: unknown key \(allowed: description, engine, head",
        ),
        (
            '[groups.g]\nhosts = ["gpu-a", "gpu-b"]\n[groups.g.engine]\nkind = "vllm"',
            r"groups\.g\.engine\.kind: 'vllm' is not",
        ),
        (
            '[groups.g]\nhosts = ["gpu-a", "gpu-b"]\n[groups.g.engine]\nflags = { tp = 16 }',
            r'groups\.g\.engine\.flags\."tp": engine flags look like',
        ),
        ('[groups.G]\nhosts = ["gpu-a", "gpu-b"]', r"groups\.G: group names are lower-case"),
        ('[groups.g]\nhosts = "gpu-a"', r"groups\.g\.hosts: expected a list of strings"),
    ],
)
def test_bad_groups_name_the_key_and_the_fix(table: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=r"^bb\.toml: " + expected):
        parse_config(HOSTS + table + "\n", "bb.toml")
