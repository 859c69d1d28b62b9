"""A TLS server on 127.0.0.1 whose certificate vLLM's own SSLCertRefresher keeps fresh, for test_tls_refresh.py.

Run with the parser venv's python (the real vLLM wheel's code): `python vllm_tls_server.py DIR...`. Each DIR holds
server.crt and server.key; one server per DIR, on an ephemeral port, with an SSL context made as uvicorn makes it
(PROTOCOL_TLS_SERVER, load_cert_chain) and handed to SSLCertRefresher exactly as vLLM's serve_http does under
--enable-ssl-refresh. Prints one line `PORTS {"DIR": port, ...}` when every server listens, then serves until stdin
closes.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import sys
from pathlib import Path

from vllm.entrypoints.launchers.utils.ssl import SSLCertRefresher


async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"ok\n")
    try:
        await writer.drain()
    finally:
        writer.close()


async def main(dirs: list[str]) -> None:
    ports, refreshers = {}, []
    for name in dirs:
        cert, key = str(Path(name) / "server.crt"), str(Path(name) / "server.key")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        refreshers.append(SSLCertRefresher(ssl_context=context, key_path=key, cert_path=cert, ca_path=None))
        server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=context)
        ports[name] = server.sockets[0].getsockname()[1]
    await asyncio.sleep(0.5)  # the watchers' tasks have started and added their inotify watches
    print("PORTS " + json.dumps(ports), flush=True)
    await asyncio.to_thread(sys.stdin.read)
    for refresher in refreshers:
        refresher.stop()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
