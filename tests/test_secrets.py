"""The one secret policy: every path that hides secrets hides the same ones, with the same marker.

Before ``workers/secrets.py`` there were two rulebooks (the engine's and the run history's) that
disagreed on names such as ``cookie`` and used two markers; the host-side log scrubber re-states the
hiding rule in stdlib Python, so it is run here against the policy.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys

import pytest

from tests.factories import make_run
from workers import secrets
from workers.engines.sglang.flags import redact_argv
from workers.engines.sglang.server_info import parse_server_info
from workers.host.actuator import SCRUBBER
from workers.host.command_text import describe_argv
from workers.results import store
from workers.secrets import LOG_PATTERNS, REDACTED

#: Every name either former rulebook called secret (run history's list, the engine's regex), plus ones
#: only one of them caught.
SECRET_NAMES = (
    "api_key", "apikey", "admin_api_key", "secret", "secret_key", "client_secret", "signing_secret",
    "password", "passwd", "ssl_keyfile_password", "pass", "token", "auth_token", "access_token",
    "refresh_token", "hf_token", "slack_token", "github_token", "bearer", "authorization",
    "credential", "credentials", "private_key", "access_key", "cookie",
)  # fmt: skip
NOT_SECRET_NAMES = ("output_tokens", "max_new_tokens", "tokenizer_path", "input_tokens", "keyframe", "tp_size")


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_the_former_rulebooks_hide_the_same_values(redis_client, name: str) -> None:
    """A value under a secret name is hidden by the engine side (server_info, argv, error messages) and
    by the run history alike, and reads as the same marker in both."""
    value = f"v4lue-of-{name.replace('_', '-')}"
    flag = "--" + name.replace("_", "-")
    # the engine side: what /server_info reported, a process's argv, an error message
    info = parse_server_info({"version": "0.5.9", "model_path": "/m", name: value})
    assert info.args[name] == REDACTED
    assert redact_argv(["python3", flag, value]) == ["python3", flag, REDACTED]
    assert redact_argv([f"{flag}={value}"]) == [f"{flag}={REDACTED}"]
    assert value not in describe_argv(["python3", flag, value], limit=1000)
    # the run history: the same names in a stored record's observed config and argv
    run = make_run("r1")
    config = json.loads(json.dumps(run.config))
    config["server"]["args"][name] = value
    config["process"]["argv"] += [flag, value]
    config["env"] = {name.upper(): value}
    store.save_run(redis_client, dataclasses.replace(run, config=config))
    assert value not in redis_client.get(store.run_key("r1")).decode()
    got = store.get_run(redis_client, "r1")
    assert got.config["server"]["args"][name] == info.args[name] == REDACTED
    assert got.config["process"]["argv"][-2:] == [flag, REDACTED]
    assert got.config["env"] == {name.upper(): REDACTED}


@pytest.mark.parametrize("name", NOT_SECRET_NAMES)
def test_ordinary_names_are_kept_everywhere(name: str) -> None:
    assert not secrets.is_secret_name(name)
    assert parse_server_info({"version": "0.5.9", "model_path": "/m", name: 7}).args[name] == 7
    assert secrets.redact({name: "7", "argv": ["--" + name.replace("_", "-"), "7"]}) == {
        name: "7",
        "argv": ["--" + name.replace("_", "-"), "7"],
    }


LOG_LINES = (
    "server_args=ServerArgs(model_path='/m', api_key='sk-123', admin_api_key=None, hf_token='hf_x', "
    'ssl_keyfile_password="pw", max_total_num_tokens=99)',
    "python3 -m sglang.launch_server --api-key sk-456 --hf-token=hf_y --tp 8 --max-new-tokens 5",
    "Authorization: Bearer tok.en-1",
    "posting with xoxb-1111-2222-abcdefghijkl and ghp_abcdefghijklmnopqrstuv and sk-abcdefghijklmnopqrstu",
    "the canary-known-value-1234 leaked, and a shorter canary-known too",
    "private_key: abc access_key=def client_secret='s' output_tokens=5 max_new_tokens: 6",
    "nothing secret here: tokenizer_path=/m api_key=None hf_token=''",
)
KNOWN = ["canary-known", "canary-known-value-1234"]


def run_host_scrubber(text: str, known: list[str]) -> str:
    """Run the actuator's log scrubber as the host runs it (its own ``python3 -I -c``, settings on an fd),
    with the settings a spawn request carries."""
    settings = json.dumps({"secrets": known, "patterns": list(LOG_PATTERNS), "replacement": REDACTED}).encode()
    read_fd, write_fd = os.pipe()
    os.write(write_fd, settings)
    os.close(write_fd)
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-c", SCRUBBER, "benchbot-log-scrubber", str(read_fd)],
            input=text.encode(),
            capture_output=True,
            pass_fds=(read_fd,),
            timeout=30,
            check=True,
        )
    finally:
        os.close(read_fd)
    return done.stdout.decode()


def test_the_host_log_scrubber_hides_exactly_what_the_policy_hides() -> None:
    """The actuator cannot import the policy (stdlib only, on the host): it gets the policy's patterns
    and marker with each spawn and must apply them as :func:`workers.secrets.redact_text` does."""
    text = "\n".join(LOG_LINES) + "\n"
    expected = secrets.redact_text(text, KNOWN)
    assert run_host_scrubber(text, KNOWN) == expected
    for secret in ("sk-123", "hf_x", "pw", "sk-456", "hf_y", "tok.en-1", "xoxb-1111", "ghp_abc", "canary", "abc"):
        assert secret not in expected, secret
    for kept in ("admin_api_key=None", "max_total_num_tokens=99", "--tp 8", "--max-new-tokens 5", "output_tokens=5"):
        assert kept in expected, kept
    assert "api_key='REDACTED'" in expected and 'ssl_keyfile_password="REDACTED"' in expected
    assert "hf_token=''" in expected and "api_key=None" in expected  # nothing to hide


def test_every_log_pattern_names_the_part_it_hides() -> None:
    """The scrubber hides group ``val`` (else the last group): every policy pattern must have ``val``."""
    for source in LOG_PATTERNS:
        assert "val" in re.compile(source).groupindex, source
