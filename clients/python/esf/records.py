"""The typed records of the esf API. Attribute names are the spec's field
names (``node_id``, ``root_id``, ``generation``, ``visits``, ...); times are
the daemon's RFC 3339 strings; caller-owned JSON (``policy``,
``logical_state``, event ``data``) is the decoded value, None when absent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Mapping, Optional

JSONObject = Mapping[str, Any]


def _s(d: JSONObject, k: str) -> str:
    v = d.get(k)
    return v if isinstance(v, str) else ""


def _i(d: JSONObject, k: str) -> int:
    v = d.get(k)
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0


def _f(d: JSONObject, k: str) -> float:
    v = d.get(k)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0


def _b(d: JSONObject, k: str) -> bool:
    return d.get(k) is True


def _ls(d: JSONObject, k: str) -> List[str]:
    v = d.get(k)
    return [x for x in v if isinstance(x, str)] if isinstance(v, list) else []


def _labels(d: JSONObject) -> Dict[str, str]:
    v = d.get("labels")
    return {k: x for k, x in v.items() if isinstance(x, str)} if isinstance(v, dict) else {}


def _obj(d: JSONObject, k: str) -> Optional[JSONObject]:
    v = d.get(k)
    return v if isinstance(v, dict) else None


def _objs(d: JSONObject, k: str) -> List[JSONObject]:
    v = d.get(k)
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []


@dataclass
class RemoteStatus:
    """The remote content store (esfd --cas-remote) and its local cache:
    durability is sync or async; the queue is what waits for upload (async)
    and its last failure; the counters run since the daemon started;
    cache_size is the cache's bound (0: none), cache_used what it holds."""
    location: str
    durability: str
    queue_files: int = 0
    queue_objects: int = 0
    queue_error: str = ""
    fetches: int = 0
    fetched_bytes: int = 0
    uploads: int = 0
    uploaded_bytes: int = 0
    corrupt_fetches: int = 0
    evictions: int = 0
    cache_size: int = 0
    cache_used: int = 0

    @classmethod
    def from_json(cls, d: JSONObject) -> "RemoteStatus":
        return cls(_s(d, "location"), _s(d, "durability"), _i(d, "queue_files"), _i(d, "queue_objects"),
                   _s(d, "queue_error"), _i(d, "fetches"), _i(d, "fetched_bytes"), _i(d, "uploads"),
                   _i(d, "uploaded_bytes"), _i(d, "corrupt_fetches"), _i(d, "evictions"),
                   _i(d, "cache_size"), _i(d, "cache_used"))


@dataclass
class Status:
    version: str
    state_dir: str
    objects: int
    bytes: int
    # The remote content store (esfd --cas-remote); None without one.
    remote: Optional[RemoteStatus] = None

    @classmethod
    def from_json(cls, d: JSONObject) -> "Status":
        r = _obj(d, "remote")
        return cls(_s(d, "version"), _s(d, "state_dir"), _i(d, "objects"), _i(d, "bytes"),
                   RemoteStatus.from_json(r) if r is not None else None)


@dataclass
class Worker:
    """One worker of the graph: its id, API address, capacity (live attempts
    at once, 0 unbounded) and load; self_ marks the one that answered (the
    JSON field ``self``)."""
    id: str
    capacity: int
    live: int
    addr: str = ""
    started: str = ""
    ttl_ms: int = 0
    self_: bool = False

    @classmethod
    def from_json(cls, d: JSONObject) -> "Worker":
        return cls(_s(d, "id"), _i(d, "capacity"), _i(d, "live"), _s(d, "addr"), _s(d, "started"),
                   _i(d, "ttl_ms"), _b(d, "self"))


@dataclass
class Workers:
    """The workers of the graph; fenced says the answering worker lost its
    registration (it can change nothing: restart it)."""
    workers: List[Worker]
    fenced: bool = False

    @classmethod
    def from_json(cls, d: JSONObject) -> "Workers":
        return cls([Worker.from_json(w) for w in _objs(d, "workers")], _b(d, "fenced"))


@dataclass
class ImportResult:
    root_id: str
    files: int
    dirs: int
    symlinks: int
    others: int
    bytes: int
    new_objects: int
    new_bytes: int
    skipped: List[str]

    @classmethod
    def from_json(cls, d: JSONObject) -> "ImportResult":
        return cls(_s(d, "root_id"), _i(d, "files"), _i(d, "dirs"), _i(d, "symlinks"),
                   _i(d, "others"), _i(d, "bytes"), _i(d, "new_objects"), _i(d, "new_bytes"),
                   _ls(d, "skipped"))


@dataclass
class FsckResult:
    """bad: damaged objects; missing (fsck(remote=True) only): reachable
    objects the remote content store lacks."""
    checked: int
    bytes: int
    vanished: int
    bad: List[str]
    missing: List[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, d: JSONObject) -> "FsckResult":
        return cls(_i(d, "checked"), _i(d, "bytes"), _i(d, "vanished"), _ls(d, "bad"), _ls(d, "missing"))


@dataclass
class Group:
    """A group; name is "" unless create_group named it."""
    group_id: str
    root_node_id: str
    canonical_node_id: str
    generation: int
    created_at: str
    policy: Any = None
    name: str = ""

    @classmethod
    def from_json(cls, d: JSONObject) -> "Group":
        return cls(_s(d, "group_id"), _s(d, "root_node_id"), _s(d, "canonical_node_id"),
                   _i(d, "generation"), _s(d, "created_at"), d.get("policy"), _s(d, "name"))


@dataclass
class GroupView(Group):
    """A group as inspect shows it: with its number of nodes."""
    nodes: int = 0

    @classmethod
    def from_json(cls, d: JSONObject) -> "GroupView":
        g = Group.from_json(d)
        return cls(g.group_id, g.root_node_id, g.canonical_node_id, g.generation, g.created_at,
                   g.policy, g.name, _i(d, "nodes"))


@dataclass
class Provenance:
    op: str
    source: str = ""
    attempt_id: str = ""
    executor: str = ""
    environment: Any = None
    idempotency_key: str = ""
    trace_id: str = ""

    @classmethod
    def from_json(cls, d: Optional[JSONObject]) -> "Provenance":
        d = d or {}
        return cls(_s(d, "op"), _s(d, "source"), _s(d, "attempt_id"), _s(d, "executor"),
                   d.get("environment"), _s(d, "idempotency_key"), _s(d, "trace_id"))


@dataclass
class Node:
    node_id: str
    group_id: str
    parents: List[str]
    root_id: str
    status: str  # draft, sealed, terminal, pruned
    provenance: Provenance
    visits: int
    value: float
    created_at: str
    logical_state: Any = None

    @classmethod
    def from_json(cls, d: JSONObject) -> "Node":
        return cls(_s(d, "node_id"), _s(d, "group_id"), _ls(d, "parents"), _s(d, "root_id"),
                   _s(d, "status"), Provenance.from_json(_obj(d, "provenance")), _i(d, "visits"),
                   _f(d, "value"), _s(d, "created_at"), d.get("logical_state"))

    @property
    def mean_value(self) -> float:
        """value / visits (0 before the first visit)."""
        return self.value / self.visits if self.visits else 0.0


@dataclass
class Lease:
    lease_id: str
    attempt_id: str
    node_id: str
    group_id: str
    token: int
    ttl_ms: int
    expires_at: str
    created_at: str

    @classmethod
    def from_json(cls, d: JSONObject) -> "Lease":
        return cls(_s(d, "lease_id"), _s(d, "attempt_id"), _s(d, "node_id"), _s(d, "group_id"),
                   _i(d, "token"), _i(d, "ttl_ms"), _s(d, "expires_at"), _s(d, "created_at"))


@dataclass
class Evaluation:
    evaluation_id: str
    node_id: str
    group_id: str
    evaluator: str
    evaluator_version: str
    reward: float
    verdict: str
    terminal: bool
    backprop: bool
    created_at: str
    attempt_id: str = ""
    evidence: List[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, d: JSONObject) -> "Evaluation":
        return cls(_s(d, "evaluation_id"), _s(d, "node_id"), _s(d, "group_id"), _s(d, "evaluator"),
                   _s(d, "evaluator_version"), _f(d, "reward"), _s(d, "verdict"),
                   _b(d, "terminal"), _b(d, "backprop"), _s(d, "created_at"),
                   _s(d, "attempt_id"), _ls(d, "evidence"))


@dataclass
class NodeView(Node):
    """A node as inspect shows it: ancestry (nearest first, ending at the
    group's root), children, attempts, live leases and evaluations."""
    ancestry: List[str] = field(default_factory=list)
    children: List[str] = field(default_factory=list)
    attempts: List[str] = field(default_factory=list)
    leases: List[Lease] = field(default_factory=list)
    evaluations: List[Evaluation] = field(default_factory=list)

    @classmethod
    def from_json(cls, d: JSONObject) -> "NodeView":
        n = Node.from_json(d)
        return cls(n.node_id, n.group_id, n.parents, n.root_id, n.status, n.provenance, n.visits,
                   n.value, n.created_at, n.logical_state, _ls(d, "ancestry"), _ls(d, "children"),
                   _ls(d, "attempts"), [Lease.from_json(x) for x in _objs(d, "leases")],
                   [Evaluation.from_json(x) for x in _objs(d, "evaluations")])


@dataclass
class AttemptRuntime:
    attempt_id: str
    worker: str
    updated_at: str
    private_delta: str = ""
    mount: str = ""
    data: Any = None

    @classmethod
    def from_json(cls, d: JSONObject) -> "AttemptRuntime":
        return cls(_s(d, "attempt_id"), _s(d, "worker"), _s(d, "updated_at"),
                   _s(d, "private_delta"), _s(d, "mount"), d.get("data"))


# The states of an attempt that hold (or wait for) capacity and a lease.
LIVE_STATES = frozenset({"queued", "active", "quiescing"})


@dataclass
class AttemptView:
    """An attempt record: state is queued, active, quiescing, sealed, failed
    or released; root is where its writable root is mounted (on the daemon's
    host)."""
    attempt_id: str
    node_id: str
    group_id: str
    executor: str
    state: str
    created_at: str
    updated_at: str
    lease_id: str = ""
    retry_of: str = ""
    result_node_id: str = ""
    error: str = ""
    lease: Optional[Lease] = None
    runtime: Optional[AttemptRuntime] = None
    root: str = ""
    labels: Dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: JSONObject) -> "AttemptView":
        lease = _obj(d, "lease")
        rt = _obj(d, "runtime")
        return cls(_s(d, "attempt_id"), _s(d, "node_id"), _s(d, "group_id"), _s(d, "executor"),
                   _s(d, "state"), _s(d, "created_at"), _s(d, "updated_at"), _s(d, "lease_id"),
                   _s(d, "retry_of"), _s(d, "result_node_id"), _s(d, "error"),
                   Lease.from_json(lease) if lease is not None else None,
                   AttemptRuntime.from_json(rt) if rt is not None else None, _s(d, "root"),
                   _labels(d))

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES


@dataclass
class Inspection:
    """What inspect found: kind is group, node or attempt, and that field is set."""
    kind: str
    group: Optional[GroupView] = None
    node: Optional[NodeView] = None
    attempt: Optional[AttemptView] = None

    @classmethod
    def from_json(cls, d: JSONObject) -> "Inspection":
        g, n, a = _obj(d, "group"), _obj(d, "node"), _obj(d, "attempt")
        return cls(_s(d, "kind"), GroupView.from_json(g) if g is not None else None,
                   NodeView.from_json(n) if n is not None else None,
                   AttemptView.from_json(a) if a is not None else None)


@dataclass
class CreateGroupResult:
    group: Group
    node: Node

    @classmethod
    def from_json(cls, d: JSONObject) -> "CreateGroupResult":
        return cls(Group.from_json(_obj(d, "group") or {}), Node.from_json(_obj(d, "node") or {}))


@dataclass
class TreeNode:
    """One node of a group's tree as nested objects: the node, its reward
    (of its newest evaluation, None if never evaluated) and its children (in
    creation order). A merged node appears under each of its parents."""
    node: Node
    reward: Optional[float]
    children: List["TreeNode"] = field(default_factory=list)

    def walk(self) -> Iterator["TreeNode"]:
        """This node and its descendants, depth first."""
        yield self
        for c in self.children:
            yield from c.walk()


@dataclass
class Tree:
    """A group's whole graph: the group, its nodes in creation order, and
    the newest reward of each evaluated node."""
    group: Group
    nodes: List[Node]
    rewards: Dict[str, float]

    @classmethod
    def from_json(cls, d: JSONObject) -> "Tree":
        rw = _obj(d, "rewards") or {}
        return cls(Group.from_json(_obj(d, "group") or {}),
                   [Node.from_json(x) for x in _objs(d, "nodes")],
                   {k: float(v) for k, v in rw.items() if isinstance(v, (int, float))})

    def node(self, node_id: str) -> Node:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise KeyError(node_id)

    @property
    def root(self) -> TreeNode:
        """The tree as nested TreeNodes from the group's root node."""
        tn = {n.node_id: TreeNode(n, self.rewards.get(n.node_id)) for n in self.nodes}
        for n in self.nodes:
            for p in n.parents:
                if p in tn:
                    tn[p].children.append(tn[n.node_id])
        return tn[self.group.root_node_id]


@dataclass
class ForkResult:
    nodes: List[Node]

    @classmethod
    def from_json(cls, d: JSONObject) -> "ForkResult":
        return cls([Node.from_json(x) for x in _objs(d, "nodes")])


@dataclass
class PruneResult:
    pruned: List[str]

    @classmethod
    def from_json(cls, d: JSONObject) -> "PruneResult":
        return cls(_ls(d, "pruned"))


@dataclass
class SuspendResult:
    """The sealed node and the attempt after the seal."""
    node: Node
    attempt: AttemptView

    @classmethod
    def from_json(cls, d: JSONObject) -> "SuspendResult":
        return cls(Node.from_json(_obj(d, "node") or {}),
                   AttemptView.from_json(_obj(d, "attempt") or {}))


@dataclass
class MergeResult:
    node: Node
    base: str
    group: Optional[Group] = None

    @classmethod
    def from_json(cls, d: JSONObject) -> "MergeResult":
        g = _obj(d, "group")
        return cls(Node.from_json(_obj(d, "node") or {}), _s(d, "base"),
                   Group.from_json(g) if g is not None else None)


@dataclass
class EvidenceResult:
    id: str
    size: int
    new: bool

    @classmethod
    def from_json(cls, d: JSONObject) -> "EvidenceResult":
        return cls(_s(d, "id"), _i(d, "size"), _b(d, "new"))


@dataclass
class Change:
    path: str
    kind: str  # added, deleted, modified, type_changed, meta_changed
    meta: str = ""
    old: Optional[JSONObject] = None
    new: Optional[JSONObject] = None


@dataclass
class DiffResult:
    a: str
    b: str
    changes: List[Change]

    @classmethod
    def from_json(cls, d: JSONObject) -> "DiffResult":
        return cls(_s(d, "a"), _s(d, "b"),
                   [Change(_s(c, "path"), _s(c, "kind"), _s(c, "meta"), _obj(c, "old"),
                           _obj(c, "new")) for c in _objs(d, "changes")])


@dataclass
class ProvenanceRecord:
    """A signed provenance record. ``raw`` is the record as the daemon sent
    it, which is what verify_provenance checks; the attributes are read
    from it."""
    raw: Dict[str, Any]

    @property
    def root_id(self) -> str:
        return _s(self.raw, "root_id")

    @property
    def node_id(self) -> str:
        return _s(self.raw, "node_id")

    @property
    def group_id(self) -> str:
        return _s(self.raw, "group_id")

    @property
    def version(self) -> int:
        return _i(self.raw, "version")

    @property
    def parents(self) -> List[str]:
        return _ls(self.raw, "parents")

    @property
    def ancestry(self) -> List[str]:
        return _ls(self.raw, "ancestry")

    @property
    def origin(self) -> Optional[Provenance]:
        """How the node came to be (its provenance), None for a bare root."""
        o = _obj(self.raw, "origin")
        return Provenance.from_json(o) if o is not None else None

    @property
    def policy(self) -> Any:
        return self.raw.get("policy")

    @property
    def attempt(self) -> Optional["AttemptView"]:
        """The attempt whose seal made the node, None if none did."""
        a = _obj(self.raw, "attempt")
        return AttemptView.from_json(a) if a is not None else None

    @property
    def export(self) -> JSONObject:
        return _obj(self.raw, "export") or {}

    @property
    def evaluations(self) -> List[Evaluation]:
        return [Evaluation.from_json(x) for x in _objs(self.raw, "evaluations")]

    @property
    def mac(self) -> str:
        return _s(self.raw, "mac")

    def to_json(self) -> str:
        return json.dumps(self.raw)


@dataclass
class Dropped:
    """What an export left out because it could give privilege on the
    host: setuid/setgid bits of files (``setid``), security.* xattrs and
    device nodes; ``paths`` lists the first 100 affected paths."""
    setid: int = 0
    xattrs: int = 0
    devices: int = 0
    paths: List[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, d: Optional[Mapping[str, Any]]) -> "Dropped":
        d = d or {}
        return cls(int(d.get("setid", 0)), int(d.get("xattrs", 0)), int(d.get("devices", 0)),
                   [str(p) for p in d.get("paths") or []])


@dataclass
class ExportResult:
    """An export (dir, tar or patch) and its provenance record. ``to`` is
    where it was written; ``provenance`` where the record was written (empty
    when it was not). ``dropped`` is what a dir or tar export left out
    (None for a patch)."""
    format: str
    root_id: str
    to: str
    bytes: int
    record: ProvenanceRecord
    provenance: str = ""
    files: int = 0
    dropped: Optional[Dropped] = None


@dataclass
class Problem:
    field: str
    problem: str


@dataclass
class ProvenanceReport:
    valid: bool
    checked: int
    problems: List[Problem]

    @classmethod
    def from_json(cls, d: JSONObject) -> "ProvenanceReport":
        return cls(_b(d, "valid"), _i(d, "checked"),
                   [Problem(_s(p, "field"), _s(p, "problem")) for p in _objs(d, "problems")])


@dataclass
class RemoteCollectReport:
    """What a collection of the remote content store did (or would do)."""
    examined: int = 0
    deleted: int = 0
    bytes_reclaimed: int = 0
    packs_rewritten: int = 0
    packs_deleted: int = 0
    orphans_deleted: int = 0
    kept_young: int = 0

    @classmethod
    def from_json(cls, d: JSONObject) -> "RemoteCollectReport":
        return cls(_i(d, "examined"), _i(d, "deleted"), _i(d, "bytes_reclaimed"), _i(d, "packs_rewritten"),
                   _i(d, "packs_deleted"), _i(d, "orphans_deleted"), _i(d, "kept_young"))


@dataclass
class CollectReport:
    examined: int
    live: int
    deleted: int
    bytes_reclaimed: int
    spared: int
    dry_run: bool
    ms: int
    # A remote collection's report (gc(remote=True)); None otherwise.
    remote: Optional[RemoteCollectReport] = None

    @classmethod
    def from_json(cls, d: JSONObject) -> "CollectReport":
        r = _obj(d, "remote")
        return cls(_i(d, "examined"), _i(d, "live"), _i(d, "deleted"), _i(d, "bytes_reclaimed"),
                   _i(d, "spared"), _b(d, "dry_run"), _i(d, "ms"),
                   RemoteCollectReport.from_json(r) if r is not None else None)


@dataclass
class MountResult:
    dir: str
    root_id: str
    attempt: Optional[AttemptView] = None

    @classmethod
    def from_json(cls, d: JSONObject) -> "MountResult":
        a = _obj(d, "attempt")
        return cls(_s(d, "dir"), _s(d, "root_id"), AttemptView.from_json(a) if a is not None else None)


@dataclass
class Event:
    seq: int
    time: str
    type: str
    group_id: str = ""
    node_id: str = ""
    attempt_id: str = ""
    root_id: str = ""
    lease_id: str = ""
    trace_id: str = ""
    span_id: str = ""
    parent_span_id: str = ""
    idempotency_key: str = ""
    data: Any = None

    @classmethod
    def from_json(cls, d: JSONObject) -> "Event":
        return cls(_i(d, "seq"), _s(d, "time"), _s(d, "type"), _s(d, "group_id"), _s(d, "node_id"),
                   _s(d, "attempt_id"), _s(d, "root_id"), _s(d, "lease_id"), _s(d, "trace_id"),
                   _s(d, "span_id"), _s(d, "parent_span_id"), _s(d, "idempotency_key"), d.get("data"))


@dataclass
class ExecResult:
    """How a command ended (exit_code is 128+N when signal N killed it), and
    its output when the call collected it."""
    exit_code: int
    ms: int
    stdout: bytes = b""
    stderr: bytes = b""
    # The kernel's OOM killer ended the command (exit 137): the attempt
    # hit its memory limit.
    oom_killed: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass
class Chunk:
    """Output of a streaming exec: stream is "stdout" or "stderr"."""
    stream: str
    data: bytes
