"""The upstream HTTP client against small servers that misbehave on purpose (one each).

The proxy's tests through the real engine and the fault-injecting stub cover the client end to end;
these pin down what only a hand-made server can show: which connection a request went out on.
"""

from __future__ import annotations

import asyncio
import ssl
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from proxy.http_client import HIGH_WATER, HttpClient, UpstreamConnectError, UpstreamDisconnected, UpstreamIdleTimeout
from tests.conftest import free_port

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, dict[str, Any]], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> bytes | None:
    """One request's body (None at end of stream)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return await reader.readexactly(length)


def reply(body: bytes, status: int = 200) -> bytes:
    return b"HTTP/1.1 %d OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        status,
        len(body),
        body,
    )


def run(handler: Handler, scenario: Callable[[str, dict[str, Any]], Awaitable[None]]) -> dict[str, Any]:
    """Serve ``handler`` on a free port while ``scenario`` talks to it; returns what the server counted."""
    seen: dict[str, Any] = {"connections": 0, "eof": 0}

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen["connections"] += 1
        try:
            await handler(reader, writer, seen)
        finally:
            writer.close()

    async def main() -> None:
        port = free_port()
        server = await asyncio.start_server(on_connect, "127.0.0.1", port)
        async with server:
            await scenario(f"http://127.0.0.1:{port}", seen)

    asyncio.run(main())
    return seen


def answering(body: bytes) -> Handler:
    """A server that answers every request on a connection with ``body``."""

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, seen: dict[str, Any]) -> None:
        while await read_request(r) is not None:
            w.write(reply(body))
            await w.drain()

    return handler


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: dict[str, Any]) -> None:
    while (body := await read_request(reader)) is not None:
        writer.write(reply(b'{"echo": %s}' % body))
    seen["eof"] += 1


def test_requests_share_one_keep_alive_connection() -> None:
    async def scenario(url: str, seen: dict[str, Any]) -> None:
        client = HttpClient(connect_timeout=5, idle_timeout=5)
        for n in range(3):
            resp = await client.request("POST", url, "/v1/x", b"%d" % n)
            assert resp.status == 200 and resp.headers["content-type"] == "application/json"
            assert await resp.read() == b'{"echo": %d}' % n
        await client.close()

    assert run(echo, scenario)["connections"] == 1


def test_a_stream_arrives_piece_by_piece_and_its_connection_is_reused_after_its_end() -> None:
    gate = asyncio.Event()

    async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: dict[str, Any]) -> None:
        while await read_request(reader) is not None:
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n6\r\ndata:1\r\n")
            await writer.drain()
            await gate.wait()
            writer.write(b"6\r\ndata:2\r\n")
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(b"0\r\n\r\n")  # the end comes after the caller let go

    async def scenario(url: str, seen: dict[str, Any]) -> None:
        client = HttpClient(connect_timeout=5, idle_timeout=5)
        for _ in range(2):
            gate.clear()
            resp = await client.request("POST", url, "/", b"{}")
            pieces = resp.chunks()
            assert await anext(pieces) == b"data:1"
            gate.set()
            assert await anext(pieces) == b"data:2"
            resp.release()
            await asyncio.sleep(0.2)
        await client.close()

    assert run(chunked, scenario)["connections"] == 1


def test_a_reused_connection_the_engine_closed_unanswered_is_retried_once_on_a_new_one() -> None:
    async def one_per_connection(r: asyncio.StreamReader, w: asyncio.StreamWriter, seen: dict[str, Any]) -> None:
        body = await read_request(r)
        w.write(reply(b"first" if seen["connections"] == 1 else b"again:" + (body or b"")))
        await w.drain()
        await read_request(r)  # a second request on this connection: closed without a byte

    async def scenario(url: str, seen: dict[str, Any]) -> None:
        client = HttpClient(connect_timeout=5, idle_timeout=5)
        assert await (await client.request("POST", url, "/", b"1")).read() == b"first"
        assert await (await client.request("POST", url, "/", b"2")).read() == b"again:2"
        await client.close()

    assert run(one_per_connection, scenario)["connections"] == 2


def test_a_new_connection_closed_before_any_byte_is_an_error_not_a_retry() -> None:
    async def hang_up(r: asyncio.StreamReader, w: asyncio.StreamWriter, seen: dict[str, Any]) -> None:
        await read_request(r)

    async def scenario(url: str, seen: dict[str, Any]) -> None:
        client = HttpClient(connect_timeout=5, idle_timeout=5)
        with pytest.raises(UpstreamDisconnected):
            await client.request("POST", url, "/", b"{}")

    assert run(hang_up, scenario)["connections"] == 1


def test_a_reply_cut_short_raises_and_a_silent_engine_times_out() -> None:
    async def cut(r: asyncio.StreamReader, w: asyncio.StreamWriter, seen: dict[str, Any]) -> None:
        body = await read_request(r)
        if body == b"cut":
            w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789")
            await w.drain()
        elif body == b"garbage":
            w.write(b"SMTP ready\r\n\r\n")
            await w.drain()
        else:
            await asyncio.sleep(5)  # connected, then silent

    async def scenario(url: str, seen: dict[str, Any]) -> None:
        client = HttpClient(connect_timeout=5, idle_timeout=0.3)
        resp = await client.request("POST", url, "/", b"cut")
        with pytest.raises(UpstreamDisconnected, match="before the reply ended"):
            await resp.read()
        with pytest.raises(UpstreamDisconnected, match="not valid HTTP"):
            await client.request("POST", url, "/", b"garbage")
        started = asyncio.get_running_loop().time()
        with pytest.raises(UpstreamIdleTimeout):
            await client.request("POST", url, "/", b"silence")
        assert asyncio.get_running_loop().time() - started < 3

    assert run(cut, scenario)["connections"] == 3


def test_closing_a_reply_mid_stream_hangs_up_on_the_engine() -> None:
    closed = asyncio.Event()

    async def endless(r: asyncio.StreamReader, w: asyncio.StreamWriter, seen: dict[str, Any]) -> None:
        await read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        try:
            while True:
                w.write(b"1\r\nx\r\n")
                await w.drain()
                await asyncio.sleep(0.01)
        except (ConnectionError, OSError):
            closed.set()

    async def scenario(url: str, seen: dict[str, Any]) -> None:
        client = HttpClient(connect_timeout=5, idle_timeout=5)
        resp = await client.request("POST", url, "/", b"{}")
        await anext(resp.chunks())
        resp.close()
        await asyncio.wait_for(closed.wait(), 5)

    run(endless, scenario)


def test_no_server_is_a_connect_error() -> None:
    async def main() -> None:
        client = HttpClient(connect_timeout=5, idle_timeout=5)
        with pytest.raises(UpstreamConnectError):
            await client.request("POST", f"http://127.0.0.1:{free_port()}", "/", b"{}")

    asyncio.run(main())


def test_one_client_used_from_two_event_loops_in_turn(stub_upstream: str) -> None:
    """A pooled connection belongs to the loop that made it: the next loop makes its own."""
    client = HttpClient(connect_timeout=5, idle_timeout=5)

    async def ask() -> int:
        resp = await client.request("GET", stub_upstream, "/v1/models")
        await resp.read()
        return resp.status

    assert asyncio.run(ask()) == 200
    assert asyncio.run(ask()) == 200  # the first loop is closed; its connection is not reused


def test_a_reply_larger_than_the_read_buffer_is_read_whole() -> None:
    """Reading pauses at the high-water mark until the caller takes what came: a whole-body read must
    take it as it waits, or a large reply (logprobs of a long answer) stalls into the idle timeout."""
    big = b"[" + b",".join(b'{"token": "x", "logprob": -0.5}' for _ in range(150_000)) + b"]"

    async def scenario(url: str, seen: dict[str, Any]) -> None:
        client = HttpClient(connect_timeout=5, idle_timeout=2)
        for _ in range(2):
            assert await (await client.request("POST", url, "/", b"{}")).read() == big
        await client.close()

    assert len(big) > 3 * HIGH_WATER
    assert run(answering(big), scenario)["connections"] == 1


def test_a_reply_let_go_with_its_buffer_full_still_ends_and_is_reused() -> None:
    """Released before its end while reading was paused at the high-water mark: what came is dropped,
    reading resumes, and the connection goes back to the pool when the reply ends."""
    big = b"x" * (3 * HIGH_WATER)

    async def scenario(url: str, seen: dict[str, Any]) -> None:
        client = HttpClient(connect_timeout=5, idle_timeout=2)
        resp = await client.request("POST", url, "/", b"{}")
        await asyncio.sleep(0.3)  # the buffer fills past the mark and reading pauses
        resp.release()
        await asyncio.sleep(0.3)
        assert await (await client.request("POST", url, "/", b"{}")).read() == big
        await client.close()

    assert run(answering(big), scenario)["connections"] == 1


def test_an_engine_behind_tls_is_reached_with_the_system_trust_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``https://`` engine URLs: verified against the default trust store, which an operator extends
    with OpenSSL's ``SSL_CERT_FILE`` (here a self-signed certificate for 127.0.0.1)."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=engine",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(cert, key)

    async def main() -> None:
        port = free_port()

        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await echo(reader, writer, {"eof": 0})
            writer.close()

        server = await asyncio.start_server(on_connect, "127.0.0.1", port, ssl=served)
        async with server:
            client = HttpClient(connect_timeout=5, idle_timeout=5)
            for n in range(2):
                resp = await client.request("POST", f"https://127.0.0.1:{port}", "/v1/x", b"%d" % n)
                assert await resp.read() == b'{"echo": %d}' % n
            await client.close()
            plain = HttpClient(connect_timeout=5, idle_timeout=5)  # the same server, not trusted without it
            monkeypatch.delenv("SSL_CERT_FILE")
            with pytest.raises(UpstreamConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await plain.request("POST", f"https://127.0.0.1:{port}", "/v1/x", b"0")

    asyncio.run(main())
