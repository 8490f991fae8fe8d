"""``REDIS_URL`` naming a Redis Sentinel set: parse it and build a client that follows failovers.

redis-py parses ``redis://``, ``rediss://`` and ``unix://`` URLs and handles Sentinel discovery
(:class:`redis.sentinel.Sentinel`), but it has no URL form for a Sentinel set. benchbot accepts the
form documented by the ``Redis-Sentinel-Url`` package and used the same way by RedisVL and Prefect::

    redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service_name[/db][?option=value&...]

* ``host:port`` pairs are the *sentinels* (port 26379 when left out), comma-separated.
* ``service_name`` is the monitored master's name (``sentinel monitor <name> ...``); ``db`` the
  database number (default 0).
* The user info authenticates to the *data* nodes (primary and replicas), as it does in a
  ``redis://`` URL. Sentinels that need a password of their own get ``sentinel_password=`` (and
  ``sentinel_username=``) as options.
* Other options: ``socket_timeout`` and ``socket_connect_timeout`` (seconds, both for the data
  nodes and the sentinels). Anything else is refused: a typo must not silently mean "default".

Why a client from ``Sentinel.master_for``: its pool asks the sentinels for the primary's address on
every new connection and drops connections to a demoted one, so bot, workers and RQ (which take the
client object) follow a failover without restarting. Passwords live only in the URL (from the
environment) and in the client; :func:`redact` is what any message shows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote

import redis
from redis.sentinel import Sentinel

from workers.errors import BenchbotError

SCHEME = "redis+sentinel"
DEFAULT_SENTINEL_PORT = 26379
_OPTIONS = frozenset({"socket_timeout", "socket_connect_timeout", "sentinel_username", "sentinel_password"})
_SERVICE_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_HOST_RE = re.compile(r"^[A-Za-z0-9._-]{1,253}$")


@dataclass(frozen=True)
class SentinelUrl:
    """What a ``redis+sentinel://`` URL says. Secrets are left out of ``repr`` so a log line never shows them."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    sentinel_username: str | None = None
    sentinel_password: str | None = field(default=None, repr=False)
    socket_timeout: float | None = None
    socket_connect_timeout: float | None = None


def is_sentinel_url(url: str) -> bool:
    """True when ``url`` names a Sentinel set (only the scheme is looked at, case-insensitively)."""
    return url.split("://", 1)[0].lower() == SCHEME if "://" in url else False


def redact(url: str) -> str:
    """``url`` with any password replaced by ``***`` (user info and ``*password=`` options)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    if "@" in rest.split("/", 1)[0]:
        userinfo, _, after = rest.partition("@")
        user = userinfo.split(":", 1)[0]
        rest = f"{user}:***@{after}" if ":" in userinfo else f"***@{after}"
    rest = re.sub(r"((?:^|[?&])[a-z_]*password=)[^&]*", r"\1***", rest)
    return f"{scheme}{sep}{rest}"


def _bad(url: str, why: str) -> BenchbotError:
    form = f"{SCHEME}://[:password@]host[:port][,host[:port]...]/service_name[/db]"
    return BenchbotError(f"REDIS_URL {redact(url)!r} is not a Sentinel URL benchbot understands: {why} (form: {form})")


def _seconds(url: str, name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= 3600:
        raise _bad(url, f"{name} must be a number of seconds above 0 and at most 3600, not {raw!r}")
    return value


def _sentinel_address(url: str, part: str) -> tuple[str, int]:
    host, sep, port_text = part.rpartition(":") if ":" in part else (part, "", "")
    if not sep:
        host, port_text = part, str(DEFAULT_SENTINEL_PORT)
    if not _HOST_RE.match(host):
        raise _bad(url, f"sentinel host {host!r} is not a host name or IPv4 address")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise _bad(url, f"sentinel port {port_text!r} is not a port number")
    return host, int(port_text)


def parse(url: str) -> SentinelUrl:
    """Parse a ``redis+sentinel://`` URL; a clear :class:`BenchbotError` (password redacted) when it is wrong."""
    if not is_sentinel_url(url):
        raise _bad(url, f"the scheme must be {SCHEME}://")
    rest = url.split("://", 1)[1]
    rest, _, query = rest.partition("?")
    rest, _, fragment = rest.partition("#")
    if fragment:
        raise _bad(url, "a '#' part means nothing here")
    netloc, _, path = rest.partition("/")
    username: str | None = None
    password: str | None = None
    if "@" in netloc:
        userinfo, _, netloc = netloc.rpartition("@")
        user_text, has_password, password_text = userinfo.partition(":")
        username = unquote(user_text) or None
        password = unquote(password_text) if has_password else None
        if not has_password:  # redis:// treats a lone user info as the password
            username, password = None, unquote(user_text) or None
    if not netloc:
        raise _bad(url, "no sentinel host:port")
    sentinels = tuple(_sentinel_address(url, part) for part in netloc.split(","))
    pieces = [p for p in path.split("/") if p] if path else []
    if not pieces:
        raise _bad(url, "no service name (the master name the sentinels monitor)")
    if len(pieces) > 2:
        raise _bad(url, "the path is /service_name or /service_name/db")
    service = unquote(pieces[0])
    if not _SERVICE_RE.match(service):
        raise _bad(url, f"service name {service!r} must be 1-64 letters, digits, '.', '_' or '-'")
    db = 0
    if len(pieces) == 2:
        if not pieces[1].isdigit() or int(pieces[1]) > 15:
            raise _bad(url, f"db {pieces[1]!r} must be a number from 0 to 15")
        db = int(pieces[1])
    options: dict[str, str] = {}
    for name, value in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        if name not in _OPTIONS:
            raise _bad(url, f"unknown option {name!r} (known: {', '.join(sorted(_OPTIONS))})")
        options[name] = value
    return SentinelUrl(
        sentinels=sentinels,
        service=service,
        db=db,
        username=username,
        password=password,
        sentinel_username=options.get("sentinel_username") or None,
        sentinel_password=options.get("sentinel_password") or None,
        socket_timeout=_seconds(url, "socket_timeout", options["socket_timeout"])
        if "socket_timeout" in options
        else None,
        socket_connect_timeout=(
            _seconds(url, "socket_connect_timeout", options["socket_connect_timeout"])
            if "socket_connect_timeout" in options
            else None
        ),
    )


def master_client(
    spec: SentinelUrl,
    *,
    decode_responses: bool = False,
    socket_timeout: float | None = None,
    socket_connect_timeout: float | None = None,
) -> redis.Redis:
    """A client on the service's current primary that re-asks the sentinels after a failover.

    Timeouts given here win over the URL's (a caller such as the observer needs its own). A sentinel
    that does not answer is skipped for the next one; a primary nobody knows is a ``ConnectionError``
    (``MasterNotFoundError``), which benchbot's outage handling waits out like a Redis restart.
    """
    timeout = socket_timeout if socket_timeout is not None else spec.socket_timeout
    connect_timeout = socket_connect_timeout if socket_connect_timeout is not None else spec.socket_connect_timeout
    sentinel_kwargs: dict[str, object] = {
        "socket_timeout": timeout or 2.0,
        "socket_connect_timeout": connect_timeout or 2.0,
    }
    if spec.sentinel_password is not None:
        sentinel_kwargs["password"] = spec.sentinel_password
    if spec.sentinel_username is not None:
        sentinel_kwargs["username"] = spec.sentinel_username
    sentinel = Sentinel(list(spec.sentinels), sentinel_kwargs=sentinel_kwargs)
    client: redis.Redis = sentinel.master_for(
        spec.service,
        db=spec.db,
        username=spec.username,
        password=spec.password,
        decode_responses=decode_responses,
        socket_timeout=timeout,
        socket_connect_timeout=connect_timeout,
    )
    return client
