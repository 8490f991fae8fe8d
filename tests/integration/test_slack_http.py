"""HTTP mode's front door under hostile requests, over raw sockets to the real server on 127.0.0.1.

The app is the real bolt app (``SlackHarness``) on a real Redis. Every request here is one Slack never
sends: a declared 64 MB or 10^12-byte body, a Content-Length that is missing, negative, not a number or
absurd, a chunked body, a header flood, a client that trickles its request, and signed or unsigned
bodies that are not what they claim. Each must get its status code (413 before the body is read, 400,
401 before anything is parsed, 408/closed), enqueue nothing, and leave no traceback in the log.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest
import redis

from bot.slack_standin import SIGNING_SECRET, SlackHarness, signed_headers
from tests.util import wait_until
from workers.config import EMBEDDED_TOML, parse_config
from workers.jobs import events, queue

HOST = "sim"


@pytest.fixture
def harness(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path, state_dir: Path, caplog: pytest.LogCaptureFixture
) -> Iterator[SlackHarness]:
    caplog.set_level(logging.DEBUG)
    with SlackHarness(parse_config(EMBEDDED_TOML, "test"), redis_url, tmp_path, notifier=False) as h:
        yield h


@pytest.fixture
def quick_deadline(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path, state_dir: Path, caplog: pytest.LogCaptureFixture
) -> Iterator[SlackHarness]:
    """The same server with a 1 s read deadline (10 s in production)."""
    caplog.set_level(logging.DEBUG)
    with SlackHarness(
        parse_config(EMBEDDED_TOML, "test"), redis_url, tmp_path, notifier=False, read_deadline_s=1.0
    ) as h:
        yield h


# --------------------------------------------------------------------------- raw HTTP


def head(h: SlackHarness, headers: dict[str, str], *, path: str = "/slack/events") -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{h.server.port}", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def read_response(sock: socket.socket, timeout: float = 5.0) -> tuple[int, dict[str, str], bytes]:
    """One HTTP response from ``sock`` (AssertionError if none arrives in time)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                raise AssertionError(f"the server closed the connection without an answer (got {data!r})")
            data += chunk
    except TimeoutError:
        raise AssertionError(f"no answer within {timeout} s (got {data!r})") from None
    top, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = top.decode("latin-1").split("\r\n")
    fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in header_lines)}
    length = int(fields.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(status_line.split()[1]), fields, body


def exchange(h: SlackHarness, data: bytes, timeout: float = 5.0) -> tuple[int, dict[str, str], bytes]:
    with socket.create_connection(("127.0.0.1", h.server.port), timeout=timeout) as sock:
        sock.sendall(data)
        return read_response(sock, timeout)


def signed(body: bytes, content_type: str = "application/x-www-form-urlencoded") -> dict[str, str]:
    """Slack's headers for ``body`` as sent (any bytes, UTF-8 or not), with its Content-Length."""
    ts = str(int(time.time()))
    digest = hmac.new(SIGNING_SECRET.encode(), b"v0:" + ts.encode() + b":" + body, hashlib.sha256).hexdigest()
    return {
        "Content-Type": content_type,
        "X-Slack-Request-Timestamp": ts,
        "X-Slack-Signature": f"v0={digest}",
        "Content-Length": str(len(body)),
    }


def assert_nothing_happened(
    r: redis.Redis, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    assert queue.list_jobs(r, HOST) == []
    assert r.xlen(events.GLOBAL_STREAM) == 0
    assert "Traceback" not in caplog.text
    assert not [rec for rec in caplog.records if rec.exc_info], [rec.getMessage() for rec in caplog.records]
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR], caplog.text
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception occurred during processing" not in err, err


def assert_still_serves(h: SlackHarness, r: redis.Redis) -> None:
    """A real signed /launch is accepted and queued: the refusals above were not a dead server."""
    assert h.command("/launch", "cutlass cudnn").status == 200
    wait_until(lambda: len(queue.list_jobs(r, HOST)) == 1, what="the accepted launch to be queued")


# --------------------------------------------------------------------------- framing: before the body


def test_a_declared_64mb_body_is_refused_413_before_a_byte_of_it_is_sent(
    harness: SlackHarness,
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    body_len = 64 * 1024 * 1024
    with socket.create_connection(("127.0.0.1", harness.server.port), timeout=5) as sock:
        sock.sendall(head(harness, {**signed_headers("x"), "Content-Length": str(body_len)}))
        # not one byte of the body sent: an answer now proves the server did not wait to read it
        status, fields, text = read_response(sock, timeout=3)
        assert status == 413 and b"too large" in text
        assert fields.get("connection") == "close"
        sock.settimeout(3)
        assert sock.recv(1) == b""  # and it hung up rather than read the rest
    assert_nothing_happened(redis_client, caplog, capfd)
    assert_still_serves(harness, redis_client)


@pytest.mark.parametrize(
    ("length_headers", "status"),
    [
        ({"Content-Length": str(10**12)}, 413),
        ({"Content-Length": "abc"}, 400),
        ({"Content-Length": "-5"}, 400),
        ({"Content-Length": "1e3"}, 400),
        ({"Content-Length": " "}, 400),
        ({"Content-Length": "9" * 40}, 400),  # absurd: not a length any client means
        ({}, 400),  # missing
        ({"Transfer-Encoding": "chunked"}, 400),
        ({"Transfer-Encoding": "chunked", "Content-Length": "5"}, 400),
    ],
    ids=["1e12", "abc", "negative", "float", "blank", "absurd", "missing", "chunked", "chunked+length"],
)
def test_a_bad_content_length_or_a_chunked_body_is_refused_without_reading(
    harness: SlackHarness,
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
    length_headers: dict[str, str],
    status: int,
) -> None:
    body = harness.command_body("/launch", "cutlass cudnn").encode()
    headers = {k: v for k, v in signed(body).items() if k != "Content-Length"} | length_headers
    got, _, text = exchange(harness, head(harness, headers))  # the body is never sent: no read may wait for it
    assert got == status, text
    assert text.strip() and b"Traceback" not in text
    assert_nothing_happened(redis_client, caplog, capfd)


def test_expect_100_continue_gets_the_refusal_instead_of_continue(
    harness: SlackHarness,
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    headers = {**signed_headers("x"), "Content-Length": str(10**9), "Expect": "100-continue"}
    status, _, _ = exchange(harness, head(harness, headers))
    assert status == 413  # a "100 Continue" would have invited the gigabyte
    assert_nothing_happened(redis_client, caplog, capfd)


# --------------------------------------------------------------------------- signature first, then shape


@pytest.mark.parametrize(
    "body",
    [
        b"payload=%7Bbroken",  # payload that is not JSON
        b"payload=" + json.dumps([1, 2]).encode(),  # JSON, not an object
        b'{"command": ',  # a JSON body cut short
        b"\xff\xfe command=/launch",  # not UTF-8
        b"payload=" + b"%5B" * 5000,  # nested deeper than the parser goes
    ],
    ids=["payload-not-json", "payload-list", "json-cut", "not-utf8", "deep"],
)
def test_a_signed_request_with_a_malformed_body_is_a_400_with_a_short_text(
    harness: SlackHarness,
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
    body: bytes,
) -> None:
    status, _, text = exchange(harness, head(harness, signed(body)) + body)
    assert status == 400, text
    assert 0 < len(text) < 200 and b"Traceback" not in text
    assert_nothing_happened(redis_client, caplog, capfd)
    assert_still_serves(harness, redis_client)


def test_an_unsigned_or_wrongly_signed_malformed_body_is_401_not_400(
    harness: SlackHarness,
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    broken = b"payload=%7Bbroken"
    unsigned = {"Content-Type": "application/x-www-form-urlencoded", "Content-Length": str(len(broken))}
    assert exchange(harness, head(harness, unsigned) + broken)[0] == 401
    wrong = {**signed_headers(broken.decode(), secret="not-the-secret"), "Content-Length": str(len(broken))}
    assert exchange(harness, head(harness, wrong) + broken)[0] == 401
    garbage_ts = {**signed(broken), "X-Slack-Request-Timestamp": "soon"}
    assert exchange(harness, head(harness, garbage_ts) + broken)[0] == 401
    not_utf8 = b"\xff\xfe\xfd"
    assert exchange(harness, head(harness, {**unsigned, "Content-Length": "3"}) + not_utf8)[0] == 401
    assert_nothing_happened(redis_client, caplog, capfd)


def test_signed_payloads_with_odd_types_never_produce_a_500_or_a_traceback(
    harness: SlackHarness,
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    odd: list[dict[str, object]] = [
        {"type": "block_actions", "user": 5, "actions": "cancel_job"},
        {"type": "block_actions", "user": "U1", "channel": [], "actions": [5]},
        {
            "type": "block_actions",
            "user": {"id": 7},
            "actions": [{"action_id": "cancel_job", "value": 9}],
            "container": "x",
            "message": 3,
        },
        {"type": "block_actions", "actions": [{"action_id": "cancel_job"}], "response_url": 12},
        {"type": None, "team": 3, "enterprise": [], "is_enterprise_install": {}},
        {"command": "/launch", "trigger_id": 5, "user_id": [], "text": {}},
    ]
    for payload in odd:
        for body in (urlencode({"payload": json.dumps(payload)}).encode(), json.dumps(payload).encode()):
            ctype = "application/json" if body.startswith(b"{") else "application/x-www-form-urlencoded"
            status, _, text = exchange(harness, head(harness, signed(body, ctype)) + body)
            assert status in (200, 400, 404), (payload, status, text)
    # what the listeners handed off runs on bolt's pool: let it finish before reading the log
    harness.app._listener_runner.listener_executor.shutdown(wait=True)
    assert "Traceback" not in caplog.text and not [rec for rec in caplog.records if rec.exc_info], caplog.text
    assert queue.list_jobs(redis_client, HOST) == []
    assert "Traceback" not in capfd.readouterr().err


# --------------------------------------------------------------------------- headers and slow clients


def test_a_header_flood_and_over_long_lines_are_refused_and_the_server_keeps_serving(
    harness: SlackHarness,
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    flood = {f"X-Flood-{i}": "y" for i in range(200)}
    assert exchange(harness, head(harness, {**flood, "Content-Length": "0"}))[0] == 431
    long_line = {"X-Long": "z" * 70_000, "Content-Length": "0"}
    assert exchange(harness, head(harness, long_line))[0] == 431
    assert exchange(harness, head(harness, {"Content-Length": "0"}, path="/" + "p" * 70_000))[0] == 414
    assert_nothing_happened(redis_client, caplog, capfd)
    assert_still_serves(harness, redis_client)


def test_a_client_trickling_its_headers_or_body_is_cut_off_at_the_deadline(
    quick_deadline: SlackHarness,
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    h = quick_deadline
    body = h.command_body("/launch", "cutlass cudnn").encode()
    request = head(h, signed(body))
    # headers, one byte at a time, slower than the 1 s deadline allows for the whole request
    with socket.create_connection(("127.0.0.1", h.server.port), timeout=5) as sock:
        started = time.monotonic()
        answer = b""
        try:
            for byte in request:
                sock.sendall(bytes([byte]))
                time.sleep(0.05)
                if time.monotonic() - started > 4:
                    break
            sock.settimeout(2)
            answer = sock.recv(65536)
        except OSError:
            pass  # reset by the server: cut off, which is the point
        held = time.monotonic() - started
        assert held < 4, "a trickling client held its connection past the deadline"
        assert answer == b"" or answer.startswith((b"HTTP/1.1 408", b"HTTP/1.1 400")), answer
    # the body, declared complete but stalled after 10 bytes
    with socket.create_connection(("127.0.0.1", h.server.port), timeout=5) as sock:
        started = time.monotonic()
        sock.sendall(request + body[:10])
        status, _, _ = read_response(sock, timeout=4)
        assert status == 408 and time.monotonic() - started < 3
    # an idle keep-alive connection is closed too, and meanwhile others were served
    with socket.create_connection(("127.0.0.1", h.server.port), timeout=5) as idle:
        assert h.command("/help").status == 200
        idle.settimeout(4)
        assert idle.recv(1) == b""
    assert_nothing_happened(redis_client, caplog, capfd)


def test_the_body_cap_is_a_setting_and_a_bad_value_is_refused(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bot.slack_app import MAX_BODY_ENV, max_body_bytes
    from workers.errors import BenchbotError

    monkeypatch.delenv(MAX_BODY_ENV, raising=False)
    assert max_body_bytes() == 64 * 1024
    monkeypatch.setenv(MAX_BODY_ENV, "2048")
    assert max_body_bytes() == 2048
    for bad in ("lots", "-1", "100", str(10**12)):
        monkeypatch.setenv(MAX_BODY_ENV, bad)
        with pytest.raises(BenchbotError, match=MAX_BODY_ENV):
            max_body_bytes()
    with SlackHarness(
        parse_config(EMBEDDED_TOML, "test"), redis_url, tmp_path, notifier=False, max_body_bytes=2048
    ) as h:
        assert h.command("/help", "x" * 3000).status == 413
        assert h.command("/help", "x" * 1000).status == 200
