"""esf.Client: every operation of esfd's /v1 API."""

from __future__ import annotations

import json
import os
import secrets
import socket as _socket
import ssl
import struct
import time
import urllib.parse
import uuid
from typing import (IO, Any, BinaryIO, Callable, Dict, Iterable, Iterator, List, Mapping, Optional,
                    Sequence, Tuple, Union)

from . import _http
from .errors import (DeadlineExceeded, Error, InvalidArgument, Unavailable, code_for_status,
                     make_error)
from .records import (AttemptView, Chunk, CollectReport, CreateGroupResult, DiffResult, Evaluation,
                      Dropped, Event, EvidenceResult, ExecResult, ExportResult, ForkResult, FsckResult,
                      GroupView, Group, ImportResult, Inspection, Lease, MergeResult, MountResult,
                      Node, NodeView, PruneResult, ProvenanceRecord, ProvenanceReport, Status,
                      SuspendResult, Tree, Workers)

DEFAULT_SOCKET = "/var/lib/esf/esfd.sock"

# Frame ids of POST /v1/exec (docs/openapi.yaml).
_F_STDIN, _F_STDOUT, _F_STDERR, _F_EXIT, _F_RESIZE, _F_REQUEST, _F_ACK = 0, 1, 2, 3, 4, 5, 6
_MAX_FRAME = 64 << 10
STDIN_WINDOW = 256 << 10  # stdin bytes a client may have unacknowledged

MEDIA_JSON = "application/json"
MEDIA_EXEC_STREAM = "application/vnd.esf.exec-stream"

NodeRef = Union[str, Node]
AttemptRef = Union[str, AttemptView]
StdinSource = Union[bytes, IO[bytes], Iterable[bytes]]
Upload = Union[bytes, str, "os.PathLike[str]", BinaryIO]


def _id(x: Union[str, Node, AttemptView, Group]) -> str:
    if isinstance(x, str):
        return x
    if isinstance(x, Node):
        return x.node_id
    if isinstance(x, AttemptView):
        return x.attempt_id
    return x.group_id


def _traceparent() -> Tuple[str, str]:
    trace = secrets.token_hex(16)
    return f"00-{trace}-{secrets.token_hex(8)}-01", trace


def _caused_by(e: Optional[BaseException], cls: type) -> bool:
    while e is not None:
        if isinstance(e, cls):
            return True
        e = e.__cause__
    return False


def _timed_out(e: BaseException) -> bool:
    """Whether a transport failure is the client's own read timeout (then
    the call is not retried: the daemon may still be working on it)."""
    return _caused_by(e, _socket.timeout)


def _trace_of(tp: str) -> str:
    parts = tp.split("-")
    return parts[1] if len(parts) == 4 else ""


class _Call:
    """The per-call headers: one idempotency key and one trace for every
    try of the call."""

    def __init__(self, mutation: bool, key: Optional[str]) -> None:
        self.headers: Dict[str, str] = {}
        self.traceparent, self.trace_id = _traceparent()
        self.headers["traceparent"] = self.traceparent
        self.key = ""
        if mutation:
            if key is None:
                self.key = "py-" + uuid.uuid4().hex
                self.headers["Idempotency-Key"] = self.key
                self.headers["Esf-Idempotency-Key-Generated"] = "true"
            else:
                self.key = key
                self.headers["Idempotency-Key"] = key


class Client:
    """A client of esfd.

    With no arguments it uses ``ESF_HOST`` (with ``ESF_TOKEN_FILE`` and
    ``ESF_CACERT``) when set, else the unix socket ``ESF_SOCKET`` or
    /var/lib/esf/esfd.sock. ``host`` is ``https://HOST:PORT`` of a daemon
    started with ``--listen``; every request then carries the bearer token
    read from ``token_file`` (or given as ``token``), and ``ca_file`` (or
    ``ssl_context``) says whom to trust.

    Every mutation sends an idempotency key: the caller's
    (``idempotency_key=``) or one made up for the call. When the exchange
    fails below HTTP (connection refused or broken, reply lost) the client
    retries the same request with the same key, up to ``retries`` times, so
    the daemon applies it once (the waits double from ``backoff``: about 6 s
    in all by default, a daemon restart). ``timeout`` bounds each read of an
    ordinary call (streams have none); a call past it is DeadlineExceeded
    and not retried.

    A Client may be shared by threads: each call takes a connection of its
    own (idle ones are kept for the next call); exec and event streams open
    theirs.
    """

    def __init__(self, socket: Optional[str] = None, host: Optional[str] = None,
                 token_file: Optional[str] = None, *, token: Optional[str] = None,
                 ca_file: Optional[str] = None, ssl_context: Optional[ssl.SSLContext] = None,
                 timeout: Optional[float] = 300.0, retries: int = 6,
                 backoff: float = 0.1) -> None:
        if socket is None and host is None:
            host = os.environ.get("ESF_HOST") or None
            if host is None:
                socket = os.environ.get("ESF_SOCKET") or DEFAULT_SOCKET
        if socket is not None and host is not None:
            raise InvalidArgument("give socket or host, not both")
        self.token = ""
        if host is not None:
            if token is None:
                token_file = token_file or os.environ.get("ESF_TOKEN_FILE") or None
                if token_file is not None:
                    try:
                        with open(token_file, encoding="utf-8") as f:
                            token = f.read().strip()
                    except OSError as e:
                        raise InvalidArgument(f"token file: {e}") from e
            if token is not None and ("\n" in token or "\r" in token):
                raise InvalidArgument("token: more than one line")
            self.token = token or ""
            if ssl_context is None:
                ca_file = ca_file or os.environ.get("ESF_CACERT") or None
                if ca_file is not None:
                    try:
                        ssl_context = ssl.create_default_context(cafile=ca_file)
                    except (OSError, ssl.SSLError) as e:
                        raise InvalidArgument(f"CA file {ca_file}: {e}") from e
            try:
                self._endpoint = _http.Endpoint(url=host, ssl_context=ssl_context)
            except ValueError as e:
                raise InvalidArgument(str(e)) from e
        else:
            self._endpoint = _http.Endpoint(socket_path=socket)
        self.where = self._endpoint.where
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self._pool = _http.Pool(self._endpoint)

    def close(self) -> None:
        """Close idle connections."""
        self._pool.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- transport ----

    def _headers(self, call: _Call, content_type: str = "") -> Dict[str, str]:
        h = dict(call.headers)
        if self.token:
            h["Authorization"] = "Bearer " + self.token
        if content_type:
            h["Content-Type"] = content_type
        return h

    def _transport_error(self, call: _Call, e: Exception) -> Error:
        if _timed_out(e):
            return DeadlineExceeded(f"esfd at {self.where}: no answer within {self.timeout}s "
                                    f"(the call may still complete; retry it with its key {call.key!r})"
                                    if call.key else f"esfd at {self.where}: no answer within {self.timeout}s",
                                    trace_id=call.trace_id)
        return Unavailable(f"esfd at {self.where}: {e}", trace_id=call.trace_id)

    def _error_of(self, resp: _http.Response, call: _Call) -> Error:
        try:
            body = resp.read_all(1 << 20)
        except (_http.TransportError, _http.ProtocolError):
            body = b""
        finally:
            resp.close()
        trace = _trace_of(resp.header("traceparent")) or call.trace_id
        try:
            d = json.loads(body)
        except ValueError:
            d = None
        if isinstance(d, dict) and isinstance(d.get("code"), str) and d["code"]:
            paths = d.get("paths")
            return make_error(d["code"], str(d.get("message", "")), trace_id=trace,
                              status=resp.status,
                              paths=[p for p in paths if isinstance(p, str)] if isinstance(paths, list) else None)
        msg = body.decode("utf-8", "replace").strip()[:200]
        return make_error(code_for_status(resp.status), f"esfd: HTTP {resp.status} {resp.reason}: {msg}",
                          trace_id=trace, status=resp.status)

    def _open(self, method: str, path: str, call: _Call,
              body: Union[None, bytes, Callable[[], Iterator[bytes]]] = None,
              content_type: str = "", retry: bool = True,
              timeout: Optional[float] = -1.0) -> _http.Response:
        """Send a request (retrying transport failures when retry) and
        return the response of a 2xx; anything else raises its Error."""
        if timeout is not None and timeout < 0:
            timeout = self.timeout
        head_headers = self._headers(call, content_type)
        if isinstance(body, bytes):
            head_headers["Content-Length"] = str(len(body))
        elif body is not None:
            head_headers["Transfer-Encoding"] = "chunked"
        head = _http.request_head(method, path, self._endpoint.host_header, head_headers)
        tries = 0
        while True:
            tries += 1
            conn: Optional[_http.Conn] = None
            pooled = False
            try:
                conn, pooled = self._pool.get(timeout)
                if body is None or isinstance(body, bytes):
                    conn.send(head + (body or b""))
                else:
                    conn.send(head)
                    try:
                        for piece in body():
                            if piece:
                                conn.send(_http.chunk(piece))
                    except Error:
                        conn.close()  # half a body: the connection is spent
                        raise
                    conn.send(_http.chunk(b""))
                resp = conn.read_response(method)
            except (_http.TransportError, _http.ProtocolError, OSError) as e:
                if conn is not None:
                    conn.close()
                # A pooled connection the daemon closed meanwhile fails
                # before the daemon saw anything: always try once more.
                # A certificate the client does not trust stays untrusted.
                final = _timed_out(e) or _caused_by(e, ssl.SSLCertVerificationError)
                if not final and ((retry and tries <= self.retries) or (pooled and tries == 1)):
                    if not pooled:
                        time.sleep(self.backoff * (2 ** min(tries - 1, 6)))
                    continue
                raise self._transport_error(call, e) from e
            if resp.status // 100 == 2:
                return resp
            raise self._error_of(resp, call)

    def _json(self, method: str, path: str, payload: Optional[Mapping[str, Any]] = None, *,
              mutation: bool = False, key: Optional[str] = None) -> Any:
        call = _Call(mutation, key)
        body = None if payload is None else json.dumps(
            {k: v for k, v in payload.items() if v is not None}).encode()
        tries = 0
        while True:
            tries += 1
            resp = self._open(method, path, call, body, MEDIA_JSON if body is not None else "")
            try:
                data = resp.read_all(64 << 20)
            except (_http.TransportError, _http.ProtocolError) as e:
                resp.conn.close()
                # The reply was lost mid-body: the same key gets it again.
                if tries <= self.retries and not _timed_out(e):
                    time.sleep(self.backoff * (2 ** min(tries - 1, 6)))
                    continue
                raise self._transport_error(call, e) from e
            resp.close()
            try:
                return json.loads(data)
            except ValueError as e:
                raise make_error("internal", f"esfd: decode response: {e}", trace_id=call.trace_id) from e

    def _hostpath(self, p: Optional[str]) -> Optional[str]:
        """A path on the daemon's host: on the unix socket that is this
        machine, so a relative path is made absolute here."""
        if p is None or self._endpoint.socket_path is None:
            return p
        return os.path.abspath(p)

    @staticmethod
    def _q(**kw: Optional[str]) -> str:
        q = urllib.parse.urlencode({k: v for k, v in kw.items() if v})
        return "?" + q if q else ""

    # ---- daemon ----

    def status(self) -> Status:
        """The daemon's version, state dir and object store tally."""
        return Status.from_json(self._json("GET", "/v1/status"))

    def workers(self) -> Workers:
        """The workers of the graph, their capacity and load."""
        return Workers.from_json(self._json("GET", "/v1/workers"))

    def fsck(self, remote: bool = False) -> FsckResult:
        """Re-hash every stored object; damage is in the result's ``bad``.
        remote: check instead that every reachable object is in the remote
        content store (esfd --cas-remote) and whole."""
        return FsckResult.from_json(self._json("POST", "/v1/fsck", {"remote": remote or None}, mutation=True))

    def gc(self, dry_run: bool = False, *, remote: bool = False, remote_grace: Optional[int] = None,
           idempotency_key: Optional[str] = None) -> CollectReport:
        """Garbage-collect the content store (dry_run: only count). remote:
        collect the remote content store (esfd --cas-remote) instead, sparing
        keys younger than remote_grace seconds (the daemon's default: 3600)."""
        body: Dict[str, Any] = {"dry_run": dry_run or None, "remote": remote or None}
        if remote_grace is not None:
            if remote_grace < 1:
                raise ValueError("remote_grace: at least 1 second")
            body["remote_grace_seconds"] = remote_grace
        return CollectReport.from_json(self._json("POST", "/v1/gc", body, mutation=True, key=idempotency_key))

    # ---- content ----

    def import_source(self, source: str) -> ImportResult:
        """Import a directory, tar or OCI image at an absolute path on the
        daemon's host."""
        return ImportResult.from_json(self._json("POST", "/v1/import", {"source": self._hostpath(source)}, mutation=True))

    def _upload(self, path: str, src: "Upload", content_type: str) -> Any:
        """POST src (bytes, a local path or a binary file) streamed as the
        body. A path or a seekable file is sent again on a retry; any other
        file only once."""
        body: Union[bytes, Callable[[], Iterator[bytes]]]
        retry = True
        if isinstance(src, (bytes, bytearray, memoryview)):
            body = bytes(src)
        elif isinstance(src, (str, os.PathLike)):
            p = os.fspath(src)

            def from_path() -> Iterator[bytes]:
                try:
                    f = open(p, "rb")
                except OSError as e:
                    raise InvalidArgument(f"open the upload: {e}") from e
                with f:
                    yield from _blocks(f)
            body = from_path
        else:
            f = src
            pos = f.tell() if f.seekable() else -1
            retry = pos >= 0

            def from_file() -> Iterator[bytes]:
                if pos >= 0:
                    f.seek(pos)
                yield from _blocks(f)
            body = from_file
        call = _Call(True, None)
        resp = self._open("POST", path, call, body, content_type, retry=retry)
        try:
            return json.loads(resp.read_all(1 << 20))
        except (_http.TransportError, _http.ProtocolError) as e:
            resp.conn.close()
            raise self._transport_error(call, e) from e
        finally:
            resp.close()

    def import_tar(self, tar: "Upload") -> ImportResult:
        """Import a tar (plain, gzip or zstd) from this machine, streamed:
        bytes, a path, or a binary file."""
        return ImportResult.from_json(self._upload("/v1/import", tar, "application/x-tar"))

    def put_evidence(self, data: "Upload") -> EvidenceResult:
        """Store bytes (or a local file, streamed) as one object, for
        evaluate(evidence=[...])."""
        return EvidenceResult.from_json(self._upload("/v1/evidence", data, "application/octet-stream"))

    # ---- groups and nodes ----

    def create_group(self, source: Optional[str] = None, *, root_id: Optional[str] = None,
                     tar: Optional["Upload"] = None,
                     policy: Any = None, logical_state: Any = None, name: Optional[str] = None,
                     idempotency_key: Optional[str] = None) -> CreateGroupResult:
        """Create a group from a directory (or tar, or OCI image) at
        ``source``, an absolute path on the daemon's host; from ``tar``, a tar
        on this machine; or from ``root_id``, a stored root. The root node is
        sealed and canonical; the generation is 1. ``name``, if given, names
        the group for good: unique in the graph (Conflict if taken), 1..128
        of [A-Za-z0-9._-]."""
        if sum(x is not None for x in (source, root_id, tar)) != 1:
            raise InvalidArgument("create_group: give one of source, root_id, tar")
        if tar is not None:
            root_id = self.import_tar(tar).root_id
            source = None
        return CreateGroupResult.from_json(self._json("POST", "/v1/groups", {
            "root_id": root_id or "", "source": self._hostpath(source) if not root_id else source,
            "policy": policy,
            "logical_state": logical_state, "name": name}, mutation=True, key=idempotency_key))

    def fork(self, node: NodeRef, n: int = 1, *, logical_state: Any = None,
             idempotency_key: Optional[str] = None) -> List[Node]:
        """Create n draft children of a sealed node (metadata only)."""
        return ForkResult.from_json(self._json("POST", "/v1/fork", {
            "node_id": _id(node), "n": n, "logical_state": logical_state},
            mutation=True, key=idempotency_key)).nodes

    def inspect(self, id: str) -> Inspection:
        """Read a group, node or attempt (kind says which field is set)."""
        return Inspection.from_json(self._json("GET", "/v1/inspect/" + urllib.parse.quote(id, safe="")))

    def group(self, group: Union[str, Group]) -> GroupView:
        """A group, with its number of nodes."""
        g = self.inspect(_id(group)).group
        if g is None:
            raise InvalidArgument(f"{_id(group)} is not a group")
        return g

    def node(self, node: NodeRef) -> NodeView:
        """A node, with its ancestry, children, attempts, leases and evaluations."""
        n = self.inspect(_id(node)).node
        if n is None:
            raise InvalidArgument(f"{_id(node)} is not a node")
        return n

    def attempt(self, attempt: AttemptRef) -> "Attempt":
        """An attempt (a context manager, like activate's)."""
        a = self.inspect(_id(attempt)).attempt
        if a is None:
            raise InvalidArgument(f"{_id(attempt)} is not an attempt")
        return Attempt(self, a)

    def tree(self, group: Union[str, Group]) -> Tree:
        """A group's whole graph; ``.root`` is it as nested TreeNodes."""
        return Tree.from_json(self._json("GET", "/v1/tree/" + urllib.parse.quote(_id(group), safe="")))

    def prune(self, node: NodeRef, *, idempotency_key: Optional[str] = None) -> List[str]:
        """Mark an unleased subtree pruned; returns the nodes that became pruned."""
        return PruneResult.from_json(self._json("POST", "/v1/prune", {"node_id": _id(node)},
                                                mutation=True, key=idempotency_key)).pruned

    def promote(self, group: Union[str, Group], node: NodeRef, expected_generation: int, *,
                idempotency_key: Optional[str] = None) -> Group:
        """Make node canonical if the group is still at expected_generation
        (else StaleGeneration); returns the group at the next generation."""
        return Group.from_json(self._json("POST", "/v1/promote", {
            "group_id": _id(group), "node_id": _id(node), "expected_generation": expected_generation},
            mutation=True, key=idempotency_key))

    def evaluate(self, target: Union[str, Node, AttemptView], evaluator: str, reward: float = 0.0, *,
                 verdict: str = "", evidence: Optional[Sequence[str]] = None,
                 terminal: bool = False, backprop: bool = False,
                 idempotency_key: Optional[str] = None) -> Evaluation:
        """Record an evaluation (evaluator is NAME@VERSION) of a sealed node,
        or of an attempt's result. backprop adds one visit and the reward to
        the node and every ancestor, once per key; terminal makes it terminal."""
        return Evaluation.from_json(self._json("POST", "/v1/evaluate", {
            "target": _id(target), "evaluator": evaluator, "reward": reward, "verdict": verdict,
            "evidence": list(evidence) if evidence else None, "terminal": terminal or None,
            "backprop": backprop or None}, mutation=True, key=idempotency_key))

    def merge(self, nodes: Sequence[NodeRef], *, base: Optional[str] = None,
              logical_state: Any = None, promote: bool = False,
              expected_generation: Optional[int] = None,
              idempotency_key: Optional[str] = None) -> MergeResult:
        """Three-way merge sealed nodes into a new sealed node. A conflict
        raises Conflict with every conflicting path in ``paths``."""
        return MergeResult.from_json(self._json("POST", "/v1/merge", {
            "nodes": [_id(n) for n in nodes], "base": base, "logical_state": logical_state,
            "promote": promote or None, "expected_generation": expected_generation},
            mutation=True, key=idempotency_key))

    def diff(self, a: NodeRef, b: NodeRef) -> DiffResult:
        """Every change from tree a to tree b (node or root ids)."""
        return DiffResult.from_json(self._json("GET", "/v1/diff" + self._q(a=_id(a), b=_id(b))))

    # ---- attempts ----

    def activate(self, node: NodeRef, executor: str = "none", *, ttl_ms: Optional[int] = None,
                 root: Optional[str] = None, retry_of: Optional[str] = None,
                 memory_bytes: Optional[int] = None, pids: Optional[int] = None,
                 cpus: Optional[float] = None, env: Optional[Sequence[str]] = None,
                 workdir: Optional[str] = None, user: Optional[str] = None,
                 disk_bytes: Optional[int] = None, cap_add: Optional[Sequence[str]] = None,
                 labels: Optional[Mapping[str, str]] = None, worker: Optional[str] = None,
                 no_queue: bool = False, wait: bool = False, wait_timeout: float = 600.0,
                 idempotency_key: Optional[str] = None) -> "Attempt":
        """Lease a draft or sealed node for a new attempt and mount its
        writable root. executor is none, runc or wasi. memory_bytes (reserved
        against the daemon's memory quota) and disk_bytes (what the
        attempt's delta may hold: past it writes fail with EDQUOT) bound any
        attempt; a runc attempt also takes pids, cpus and cap_add (dropped
        capabilities given back, as the daemon's policy allows), and env,
        workdir and user as defaults of its execs. labels are the caller's
        data kept on the attempt and in the provenance of what it seals;
        worker pins the attempt to one worker of the graph. Over the
        daemon's quota the attempt is queued (state "queued") unless
        no_queue (then QuotaExceeded); with wait, activate returns once it
        is active. Use it as a context manager: ``with c.activate(n) as a:``
        releases the attempt on exit unless it was sealed."""
        av = AttemptView.from_json(self._json("POST", "/v1/activate", {
            "node_id": _id(node), "executor": executor, "ttl_ms": ttl_ms, "root": self._hostpath(root),
            "retry_of": retry_of, "memory_bytes": memory_bytes, "pids": pids, "cpus": cpus,
            "env": list(env) if env else None, "workdir": workdir, "user": user,
            "disk_bytes": disk_bytes, "cap_add": list(cap_add) if cap_add else None,
            "labels": dict(labels) if labels else None, "worker": worker,
            "no_queue": no_queue or None}, mutation=True, key=idempotency_key))
        a = Attempt(self, av)
        if wait:
            a.wait_active(wait_timeout)
        return a

    def suspend(self, attempt: AttemptRef, *, logical_state: Any = None, keep_running: bool = False,
                token: Optional[int] = None, idempotency_key: Optional[str] = None) -> SuspendResult:
        """Seal an attempt's changes into a node and release it (with
        keep_running it stays active and its next seal is a child of this one)."""
        return SuspendResult.from_json(self._json("POST", "/v1/suspend", {
            "attempt_id": _id(attempt), "logical_state": logical_state,
            "keep_running": keep_running or None, "token": token}, mutation=True, key=idempotency_key))

    def release(self, attempt: AttemptRef, *, token: Optional[int] = None,
                idempotency_key: Optional[str] = None) -> AttemptView:
        """End an attempt, unmount its root and drop its unsealed changes."""
        return AttemptView.from_json(self._json("POST", "/v1/release", {
            "attempt_id": _id(attempt), "token": token}, mutation=True, key=idempotency_key))

    def retry(self, attempt: AttemptRef, *, ttl_ms: Optional[int] = None,
              idempotency_key: Optional[str] = None) -> "Attempt":
        """A new attempt on the node of a failed (or released) one."""
        return Attempt(self, AttemptView.from_json(self._json("POST", "/v1/retry", {
            "attempt_id": _id(attempt), "ttl_ms": ttl_ms}, mutation=True, key=idempotency_key)))

    def renew(self, lease_id: str, token: int, *, ttl_ms: Optional[int] = None,
              idempotency_key: Optional[str] = None) -> Lease:
        """Extend a live lease by its TTL (or ttl_ms) from now."""
        return Lease.from_json(self._json("POST", "/v1/renew", {
            "lease_id": lease_id, "token": token, "ttl_ms": ttl_ms}, mutation=True, key=idempotency_key))

    def mount(self, node: NodeRef, dir: str, *, rw: bool = False,
              idempotency_key: Optional[str] = None) -> MountResult:
        """Show a node at an empty directory on the daemon's host, read-only
        or (rw) as a new attempt's root."""
        return MountResult.from_json(self._json("POST", "/v1/mount", {
            "node_id": _id(node), "dir": self._hostpath(dir), "rw": rw or None}, mutation=True, key=idempotency_key))

    def umount(self, dir: str, *, idempotency_key: Optional[str] = None) -> MountResult:
        """Undo a mount (an rw mount releases its attempt)."""
        return MountResult.from_json(self._json("POST", "/v1/umount", {"dir": self._hostpath(dir)},
                                                mutation=True, key=idempotency_key))

    # ---- exec ----

    def exec(self, attempt: AttemptRef, args: Sequence[str], *, stdin: Optional[StdinSource] = None,
             env: Optional[Sequence[str]] = None, workdir: Optional[str] = None,
             user: Optional[str] = None, timeout_ms: Optional[int] = None,
             module: Optional[str] = None, memory_limit_pages: Optional[int] = None,
             check: bool = False) -> ExecResult:
        """Run a command in an active attempt and return how it ended with
        its stdout and stderr. check raises ExecFailed on a nonzero exit.
        A command that did not end by itself (timeout_ms) raises
        DeadlineExceeded. In a wasi attempt args[0] is a module in the
        attempt's root, or ``module`` names one stored in the content
        store (an id from put_evidence); memory_limit_pages caps its memory
        (64 KiB pages)."""
        out: List[bytes] = []
        err: List[bytes] = []
        with self.exec_stream(attempt, args, stdin=stdin, env=env, workdir=workdir, user=user,
                              timeout_ms=timeout_ms, module=module,
                              memory_limit_pages=memory_limit_pages) as s:
            for c in s:
                (out if c.stream == "stdout" else err).append(c.data)
            if s.result is None:  # the iteration ends only at the exit frame
                raise make_error("internal", "exec: no result")
            res = ExecResult(s.result.exit_code, s.result.ms, b"".join(out), b"".join(err),
                             s.result.oom_killed)
        if check and res.exit_code != 0:
            raise ExecFailed(args, res)
        return res

    def exec_stream(self, attempt: AttemptRef, args: Sequence[str], *,
                    stdin: Union[None, bool, StdinSource] = None,
                    env: Optional[Sequence[str]] = None, workdir: Optional[str] = None,
                    user: Optional[str] = None, timeout_ms: Optional[int] = None,
                    module: Optional[str] = None, memory_limit_pages: Optional[int] = None,
                    tty: bool = False, rows: int = 0, cols: int = 0) -> "ExecStream":
        """Start a command and stream it: iterate the ExecStream for output
        Chunks as they come; ``result`` is set once the iteration ends.
        stdin is bytes, a binary file or an iterable of bytes, sent as the
        command takes it; stdin=True leaves it to ``write()`` and
        ``close_stdin()``. Leaving the stream early (close) kills the command."""
        req: Dict[str, Any] = {"attempt_id": _id(attempt), "args": list(args)}
        for k, v in (("env", list(env) if env else None), ("workdir", workdir), ("user", user),
                     ("timeout_ms", timeout_ms), ("module", module),
                     ("memory_limit_pages", memory_limit_pages)):
            if v is not None:
                req[k] = v
        if tty:
            req.update(tty=True, rows=rows or None, cols=cols or None)
            req = {k: v for k, v in req.items() if v is not None}
        interactive = (stdin is not None and stdin is not False) or tty
        if stdin is not None and stdin is not False:
            req["stdin"] = True
        return ExecStream(self, req, interactive,
                          None if stdin is None or isinstance(stdin, bool) else stdin)

    # ---- export and provenance ----

    def export(self, id: NodeRef, to: Union[str, "os.PathLike[str]", BinaryIO], format: str = "dir", *,
               base: Optional[NodeRef] = None, artifact: Optional[str] = None,
               provenance: Optional[str] = None, preserve_privileged: bool = False) -> ExportResult:
        """Export a node's (or root's) tree with its signed provenance record.

        format "dir": into ``to``, a directory on the daemon's host (absent or
        empty), and the record to ``provenance`` (default to + ".provenance.json").
        format "tar" or "patch" (from ``base`` to id): streamed to ``to`` on
        this machine, a path or a binary file; the record is written to
        ``provenance`` (default, when to is a path, to + ".provenance.json").
        A stream that ends without the daemon's completion mark raises (and
        a file it was written to is removed); one written to a file object
        must then be discarded by the caller.

        Setuid/setgid bits, security.* xattrs and device nodes are left out
        of a dir or tar export (and counted in ``dropped``) unless
        ``preserve_privileged``."""
        if format == "dir":
            if not isinstance(to, (str, os.PathLike)):
                raise InvalidArgument("export dir: to is a directory path on the daemon's host")
            dest = self._hostpath(os.fspath(to)) or ""
            d = self._json("POST", "/v1/export-node", {
                "id": _id(id), "to": dest, "artifact": artifact, "provenance": self._hostpath(provenance),
                "preserve_privileged": True if preserve_privileged else None},
                mutation=True)
            return ExportResult("dir", str(d.get("root_id", "")), dest, int(d.get("bytes", 0)),
                                ProvenanceRecord(dict(d.get("record") or {})),
                                str(d.get("provenance", "")), int(d.get("files", 0)),
                                Dropped.from_json(d.get("dropped")))
        if format not in ("tar", "patch"):
            raise InvalidArgument(f"export: format {format!r}: want dir, tar or patch")
        if format == "patch" and base is None:
            raise InvalidArgument("export patch: base is required")
        if format == "patch" and preserve_privileged:
            raise InvalidArgument("export patch: preserve_privileged is for dir and tar exports")
        dest = os.fspath(to) if isinstance(to, (str, os.PathLike)) else ""
        rec = self.provenance(id, format, base=_id(base) if base is not None else None,
                              artifact=artifact, destination=dest or None)
        if format == "tar":
            path = "/v1/export/" + urllib.parse.quote(_id(id), safe="") + ".tar" + self._q(
                preserve_privileged="true" if preserve_privileged else None)
        else:
            path = "/v1/patch" + self._q(base=_id(base) if base is not None else "", id=_id(id))
        if dest:
            try:
                with open(dest, "wb") as f:
                    root, n, trailers = self._stream_to(path, f, f"export {format} {_id(id)}")
            except Error:
                os.remove(dest)  # what came is cut short: not an export
                raise
        else:
            assert not isinstance(to, (str, os.PathLike))
            root, n, trailers = self._stream_to(path, to, f"export {format} {_id(id)}")
        ppath = provenance or (dest + ".provenance.json" if dest else "")
        if ppath:
            with open(ppath, "w", encoding="utf-8") as f:
                f.write(rec.to_json())
        dropped = None
        if format == "tar":
            t = {k.lower(): v for k, v in trailers.items()}
            try:
                dropped = Dropped.from_json(json.loads(t.get("esf-dropped", "") or "{}"))
            except ValueError:
                dropped = Dropped()
        return ExportResult(format, root or rec.root_id, dest, n, rec, ppath, dropped=dropped)

    def _stream_to(self, path: str, w: BinaryIO, what: str) -> Tuple[str, int, Mapping[str, str]]:
        call = _Call(False, None)
        resp = self._open("GET", path, call, timeout=None)
        n = 0
        try:
            while True:
                b = resp.read1(256 << 10)
                if not b:
                    break
                w.write(b)
                n += len(b)
        except (_http.TransportError, _http.ProtocolError) as e:
            resp.conn.close()
            raise Unavailable(f"{what}: stream broken after {n} bytes: {e}", trace_id=call.trace_id) from e
        resp.close()
        _check_trailers(resp.trailers, f"{what}: after {n} bytes", call.trace_id)
        return resp.header("Esf-Root-Id"), n, resp.trailers

    def provenance(self, id: NodeRef, format: str, *, base: Optional[str] = None,
                   artifact: Optional[str] = None, destination: Optional[str] = None) -> ProvenanceRecord:
        """The signed record for an export of id (dir, tar or patch) made by the caller."""
        d = self._json("GET", "/v1/provenance/" + urllib.parse.quote(_id(id), safe="") + self._q(
            format=format, base=base, artifact=artifact, destination=destination))
        return ProvenanceRecord(dict(d))

    def verify_provenance(self, record: Union[ProvenanceRecord, Mapping[str, Any], bytes, str]) -> ProvenanceReport:
        """Check a provenance record: a ProvenanceRecord, its JSON (bytes or
        str), or the dict. An invalid record is valid=False with problems."""
        if isinstance(record, ProvenanceRecord):
            body = record.to_json().encode()
        elif isinstance(record, bytes):
            body = record
        elif isinstance(record, str):
            body = record.encode()
        else:
            body = json.dumps(dict(record)).encode()
        call = _Call(False, None)
        resp = self._open("POST", "/v1/verify-provenance", call, body, MEDIA_JSON)
        try:
            return ProvenanceReport.from_json(json.loads(resp.read_all(1 << 20)))
        finally:
            resp.close()

    # ---- events ----

    def events(self, *, after: int = 0, group: Optional[str] = None, node: Optional[str] = None,
               attempt: Optional[str] = None, types: Optional[Sequence[str]] = None,
               follow: bool = False, resume: bool = True) -> "EventStream":
        """The event log in seq order (types: exact types or "record.*").
        Iterate the EventStream; without follow it ends at the end of the
        log; with follow it waits for new events until closed. A followed
        stream that breaks is resumed after the last seq seen (resume); the
        request is sent at once, so events after ``after`` are never missed."""
        return EventStream(self, after, group, node, attempt, list(types or []), follow, resume)


def _check_trailers(trailers: Mapping[str, str], what: str, trace_id: str) -> None:
    t = {k.lower(): v for k, v in trailers.items()}
    st = t.get("esf-status", "")
    if st == "ok":
        return
    if st == "error":
        try:
            d = json.loads(t.get("esf-error", ""))
        except ValueError:
            d = None
        if isinstance(d, dict) and isinstance(d.get("code"), str):
            raise make_error(d["code"], f"{what}: {d.get('message', '')}", trace_id=trace_id)
    raise Unavailable(f"{what}: the stream ended without its completion status", trace_id=trace_id)


class ExecFailed(Error):
    """exec(check=True) of a command that exited nonzero."""
    code = "exec_failed"

    def __init__(self, args: Sequence[str], result: ExecResult) -> None:
        super().__init__(f"{list(args)!r} exited {result.exit_code}: "
                         f"{result.stderr.decode('utf-8', 'replace')[-2000:]}")
        self.result = result


class Attempt(AttemptView):
    """An attempt, bound to its client: a context manager that releases the
    attempt on exit unless it was sealed (suspend without keep_running)."""

    def __init__(self, client: Client, view: AttemptView) -> None:
        super().__init__(**view.__dict__)
        self._client = client

    def _update(self, view: AttemptView) -> None:
        self.__dict__.update(view.__dict__)

    def __enter__(self) -> "Attempt":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live:
            try:
                self._update(self._client.release(self.attempt_id))
            except Error:
                if exc[0] is None:
                    raise

    def refresh(self) -> "Attempt":
        """Read the attempt again."""
        a = self._client.inspect(self.attempt_id).attempt
        if a is not None:
            self._update(a)
        return self

    def wait_active(self, timeout: float = 600.0) -> "Attempt":
        """Wait until a queued attempt runs (or raise if it ends instead)."""
        deadline = time.monotonic() + timeout
        delay = 0.02
        while self.state == "queued":
            if time.monotonic() > deadline:
                raise make_error("deadline_exceeded", f"attempt {self.attempt_id} still queued after {timeout}s")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)
            self.refresh()
        if self.state != "active":
            raise make_error("failed_precondition", f"attempt {self.attempt_id} is {self.state}: {self.error}")
        return self

    def exec(self, args: Sequence[str], **kw: Any) -> ExecResult:
        """Client.exec in this attempt."""
        return self._client.exec(self.attempt_id, args, **kw)

    def exec_stream(self, args: Sequence[str], **kw: Any) -> "ExecStream":
        """Client.exec_stream in this attempt."""
        return self._client.exec_stream(self.attempt_id, args, **kw)

    def suspend(self, **kw: Any) -> Node:
        """Seal the attempt's changes into a node (Client.suspend)."""
        r = self._client.suspend(self.attempt_id, **kw)
        self._update(r.attempt)
        return r.node

    def release(self, **kw: Any) -> None:
        """End the attempt, dropping unsealed changes."""
        self._update(self._client.release(self.attempt_id, **kw))

    def renew(self, ttl_ms: Optional[int] = None) -> Lease:
        """Extend the attempt's lease."""
        if self.lease is None:
            self.refresh()
        if self.lease is None:
            raise make_error("failed_precondition", f"attempt {self.attempt_id} holds no lease")
        lease = self._client.renew(self.lease.lease_id, self.lease.token, ttl_ms=ttl_ms)
        self.lease = lease
        return lease


class ExecStream:
    """A running command. Iterate it for Chunks; ``result`` (ExecResult) is
    set when the iteration ends. A context manager: leaving it kills a
    command that still runs."""

    def __init__(self, client: Client, req: Mapping[str, Any], interactive: bool,
                 stdin: Optional[StdinSource]) -> None:
        self._client = client
        self.result: Optional[ExecResult] = None
        self._interactive = interactive
        self._credit = STDIN_WINDOW
        self._pending: List[bytes] = []  # stdin not yet sent (over the window)
        self._stdin_end = False  # the caller ended stdin
        self._end_sent = False
        self._source: Optional[Iterator[bytes]] = None
        self._closed = False
        # A key like any mutation's (never retried: a command is not
        # idempotent, and the daemon does not replay one).
        call = _Call(True, None)
        self._call = call
        body = json.dumps(req).encode()
        ep = client._endpoint
        try:
            conn = _http.Conn(ep.connect(None), None)
        except _http.TransportError as e:
            raise client._transport_error(call, e) from e
        self._conn = conn
        h = client._headers(call, MEDIA_EXEC_STREAM if interactive else MEDIA_JSON)
        h["Connection"] = "close"
        try:
            if interactive:
                h["Transfer-Encoding"] = "chunked"
                conn.send(_http.request_head("POST", "/v1/exec", ep.host_header, h) +
                          _http.chunk(_frame(_F_REQUEST, body)))
                if stdin is not None:
                    self._source = _stdin_chunks(stdin)
                    self._pump()
            else:
                h["Content-Length"] = str(len(body))
                conn.send(_http.request_head("POST", "/v1/exec", ep.host_header, h) + body)
            resp = conn.read_response("POST")
        except (_http.TransportError, _http.ProtocolError, OSError) as e:
            conn.close()
            raise client._transport_error(call, e) from e
        if resp.status // 100 != 2:
            err = client._error_of(resp, call)
            conn.close()
            raise err
        self._resp = resp

    def __enter__(self) -> "ExecStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the exchange (the daemon kills a command that still runs)."""
        if not self._closed:
            self._closed = True
            self._conn.close()

    def write(self, data: bytes) -> None:
        """Send stdin (stdin=True): at once within the window, else as the
        command takes what was sent before."""
        if self._stdin_end:
            raise InvalidArgument("exec: stdin after close_stdin")
        if data:
            self._pending.append(bytes(data))
        self._pump()

    def close_stdin(self) -> None:
        """End stdin (the command reads end-of-file once it took the rest)."""
        self._stdin_end = True
        self._pump()

    def _pump(self) -> None:
        if not self._interactive or self._end_sent or self._closed:
            return
        out: List[bytes] = []
        while self._credit > 0:
            if not self._pending and self._source is not None:
                try:
                    self._pending.append(next(self._source))
                except StopIteration:
                    self._source = None
                    self._stdin_end = True
            if not self._pending:
                break
            p = self._pending[0]
            k = min(len(p), self._credit, _MAX_FRAME)
            if k < len(p):
                self._pending[0] = p[k:]
            else:
                self._pending.pop(0)
            if k:
                out.append(_http.chunk(_frame(_F_STDIN, p[:k])))
                self._credit -= k
        if self._stdin_end and not self._pending and self._source is None:
            out.append(_http.chunk(_frame(_F_STDIN, b"")))
            self._end_sent = True
        if out:
            try:
                self._conn.send(b"".join(out))
            except OSError:
                pass  # the command ended: its exit frame says how

    def resize(self, rows: int, cols: int) -> None:
        """Set the terminal's size (tty=True)."""
        if self._interactive and not self._closed:
            self._conn.send(_http.chunk(_frame(_F_RESIZE, struct.pack(">HH", rows, cols))))

    def __iter__(self) -> Iterator[Chunk]:
        try:
            while self.result is None:
                hdr = self._read(5)
                if len(hdr) < 5:
                    raise Unavailable("exec: the stream ended without an exit frame",
                                      trace_id=self._call.trace_id)
                fid, n = hdr[0], struct.unpack(">I", hdr[1:])[0]
                if n > max(_MAX_FRAME, 1 << 20):
                    raise make_error("internal", f"exec: frame of {n} bytes", trace_id=self._call.trace_id)
                p = self._read(n) if n else b""
                if len(p) < n:
                    raise Unavailable("exec: the stream broke mid-frame", trace_id=self._call.trace_id)
                if fid == _F_STDOUT:
                    yield Chunk("stdout", p)
                elif fid == _F_STDERR:
                    yield Chunk("stderr", p)
                elif fid == _F_ACK and len(p) == 4:
                    self._credit += struct.unpack(">I", p)[0]
                    self._pump()
                elif fid == _F_EXIT:
                    d = json.loads(p)
                    if isinstance(d, dict) and isinstance(d.get("code"), str):
                        raise make_error(d["code"], "exec: " + str(d.get("message", "")),
                                         trace_id=self._call.trace_id)
                    if not isinstance(d, dict):
                        raise make_error("internal", "exec: bad exit frame", trace_id=self._call.trace_id)
                    self.result = ExecResult(int(d.get("exit_code", 0)), int(d.get("ms", 0)),
                                             oom_killed=d.get("oom_killed") is True)
        finally:
            self.close()

    def _read(self, n: int) -> bytes:
        try:
            return self._resp.read_exactly(n)
        except (_http.TransportError, _http.ProtocolError) as e:
            raise Unavailable(f"exec: stream broken: {e}", trace_id=self._call.trace_id) from e


def _blocks(f: BinaryIO) -> Iterator[bytes]:
    """The file in 1 MiB pieces; a read error is the caller's (InvalidArgument),
    not the transport's."""
    while True:
        try:
            b = f.read(1 << 20)
        except OSError as e:
            raise InvalidArgument(f"read the upload: {e}") from e
        if not b:
            return
        yield b


def _frame(fid: int, payload: bytes) -> bytes:
    return struct.pack(">BI", fid, len(payload)) + payload


def _stdin_chunks(src: StdinSource) -> Iterator[bytes]:
    if isinstance(src, (bytes, bytearray, memoryview)):
        yield bytes(src)
        return
    read = getattr(src, "read", None)
    if callable(read):
        while True:
            b = read(32 << 10)
            if not b:
                return
            yield bytes(b)
    for b in src:
        yield bytes(b)


class EventStream:
    """Events as they come: an iterator of Event, and a context manager
    whose exit closes the stream."""

    def __init__(self, client: Client, after: int, group: Optional[str], node: Optional[str],
                 attempt: Optional[str], types: List[str], follow: bool, resume: bool) -> None:
        self._client = client
        self.last_seq = after
        self._params: List[Tuple[str, str]] = [(k, v) for k, v in (
            ("group", group), ("node", node), ("attempt", attempt)) if v]
        self._params += [("type", t) for t in types]
        self._follow = follow
        self._resume = resume
        self._closed = False
        self._call = _Call(False, None)
        self._resp: Optional[_http.Response] = None
        self._buf = b""
        self._open()

    def _open(self) -> None:
        q = list(self._params)
        if self.last_seq:
            q.append(("after", str(self.last_seq)))
        if self._follow:
            q.append(("follow", "1"))
        path = "/v1/events" + ("?" + urllib.parse.urlencode(q) if q else "")
        self._resp = self._client._open("GET", path, self._call,
                                        timeout=None if self._follow else -1.0)
        self._buf = b""

    def __enter__(self) -> "EventStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True
        if self._resp is not None:
            self._resp.conn.close()
            self._resp = None

    def __iter__(self) -> Iterator[Event]:
        return self

    def __next__(self) -> Event:
        failures = 0
        while True:
            if self._closed or self._resp is None:
                raise StopIteration
            i = self._buf.find(b"\n")
            if i >= 0:
                line, self._buf = self._buf[:i], self._buf[i + 1:]
                if not line.strip():
                    continue
                ev = Event.from_json(json.loads(line))
                self.last_seq = ev.seq
                return ev
            try:
                b = self._resp.read1(64 << 10)
                if b:
                    self._buf += b
                    continue
                resp, self._resp = self._resp, None
                resp.close()
                _check_trailers(resp.trailers, "events", self._call.trace_id)
                self.close()
                raise StopIteration
            except (_http.TransportError, _http.ProtocolError, Unavailable) as e:
                if self._resp is not None:
                    self._resp.conn.close()
                    self._resp = None
                failures += 1
                if not (self._follow and self._resume) or failures > self._client.retries:
                    self._closed = True
                    if isinstance(e, Error):
                        raise
                    raise Unavailable(f"events: stream broken after seq {self.last_seq}: {e}",
                                      trace_id=self._call.trace_id) from e
                time.sleep(self._client.backoff * (2 ** failures))
                self._open()


__all__ = ["Client", "Attempt", "ExecStream", "EventStream", "ExecFailed", "DEFAULT_SOCKET",
           "STDIN_WINDOW"]
