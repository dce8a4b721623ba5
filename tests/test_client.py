"""The HTTP client against small real servers on localhost (no SGLang, no model)."""

from __future__ import annotations

import asyncio

import pytest

from rlgen._client import Client
from rlgen._errors import RequestError

BODY = b'{"ok": true}'
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)


async def _read_request(reader: asyncio.StreamReader) -> bool:
    """Read one request (headers + Content-Length body); False if the client closed instead."""
    head = await reader.readuntil(b"\r\n\r\n") if not reader.at_eof() else b""
    if not head:
        return False
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    await reader.readexactly(length)
    return True


@pytest.mark.timeout(30)
def test_a_request_on_a_keep_alive_connection_the_server_drops_is_sent_again() -> None:
    # As uvicorn does when its keep-alive timer fires just as a request arrives: the first
    # connection answers one request, then closes on the next one without answering it.
    async def main() -> tuple[list[object], int]:
        connections = 0

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal connections
            connections += 1
            first = connections == 1
            try:
                while await _read_request(reader):
                    if first and served:
                        break  # the dropped request: close without a response
                    served.append(1)
                    writer.write(OK)
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            writer.close()

        served: list[int] = []
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = Client(f"http://127.0.0.1:{port}")
        try:
            answers = [await client.post("/generate", {"text": "a"}), await client.post("/generate", {"text": "b"})]
        finally:
            await client.aclose()
            server.close()
        return answers, connections

    answers, connections = asyncio.run(main())
    assert answers == [{"ok": True}, {"ok": True}]
    assert connections == 2  # the second request went out again on a new connection


@pytest.mark.timeout(30)
def test_a_server_that_keeps_dropping_requests_fails_with_a_request_error() -> None:
    async def main() -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await _read_request(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        client = Client(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        try:
            with pytest.raises(RequestError, match="cannot reach the server"):
                await client.post("/generate", {"text": "a"})
        finally:
            await client.aclose()
            server.close()

    asyncio.run(main())


@pytest.mark.timeout(30)
def test_info_falls_back_to_the_pre_0_5_17_endpoint_names() -> None:
    async def main() -> tuple[object, list[bytes]]:
        paths: list[bytes] = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    path = head.split(b" ")[1]
                    paths.append(path)
                    if path == b"/get_server_info":
                        writer.write(OK)
                    else:
                        writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot found")
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        client = Client(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        try:
            return await client.get_info("server"), paths
        finally:
            await client.aclose()
            server.close()

    info, paths = asyncio.run(main())
    assert info == {"ok": True}
    assert paths == [b"/server_info", b"/get_server_info"]
