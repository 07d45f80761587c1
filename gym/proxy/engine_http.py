"""A lean HTTP path from the proxy to the engine, under the unchanged `EngineClient`.

httpx's default connection pool costs milliseconds per request under concurrency (its
pool bookkeeping grows with the number of connections), its client layer (URL parsing,
header merging, cookies, request and response models) about 0.3 ms of CPU per request,
and stdlib `json.dumps` of a 16k-id prompt ~2 ms; at one session the client layer alone
was a fifth of the proxy's CPU per call. This module keeps `EngineClient`'s contract and
code, and swaps in:
- `KeepAliveTransport`: an `httpx.AsyncBaseTransport` over plain asyncio streams, HTTP/1.1
  keep-alive, a LIFO idle pool per host, Content-Length and chunked bodies (so the SSE
  stream of /generate stays incremental); one retry on a fresh connection when an idle one
  was closed by the server; the request's httpx connect timeout bounds opening a
  connection, and a request cancelled mid-exchange (an asyncio deadline of
  `EngineTimeouts`, a client gone) closes its connection instead of leaking it;
- `LeanEngineClient`: /generate requests as bytes straight to that transport (a fixed head,
  the body serialized with orjson), answered as a `RawResponse`; control requests still go
  through httpx (over the same transport).
Loopback http only (the engine is on the same host or reached through a tunnel).
"""
from __future__ import annotations

import asyncio
from typing import AsyncIterator

import httpx

from harnessrl.gym.backends.engine_client import EngineClient, EngineTimeouts

try:
    import orjson

    _dumps, _loads = orjson.dumps, orjson.loads
except ImportError:  # pragma: no cover
    import json

    orjson = None
    _loads = json.loads

    def _dumps(obj) -> bytes:
        return json.dumps(obj).encode()


class _NoResponse(ConnectionError):
    """The connection failed before any byte of the response arrived."""


class _Conn:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    def close(self) -> None:
        self.writer.close()


class _Body(httpx.AsyncByteStream):
    """Streams a response body; gives the connection back to the pool once fully read."""

    def __init__(self, transport: "KeepAliveTransport", key, conn: _Conn, length: int | None, chunked: bool,
                 keep: bool):
        self.t, self.key, self.conn, self.length, self.chunked, self.keep = transport, key, conn, length, chunked, keep
        self.done = False
        self._it = self._read()

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._it

    async def _read(self) -> AsyncIterator[bytes]:
        r = self.conn.reader
        if self.chunked:
            while True:
                size = int((await r.readline()).split(b";")[0], 16)
                if size == 0:
                    while (await r.readline()) not in (b"\r\n", b""):
                        pass
                    break
                data = await r.readexactly(size)
                await r.readexactly(2)
                yield data
        elif self.length is not None:
            if self.length:
                yield await r.readexactly(self.length)
        else:  # no framing: the body runs to connection close
            self.keep = False
            while chunk := await r.read(65536):
                yield chunk
        self.done = True

    async def _drain(self) -> None:
        async for _ in self._it:
            pass

    async def aclose(self) -> None:
        if self.done and self.keep:
            self.t._release(self.key, self.conn)
        elif self.keep and self.chunked:
            # An SSE reader stops at "data: [DONE]"; the chunked terminator follows. Reading it
            # in the background keeps the connection without making this call wait for it.
            task = asyncio.ensure_future(self._finish_later())
            self.t._draining.add(task)
            task.add_done_callback(self.t._draining.discard)
        else:
            self.conn.close()

    async def _finish_later(self) -> None:
        try:
            await asyncio.wait_for(self._drain(), 5.0)
        except (asyncio.TimeoutError, ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        if self.done:
            self.t._release(self.key, self.conn)
        else:
            self.conn.close()


class KeepAliveTransport(httpx.AsyncBaseTransport):
    def __init__(self, max_idle_per_host: int = 1024):
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._draining: set[asyncio.Future] = set()
        self.max_idle = max_idle_per_host

    def _release(self, key, conn: _Conn) -> None:
        pool = self._idle.setdefault(key, [])
        if len(pool) < self.max_idle:
            pool.append(conn)
        else:
            conn.close()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme != "http":
            raise httpx.UnsupportedProtocol(f"KeepAliveTransport serves http only, not {request.url.scheme}")
        key = (request.url.host, request.url.port or 80)
        body = request.content if isinstance(request.stream, httpx.ByteStream) else await request.aread()
        lines = [f"{request.method} {request.url.raw_path.decode()} HTTP/1.1".encode()]
        for k, v in request.headers.raw:
            if k.lower() not in (b"content-length", b"transfer-encoding", b"connection"):
                lines.append(k + b": " + v)
        lines.append(b"Content-Length: " + str(len(body)).encode())
        head = b"\r\n".join(lines) + b"\r\n\r\n"
        raw = await self.request(key, head + body, (request.extensions.get("timeout") or {}).get("connect"))
        return httpx.Response(raw.status_code, headers=raw.headers, stream=raw.body)

    async def request(self, key: tuple[str, int], data: bytes, connect_s: float | None) -> "RawResponse":
        """Send one whole request (`data`: head and body) to `key` (host, port) on an idle
        connection or a new one; the response once its head has arrived."""
        pool = self._idle.get(key)
        reused = bool(pool)
        conn = pool.pop() if pool else await self._open(key, connect_s)
        try:
            return await self._checked(key, conn, data)
        except _NoResponse as e:
            if not reused:
                raise httpx.ConnectError(f"engine connection failed: {e}") from e
        # A stale idle connection the server had closed: it answered nothing, so the request
        # was not run and resending cannot generate twice.
        conn = await self._open(key, connect_s)
        try:
            return await self._checked(key, conn, data)
        except _NoResponse as e:  # a fresh connection dropped too (an engine dying as we call it)
            raise httpx.ConnectError(f"engine connection failed: {e}") from e

    async def _checked(self, key, conn: _Conn, data: bytes) -> "RawResponse":
        """One exchange on `conn`, closed on any failure: `_NoResponse` when nothing came back,
        httpx's ReadError when it broke mid-response (the engine may have run the request: never
        resend it), a cancellation (a deadline, a client gone) as it is."""
        try:
            return await self._exchange(key, conn, data)
        except _NoResponse:
            conn.close()
            raise
        except (ConnectionError, asyncio.IncompleteReadError, httpx.RemoteProtocolError) as e:
            conn.close()
            raise httpx.ReadError(f"engine connection broke mid-response: {e}") from e
        except BaseException:  # the exchange is unusable
            conn.close()
            raise

    async def _open(self, key, connect_s: float | None = None) -> _Conn:
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection(key[0], key[1], limit=1 << 24), connect_s)
        except asyncio.TimeoutError as e:
            raise httpx.ConnectTimeout(f"cannot connect to {key[0]}:{key[1]} within {connect_s} s") from e
        except OSError as e:
            raise httpx.ConnectError(f"cannot connect to {key[0]}:{key[1]}: {e}") from e
        return _Conn(r, w)

    async def _exchange(self, key, conn: _Conn, data: bytes) -> "RawResponse":
        try:
            conn.writer.write(data)
            head = await conn.reader.readuntil(b"\r\n\r\n")  # the whole head in one read (HTTP/1.1: CRLF)
        except asyncio.IncompleteReadError as e:
            if e.partial:
                raise httpx.RemoteProtocolError(f"the response head was cut off after {len(e.partial)} bytes") from e
            raise _NoResponse("server closed the connection without a response") from e
        except ConnectionError as e:
            raise _NoResponse(str(e)) from e
        status_line, *lines = head[:-4].split(b"\r\n")
        status = int(status_line.split(None, 2)[1])
        headers, length, chunked, keep = [], None, False, True
        for line in lines:
            k, _, v = line.partition(b":")
            k, v = k.strip(), v.strip()
            headers.append((k, v))
            lk = k.lower()
            if lk == b"content-length":
                length = int(v)
            elif lk == b"transfer-encoding" and b"chunked" in v.lower():
                chunked = True
            elif lk == b"connection" and v.lower() == b"close":
                keep = False
        return RawResponse(status, headers, _Body(self, key, conn, length, chunked, keep))

    async def aclose(self) -> None:
        for pool in self._idle.values():
            for c in pool:
                c.close()
        self._idle.clear()


class RawResponse:
    """One response as read off the connection, with the part of httpx.Response's interface
    that `EngineClient` reads. Its connection goes back to the pool once the body is read."""

    __slots__ = ("status_code", "headers", "body", "content")

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], body: _Body):
        self.status_code, self.headers, self.body = status, headers, body
        self.content = b""

    async def aread(self) -> bytes:
        self.content = b"".join([c async for c in self.body])
        await self.body.aclose()
        return self.content

    def json(self):
        return _loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    async def aiter_lines(self) -> AsyncIterator[str]:
        """The body's lines as they arrive, without their line ends (as httpx splits them)."""
        rest = b""
        async for chunk in self.body:
            rest += chunk
            *lines, rest = rest.split(b"\n")
            for line in lines:
                yield line.rstrip(b"\r").decode("utf-8", "replace")
        if rest:
            yield rest.rstrip(b"\r").decode("utf-8", "replace")

    async def aclose(self) -> None:
        await self.body.aclose()


class LeanEngineClient(EngineClient):
    """`EngineClient` whose /generate requests skip httpx's client layer (URL parsing, header
    merging, cookies, response models: most of the proxy's CPU per call): the request's bytes
    are built once per call from a fixed head and go straight to `KeepAliveTransport`.
    Everything else (control routes, the contract, parsing, timeouts) is `EngineClient`'s."""

    def __init__(self, base_url: str, timeout: float = 600.0, timeouts: EngineTimeouts | None = None,
                 transport: KeepAliveTransport | None = None, api_key: str | None = None):
        self.transport = transport or KeepAliveTransport()
        super().__init__(base_url, timeout=timeout, timeouts=timeouts, transport=self.transport, api_key=api_key)
        old = self._http  # httpx's default headers (user agent, ...); json bodies by orjson from here on
        self._http = _OrjsonClient(base_url=self.base_url, timeout=timeout, headers=old.headers, transport=self.transport)
        url = httpx.URL(self.base_url)
        self._lean = url.scheme == "http"  # anything else goes through httpx (which refuses it here)
        self._key = (url.host, url.port or 80)
        auth = old.headers.get("authorization")
        self._head = (b"POST " + url.raw_path.rstrip(b"/") + b"/generate HTTP/1.1\r\nHost: "
                      + f"{url.host}:{self._key[1]}".encode() + b"\r\nContent-Type: application/json\r\n"
                      + (b"Authorization: " + auth.encode() + b"\r\n" if auth else b""))

    async def post_generate(self, payload: dict, stream: bool):
        if not self._lean:
            return await super().post_generate(payload, stream)
        if self.lora_name is not None:
            payload = dict(payload, lora_path=self.lora_name)
        body = _dumps(payload)
        data = self._head + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        resp = await self.transport.request(self._key, data, self.timeouts.connect_s)
        if not stream:
            try:
                await resp.aread()
            except (ConnectionError, asyncio.IncompleteReadError) as e:
                resp.body.conn.close()
                raise httpx.ReadError(f"engine connection broke mid-response: {e}") from e
            except BaseException:
                resp.body.conn.close()
                raise
        return resp


class _OrjsonClient(httpx.AsyncClient):
    def build_request(self, method, url, *, json=None, content=None, headers=None, **kw):
        if json is not None and orjson is not None:
            content = orjson.dumps(json)
            headers = dict(headers or {}, **{"content-type": "application/json"})
            json = None
        return super().build_request(method, url, json=json, content=content, headers=headers, **kw)


def make_engine_client(base_url: str, timeout: float = 600.0, timeouts: EngineTimeouts | None = None) -> EngineClient:
    """An `EngineClient` (contract and parsing unchanged) over the lean transport."""
    return LeanEngineClient(base_url, timeout=timeout, timeouts=timeouts)
