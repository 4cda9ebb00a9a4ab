"""A small HTTP/1.1 client over a unix socket or TLS, with what esfd needs
and the standard library's http.client lacks: response trailers (the
Esf-Status of a stream), and full-duplex request bodies (the interactive
exec stream).
"""

from __future__ import annotations

import email.message
import http.client
import io
import socket
import ssl
import threading
import urllib.parse
from typing import Dict, List, Mapping, Optional, Tuple, cast

# Bounds what a broken or hostile peer can make us buffer.
_MAX_LINE = 64 << 10
_MAX_HEADERS = 200


class TransportError(Exception):
    """The exchange failed below HTTP: the daemon was not reached, or the
    connection broke before a whole response was read. ``sent`` is False when
    nothing of the request was written (a retry is then always safe)."""

    def __init__(self, message: str, *, sent: bool = True) -> None:
        super().__init__(message)
        self.sent = sent


class ProtocolError(Exception):
    """The daemon sent something that is not the HTTP we expect."""


def _parse_headers(fp: io.BufferedReader) -> email.message.Message:
    try:
        return http.client.parse_headers(fp)
    except http.client.HTTPException as e:
        raise ProtocolError(f"bad header block: {e}") from e


class Response:
    """A response whose body is read as it comes."""

    def __init__(self, conn: "Conn", status: int, reason: str,
                 headers: email.message.Message, method: str) -> None:
        self.conn = conn
        self.status = status
        self.reason = reason
        self.headers = headers
        self.trailers: Dict[str, str] = {}
        self.done = False
        te = (headers.get("Transfer-Encoding") or "").lower()
        self._chunked = "chunked" in te
        self._chunk_left = 0
        self._length: Optional[int] = None
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            self._length = 0
        elif not self._chunked:
            cl = headers.get("Content-Length")
            if cl is not None:
                try:
                    self._length = int(cl)
                except ValueError as e:
                    raise ProtocolError(f"bad Content-Length {cl!r}") from e
        if self._length == 0:
            self.done = True

    def header(self, name: str) -> str:
        return self.headers.get(name) or ""

    def _readline(self) -> bytes:
        line = self.conn.rfile.readline(_MAX_LINE + 1)
        if len(line) > _MAX_LINE:
            raise ProtocolError("line too long")
        if not line:
            raise TransportError("connection closed mid-response")
        return line

    def read1(self, n: int = 64 << 10) -> bytes:
        """Up to n bytes of the body as soon as any are there; b"" at its end."""
        if self.done:
            return b""
        try:
            if self._chunked:
                return self._read1_chunked(n)
            if self._length is None:  # until the connection closes
                b = self.conn.rfile.read1(n)
                if not b:
                    self.done = True
                    self.conn.reusable = False
                return b
            b = self.conn.rfile.read1(min(n, self._length))
            if not b:
                raise TransportError("connection closed mid-body")
            self._length -= len(b)
            if self._length == 0:
                self.done = True
            return b
        except (OSError, ValueError) as e:
            raise TransportError(f"reading the response: {e}") from e

    def _read1_chunked(self, n: int) -> bytes:
        if self._chunk_left == 0:
            line = self._readline().split(b";", 1)[0].strip()
            try:
                size = int(line, 16)
            except ValueError as e:
                raise ProtocolError(f"bad chunk size {line!r}") from e
            if size == 0:
                t = _parse_headers(self.conn.rfile)
                self.trailers = {k: v for k, v in t.items()}
                self.done = True
                return b""
            self._chunk_left = size
        b = self.conn.rfile.read1(min(n, self._chunk_left))
        if not b:
            raise TransportError("connection closed mid-chunk")
        self._chunk_left -= len(b)
        if self._chunk_left == 0:
            if self._readline() not in (b"\r\n", b"\n"):
                raise ProtocolError("chunk not followed by CRLF")
        return b

    def read_exactly(self, n: int) -> bytes:
        """n bytes of the body, or fewer only at its end."""
        parts: List[bytes] = []
        got = 0
        while got < n:
            b = self.read1(n - got)
            if not b:
                break
            parts.append(b)
            got += len(b)
        return b"".join(parts)

    def read_all(self, limit: int = 1 << 30) -> bytes:
        parts: List[bytes] = []
        got = 0
        while True:
            b = self.read1()
            if not b:
                return b"".join(parts)
            got += len(b)
            if got > limit:
                raise ProtocolError(f"response body over {limit} bytes")
            parts.append(b)

    def close(self) -> None:
        """Give the connection back if the body was read whole, else drop it."""
        if self.done and self.conn.reusable and \
                (self.header("Connection").lower() != "close"):
            self.conn.release()
        else:
            self.conn.close()


class Conn:
    """One connection to the daemon."""

    def __init__(self, sock: socket.socket, pool: Optional["Pool"]) -> None:
        self.sock = sock
        self.rfile = cast(io.BufferedReader, sock.makefile("rb", buffering=64 << 10))
        self.pool = pool
        self.reusable = pool is not None
        self.closed = False

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_response(self, method: str) -> Response:
        try:
            line = self.rfile.readline(_MAX_LINE + 1)
        except OSError as e:
            raise TransportError(f"reading the response: {e}") from e
        if not line:
            raise TransportError("connection closed before the response")
        parts = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            raise ProtocolError(f"bad status line {line[:80]!r}")
        try:
            status = int(parts[1])
        except ValueError as e:
            raise ProtocolError(f"bad status line {line[:80]!r}") from e
        try:
            headers = _parse_headers(self.rfile)
        except OSError as e:
            raise TransportError(f"reading the response: {e}") from e
        return Response(self, status, parts[2] if len(parts) > 2 else "", headers, method)

    def release(self) -> None:
        if self.pool is not None and not self.closed:
            self.pool.put(self)
        else:
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.rfile.close()
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass


class Endpoint:
    """Where the daemon is: a unix socket, or https://HOST:PORT."""

    def __init__(self, *, socket_path: Optional[str] = None, url: Optional[str] = None,
                 ssl_context: Optional[ssl.SSLContext] = None,
                 connect_timeout: float = 30.0) -> None:
        self.socket_path = socket_path
        self.connect_timeout = connect_timeout
        self.tls: Optional[ssl.SSLContext] = None
        self.address: Tuple[str, int] = ("", 0)
        if socket_path is not None:
            self.host_header = "esfd"
            self.where = socket_path
            return
        if url is None:
            raise ValueError("want a socket path or a URL")
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("https", "http") or not u.hostname or u.port is None or \
                u.path not in ("", "/") or u.query or u.fragment or u.username:
            raise ValueError(f"host {url!r}: want https://HOST:PORT")
        self.address = (u.hostname, u.port)
        self.host_header = u.netloc
        self.where = u.netloc
        if u.scheme == "https":
            ctx = ssl_context or ssl.create_default_context()
            ctx.set_alpn_protocols(["http/1.1"])
            self.tls = ctx

    def connect(self, timeout: Optional[float]) -> socket.socket:
        try:
            if self.socket_path is not None:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    s.settimeout(self.connect_timeout)
                    s.connect(self.socket_path)
                except BaseException:
                    s.close()
                    raise
            else:
                s = socket.create_connection(self.address, timeout=self.connect_timeout)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if self.tls is not None:
                    try:
                        s = self.tls.wrap_socket(s, server_hostname=self.address[0])
                    except BaseException:
                        s.close()
                        raise
            s.settimeout(timeout)
            return s
        except ssl.SSLCertVerificationError as e:
            raise TransportError(f"esfd at {self.where}: {e}", sent=False) from e
        except OSError as e:
            raise TransportError(f"esfd at {self.where}: {e}", sent=False) from e


class Pool:
    """Idle keep-alive connections, for the ordinary calls."""

    def __init__(self, endpoint: Endpoint, size: int = 4) -> None:
        self.endpoint = endpoint
        self.size = size
        self._idle: List[Conn] = []
        self._lock = threading.Lock()

    def get(self, timeout: Optional[float]) -> Tuple[Conn, bool]:
        """A connection, and whether it was idle in the pool (a reused one
        may have been closed by the daemon meanwhile)."""
        with self._lock:
            c = self._idle.pop() if self._idle else None
        if c is not None:
            c.sock.settimeout(timeout)
            return c, True
        return Conn(self.endpoint.connect(timeout), self), False

    def put(self, c: Conn) -> None:
        with self._lock:
            if len(self._idle) < self.size:
                self._idle.append(c)
                return
        c.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for c in idle:
            c.close()


def request_head(method: str, path: str, host: str, headers: Mapping[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    for k, v in headers.items():
        if "\r" in v or "\n" in v or "\r" in k or "\n" in k:
            raise ValueError(f"header {k}: line break in the value")
        lines.append(f"{k}: {v}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked request body (b"" gives the last chunk)."""
    if not data:
        return b"0\r\n\r\n"
    return b"%x\r\n" % len(data) + data + b"\r\n"
