"""The egress proxy of an environment build: the build's only way out of its sandbox.

The sandbox has a network namespace of its own (only loopback). The worker runs this proxy
outside it, listening on a unix socket that is bound into the sandbox at ENV_PROXY_SOCKET;
inside, a small bridge listens on 127.0.0.1:PROXY_PORT and forwards each connection to that
socket (socat when the machine has it, else a few lines of the system's Python), and the
usual proxy variables point package managers at it. This is the shape of Anthropic's sandbox
runtime (`srt`): proxies on unix sockets, bridged inside the namespace.

It speaks HTTP CONNECT only (package registries are HTTPS): the host of each CONNECT is
checked against the allow-list (exact names, or `*.example.org` for its subdomains); anything
else, and every plain-HTTP request, is answered 403 and recorded as denied. It never sees
inside the TLS stream. A proxy kept on PyPI (proxy.py) does the same with plugins, but is not
on this machine's offline index; this one is ~100 lines of asyncio.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from psychonauts.containment.sandbox import ENV_PROXY_SOCKET

PROXY_PORT = 3128
HEADER_MAX = 16_384
CONNECT_TIMEOUT_S = 30.0

_BRIDGE_PY = f"""
import os, socket, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", {PROXY_PORT})); s.listen(64)
def pipe(a, b):
    try:
        while True:
            d = a.recv(65536)
            if not d: break
            b.sendall(d)
    except OSError: pass
    finally:
        for x in (a, b):
            try: x.shutdown(socket.SHUT_RDWR)
            except OSError: pass
while True:
    c, _ = s.accept()
    u = socket.socket(socket.AF_UNIX)
    try: u.connect("{ENV_PROXY_SOCKET}")
    except OSError: c.close(); continue
    threading.Thread(target=pipe, args=(c, u), daemon=True).start()
    threading.Thread(target=pipe, args=(u, c), daemon=True).start()
"""


def host_allowed(host: str, allow: tuple[str, ...]) -> bool:
    host = host.lower().rstrip(".")
    for entry in allow:
        if entry.startswith("*."):
            if host.endswith(entry[1:]):
                return True
        elif host == entry:
            return True
    return False


class EgressProxy:
    """A CONNECT proxy on a unix socket, run in a thread of the worker for one build."""

    def __init__(
        self, *, allow: tuple[str, ...], on_denied: Callable[[str], None] | None = None
    ) -> None:
        self.on_denied = on_denied
        # A short path of its own: a unix socket's path is limited to 107 bytes.
        self.folder = Path(tempfile.mkdtemp(prefix="annihilation-proxy-"))
        self.socket_path = self.folder / "proxy.sock"
        self.allow = allow
        self._denied: list[str] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._failure: BaseException | None = None

    def variables(self) -> tuple[tuple[str, str], ...]:
        url = f"http://127.0.0.1:{PROXY_PORT}"
        names = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy",
                 "npm_config_proxy", "npm_config_https_proxy")  # fmt: skip
        return tuple((name, url) for name in names)

    def bridge(self) -> str:
        """Shell lines that start the bridge inside the sandbox and wait until it listens."""
        if shutil.which("socat"):
            start = (
                f"socat TCP-LISTEN:{PROXY_PORT},bind=127.0.0.1,fork,reuseaddr "
                f"UNIX-CONNECT:{ENV_PROXY_SOCKET}"
            )
        else:
            start = f"python3 -c {shlex.quote(_BRIDGE_PY)}"
        return (
            f"{start} </dev/null >/dev/null 2>&1 &\n"
            "for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/"
            f"{PROXY_PORT}) 2>/dev/null && break; sleep 0.02; done\n"
        )

    def denied(self) -> list[str]:
        return list(dict.fromkeys(self._denied))

    def start(self) -> None:
        self.folder.chmod(0o755)
        self._thread = threading.Thread(target=self._run, name="egress-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise OSError(f"the egress proxy did not start: {self._failure}")

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):  # its loop already ended
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)
        shutil.rmtree(self.folder, ignore_errors=True)

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(self._serve())
        except Exception as exc:  # reported by start()
            self._failure = exc
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_unix_server(self._client, path=str(self.socket_path))
        self.socket_path.chmod(0o666)
        self._ready.set()
        async with server:
            await self._stop.wait()
        # Connections still open end with the proxy, each closed (no transport left to the
        # garbage collector).
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(0.05)  # the closed transports' callbacks run before the loop ends

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._handle(reader, writer)
        finally:  # cancelled with the proxy too: the transport is closed, never left to the GC
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), CONNECT_TIMEOUT_S)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            await self._close(writer)  # a probe of the bridge, or a client that said nothing
            return
        line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = line.split()
        if len(parts) < 2 or parts[0].upper() != "CONNECT" or len(head) > HEADER_MAX:
            target = parts[1] if len(parts) > 1 else "?"
            await self._deny(f"{target} (not CONNECT)")
            await self._refuse(writer, "only CONNECT (HTTPS) goes through this proxy")
            return
        host, _, port_text = parts[1].rpartition(":")
        host = host.strip("[]")
        if not host or not port_text.isdigit() or not host_allowed(host, self.allow):
            await self._deny(parts[1])
            await self._refuse(writer, f"{parts[1]} is not in the allow-list")
            return
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(host, int(port_text)), CONNECT_TIMEOUT_S
            )
        except (OSError, TimeoutError) as exc:
            writer.write(f"HTTP/1.1 502 Bad Gateway\r\n\r\n{exc}\r\n".encode())
            await self._close(writer)
            return
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            await self._close(up_writer)
            await self._close(writer)

    async def _deny(self, target: str) -> None:
        self._denied.append(target)
        if self.on_denied is not None:  # it may write to the database: not on the loop
            await asyncio.get_running_loop().run_in_executor(None, self.on_denied, target)

    async def _refuse(self, writer: asyncio.StreamWriter, why: str) -> None:
        body = f"annihilation egress proxy: {why}\r\n".encode()
        writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        await self._close(writer)

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            await EgressProxy._close(writer)

    @staticmethod
    async def _close(writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            await writer.drain()
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()


_agents_proxy: EgressProxy | None = None
_agents_lock = threading.Lock()


def agents_proxy(allow: tuple[str, ...], on_denied: Callable[[str], None]) -> EgressProxy:
    """The worker process's one proxy for agents' commands (started on first use, started again
    when the allow-list changed). It lives as long as the process."""
    global _agents_proxy
    with _agents_lock:
        if _agents_proxy is not None and (
            _agents_proxy.allow != allow or not _agents_proxy.socket_path.exists()
        ):
            _agents_proxy.stop()
            _agents_proxy = None
        if _agents_proxy is None:
            proxy = EgressProxy(allow=allow, on_denied=on_denied)
            proxy.start()
            _agents_proxy = proxy
        return _agents_proxy
