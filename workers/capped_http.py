"""httpx clients whose responses are size-capped, for the control calls that read an engine's answers.

Observation (``/server_info``), readiness (``/health``, the smoke generation), the accuracy check's
answers, ``/tokenize`` and ``/v1/models`` read a whole response into memory; a broken or hostile
engine that streams without end would grow the worker until it died (issue 25, item 3). Every such
client is made here: a transport that counts the body bytes as they arrive and raises
:class:`ResponseTooLarge` (an ``httpx.HTTPError``, so each caller's existing handling reports it) past
the cap. h11 already bounds the head (16 KiB); the caller's timeouts bound silence.

The cap counts wire bytes, and httpx undoes a ``Content-Encoding`` after them: ~1 MB of gzip on the wire is
~1 GiB in the worker (a decompression bomb, issue 39 round 4, item 3). So every request says
``Accept-Encoding: identity`` (no engine compresses unasked), and a response in any other encoding is
refused before a byte of it is decoded (:class:`UnaskedEncoding`): the bytes counted are the bytes kept.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx

#: Far above any control answer (SGLang's ``/server_info`` is ~20 KB, an eval answer a few KB).
CONTROL_MAX_BYTES = 16 * 2**20


class ResponseTooLarge(httpx.ReadError):
    """A response body went past its cap; the connection is dropped, nothing more is read."""


class UnaskedEncoding(httpx.ReadError):
    """The response came in a ``Content-Encoding`` benchbot did not ask for; nothing of it is decoded."""


#: What every control call accepts: the body as sent, never compressed.
ACCEPT_ENCODING = "identity"


def unasked_encoding(headers: Mapping[str, str]) -> str | None:
    """The response's ``Content-Encoding`` when it is one benchbot did not ask for (anything but identity)."""
    value = headers.get("content-encoding", "").strip().lower()
    return value if value and value != ACCEPT_ENCODING else None


class _CappedStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, max_bytes: int, request: httpx.Request) -> None:
        self._inner = inner
        self._max = max_bytes
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        got = 0
        async for chunk in self._inner:
            got += len(chunk)
            if got > self._max:
                raise ResponseTooLarge(
                    f"the answer of {self._request.url} went past {self._max} bytes and was cut off",
                    request=self._request,
                )
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class CappedTransport(httpx.AsyncBaseTransport):
    """httpx's own transport, with every response body capped at ``max_bytes``."""

    def __init__(self, max_bytes: int = CONTROL_MAX_BYTES, **kwargs: Any) -> None:
        self._inner = httpx.AsyncHTTPTransport(**kwargs)
        self.max_bytes = max_bytes

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        request.headers["Accept-Encoding"] = ACCEPT_ENCODING
        response = await self._inner.handle_async_request(request)
        assert isinstance(response.stream, httpx.AsyncByteStream)
        encoding = unasked_encoding(response.headers)
        if encoding is not None:
            await response.aclose()
            raise UnaskedEncoding(
                f"the answer of {request.url} came {encoding[:40]}-encoded, which benchbot did not ask for "
                "(it asks for identity): refused unread",
                request=request,
            )
        return httpx.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_CappedStream(response.stream, self.max_bytes, request),
            extensions=response.extensions,
            request=request,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


def capped_client(
    *, max_bytes: int = CONTROL_MAX_BYTES, limits: httpx.Limits | None = None, **kwargs: Any
) -> httpx.AsyncClient:
    """``httpx.AsyncClient(**kwargs)`` whose every response body is capped at ``max_bytes`` (``limits``:
    the connection pool's, given to the transport; no proxy from the environment is used)."""
    transport = CappedTransport(max_bytes, **({"limits": limits} if limits is not None else {}))
    return httpx.AsyncClient(transport=transport, **kwargs)
