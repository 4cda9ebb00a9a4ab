"""esf: the Python client of esfd, the execution-state fabric.

    import esf

    c = esf.Client()                      # ESF_SOCKET, or ESF_HOST + ESF_TOKEN_FILE
    g = c.create_group("/srv/repo")       # a directory on the daemon's host
    kid = c.fork(g.node, n=1)[0]
    with c.activate(kid, "runc") as a:    # released on exit unless sealed
        print(a.exec(["/bin/sh", "-c", "make test"]).exit_code)
        node = a.suspend()
    c.evaluate(node, "tests@1", reward=1.0, backprop=True)

Standard library only; Python 3.9 or later.
"""

from .client import (DEFAULT_SOCKET, STDIN_WINDOW, Attempt, Client, EventStream, ExecFailed,
                     ExecStream)
from .errors import (Conflict, Corrupt, DeadlineExceeded, Error, FailedPrecondition, Internal,
                     InvalidArgument, NotFound, QuotaExceeded, StaleGeneration, Unauthenticated,
                     Unavailable, Unsupported)
from .records import (AttemptRuntime, AttemptView, Change, Chunk, CollectReport, CreateGroupResult,
                      DiffResult, Dropped, Evaluation, Event, EvidenceResult, ExecResult, ExportResult,
                      FsckResult, Group, GroupView, ImportResult, Inspection, Lease, MergeResult,
                      MountResult, Node, NodeView, Problem, Provenance, ProvenanceRecord,
                      ProvenanceReport, RemoteCollectReport, RemoteStatus, Status, SuspendResult,
                      Tree, TreeNode, Worker, Workers)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_SOCKET", "STDIN_WINDOW", "Attempt", "Client", "EventStream", "ExecFailed", "ExecStream",
    "Conflict", "Corrupt", "DeadlineExceeded", "Error", "FailedPrecondition", "Internal",
    "InvalidArgument", "NotFound", "QuotaExceeded", "StaleGeneration", "Unauthenticated",
    "Unavailable", "Unsupported",
    "AttemptRuntime", "AttemptView", "Change", "Chunk", "CollectReport", "CreateGroupResult",
    "DiffResult", "Dropped", "Evaluation", "Event", "EvidenceResult", "ExecResult", "ExportResult",
    "FsckResult", "Group", "GroupView", "ImportResult", "Inspection", "Lease", "MergeResult",
    "MountResult", "Node", "NodeView", "Problem", "Provenance", "ProvenanceRecord",
    "ProvenanceReport", "RemoteCollectReport", "RemoteStatus", "Status", "SuspendResult", "Tree",
    "TreeNode", "Worker", "Workers",
]
