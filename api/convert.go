package api

import (
	"encoding/json"
	"strings"

	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/s3"
	"github.com/esf-dev/esf/export"
	"github.com/esf-dev/esf/fabric"
	"github.com/esf-dev/esf/journal"
	"github.com/esf-dev/esf/treediff"
)

// The one place where the daemon's records (journal, fabric, cas) become
// the /v1 views (package v1) and the other way round. A record may change
// on disk without changing /v1 as long as this file keeps the view.
//
// Flat records convert with a Go conversion, which compiles only while the
// two structs have the same fields: a field added to one side and not the
// other breaks the build here, and this file decides what the view shows.
// convert_test.go pins that the views encode as the records did.

// Requests: the view is the request.

func createGroupRequest(r v1.CreateGroupRequest) fabric.CreateGroupRequest {
	return fabric.CreateGroupRequest(r)
}
func forkRequest(r v1.ForkRequest) fabric.ForkRequest             { return fabric.ForkRequest(r) }
func promoteRequest(r v1.PromoteRequest) fabric.PromoteRequest    { return fabric.PromoteRequest(r) }
func evaluateRequest(r v1.EvaluateRequest) fabric.EvaluateRequest { return fabric.EvaluateRequest(r) }
func pruneRequest(r v1.PruneRequest) fabric.PruneRequest          { return fabric.PruneRequest(r) }
func activateRequest(r v1.ActivateRequest) fabric.ActivateRequest { return fabric.ActivateRequest(r) }
func suspendRequest(r v1.SuspendRequest) fabric.SuspendRequest    { return fabric.SuspendRequest(r) }
func releaseRequest(r v1.ReleaseRequest) fabric.ReleaseRequest    { return fabric.ReleaseRequest(r) }
func retryRequest(r v1.RetryRequest) fabric.RetryRequest          { return fabric.RetryRequest(r) }
func renewRequest(r v1.RenewRequest) fabric.RenewRequest          { return fabric.RenewRequest(r) }
func mountRequest(r v1.MountRequest) fabric.MountRequest          { return fabric.MountRequest(r) }
func umountRequest(r v1.UmountRequest) fabric.UmountRequest       { return fabric.UmountRequest(r) }
func execRequest(r v1.ExecRequest) fabric.ExecRequest             { return fabric.ExecRequest(r) }
func collectRequest(r v1.CollectRequest) fabric.CollectRequest    { return fabric.CollectRequest(r) }
func mergeRequest(r v1.MergeRequest) fabric.MergeRequest          { return fabric.MergeRequest(r) }
func exportNodeRequest(r v1.ExportNodeRequest) fabric.ExportRequest {
	return fabric.ExportRequest(r)
}

// Records and results.

func groupView(g journal.Group) v1.Group                 { return v1.Group(g) }
func leaseView(l journal.Lease) v1.Lease                 { return v1.Lease(l) }
func evaluationView(e journal.Evaluation) v1.Evaluation  { return v1.Evaluation(e) }
func eventView(e journal.Event) v1.Event                 { return v1.Event(e) }
func pruneResult(r fabric.PruneResult) v1.PruneResult    { return v1.PruneResult(r) }
func execResult(r fabric.ExecResult) v1.ExecResult       { return v1.ExecResult(r) }
func droppedView(d export.Dropped) v1.Dropped            { return v1.Dropped(d) }
func remoteStatus(r fabric.RemoteStatus) v1.RemoteStatus { return v1.RemoteStatus(r) }
func runtimeView(r journal.AttemptRuntime) v1.AttemptRuntime {
	r.Data = hideEnvValues(r.Data)
	return v1.AttemptRuntime(r)
}

// hideEnvValues returns a runtime record's data with its container
// environment cut to the variables' names: their values may be secrets
// (an E2B sandbox's envVars), and the view is shown to anyone with an API
// token (inspect, esfctl, the UI), as the attempt's provenance keeps the
// names only. Data without an environment is returned as it is.
func hideEnvValues(data json.RawMessage) json.RawMessage {
	var d map[string]json.RawMessage
	if json.Unmarshal(data, &d) != nil {
		return data
	}
	var c map[string]json.RawMessage
	if json.Unmarshal(d["container"], &c) != nil {
		return data
	}
	var env []string
	if json.Unmarshal(c["env"], &env) != nil || len(env) == 0 {
		return data
	}
	for i, kv := range env {
		env[i], _, _ = strings.Cut(kv, "=")
	}
	var err error
	if c["env"], err = json.Marshal(env); err != nil {
		return nil
	}
	if d["container"], err = json.Marshal(c); err != nil {
		return nil
	}
	out, err := json.Marshal(d)
	if err != nil {
		return nil // never the values
	}
	return out
}
func problemView(p fabric.ProvenanceProblem) v1.ProvenanceProblem {
	return v1.ProvenanceProblem(p)
}
func remoteCollectReport(r s3.CollectReport) v1.RemoteCollectReport {
	return v1.RemoteCollectReport(r)
}

func nodeView(n journal.Node) v1.Node {
	return v1.Node{
		NodeID:       n.NodeID,
		GroupID:      n.GroupID,
		Parents:      n.Parents,
		RootID:       n.RootID,
		LogicalState: n.LogicalState,
		Status:       v1.NodeStatus(n.Status),
		Provenance:   v1.Provenance(n.Provenance),
		Visits:       n.Visits,
		Value:        n.Value,
		CreatedAt:    n.CreatedAt,
	}
}

func attemptRecord(a journal.Attempt) v1.Attempt {
	return v1.Attempt{
		AttemptID:    a.AttemptID,
		NodeID:       a.NodeID,
		GroupID:      a.GroupID,
		Executor:     a.Executor,
		LeaseID:      a.LeaseID,
		State:        v1.AttemptState(a.State),
		RetryOf:      a.RetryOf,
		ResultNodeID: a.ResultNodeID,
		Error:        a.Error,
		Labels:       a.Labels,
		CreatedAt:    a.CreatedAt,
		UpdatedAt:    a.UpdatedAt,
	}
}

func attemptView(a fabric.AttemptView) v1.AttemptView {
	return v1.AttemptView{
		Attempt: attemptRecord(a.Attempt),
		Lease:   ptr(a.Lease, leaseView),
		Runtime: ptr(a.Runtime, runtimeView),
		Root:    a.Root,
	}
}

func inspection(in fabric.Inspection) v1.Inspection {
	return v1.Inspection{
		Kind: in.Kind,
		Group: ptr(in.Group, func(g fabric.GroupView) v1.GroupView {
			return v1.GroupView{Group: groupView(g.Group), Nodes: g.Nodes}
		}),
		Node: ptr(in.Node, func(n fabric.NodeView) v1.NodeView {
			return v1.NodeView{
				Node:        nodeView(n.Node),
				Ancestry:    n.Ancestry,
				Children:    n.Children,
				Attempts:    n.Attempts,
				Leases:      each(n.Leases, leaseView),
				Evaluations: each(n.Evaluations, evaluationView),
			}
		}),
		Attempt: ptr(in.Attempt, attemptView),
	}
}

func treeView(t fabric.TreeView) v1.TreeView {
	return v1.TreeView{Group: groupView(t.Group), Nodes: each(t.Nodes, nodeView)}
}

func createGroupResult(r fabric.CreateGroupResult) v1.CreateGroupResult {
	return v1.CreateGroupResult{Group: groupView(r.Group), Node: nodeView(r.Node)}
}

func forkResult(r fabric.ForkResult) v1.ForkResult {
	return v1.ForkResult{Nodes: each(r.Nodes, nodeView)}
}

func mergeResult(r fabric.MergeResult) v1.MergeResult {
	return v1.MergeResult{Node: nodeView(r.Node), Base: r.Base, Group: ptr(r.Group, groupView)}
}

func suspendResult(r fabric.SuspendResult) v1.SuspendResult {
	return v1.SuspendResult{Node: nodeView(r.Node), Attempt: attemptView(r.Attempt)}
}

func mountResult(r fabric.MountResult) v1.MountResult {
	return v1.MountResult{Dir: r.Dir, RootID: r.RootID, Attempt: ptr(r.Attempt, attemptView)}
}

func collectReport(r fabric.CollectReport) v1.CollectReport {
	return v1.CollectReport{
		GCReport: v1.GCReport(r.Report),
		Millis:   r.Millis,
		Remote:   ptr(r.Remote, remoteCollectReport),
	}
}

func provenanceRecord(r fabric.ProvenanceRecord) v1.ProvenanceRecord {
	return v1.ProvenanceRecord{
		Version:     r.Version,
		RootID:      r.RootID,
		NodeID:      r.NodeID,
		GroupID:     r.GroupID,
		Parents:     r.Parents,
		Ancestry:    r.Ancestry,
		Origin:      ptr(r.Origin, func(p journal.Provenance) v1.Provenance { return v1.Provenance(p) }),
		Policy:      r.Policy,
		Attempt:     ptr(r.Attempt, attemptRecord),
		Evaluations: each(r.Evaluations, evaluationView),
		Export:      v1.ExportInfo(r.Export),
		MAC:         r.MAC,
	}
}

func provenanceReport(r fabric.ProvenanceReport) v1.ProvenanceReport {
	return v1.ProvenanceReport{Valid: r.Valid, Checked: r.Checked, Problems: each(r.Problems, problemView)}
}

func exportNodeResult(r fabric.ExportResult) v1.ExportNodeResult {
	return v1.ExportNodeResult{
		RootID:     r.RootID,
		Files:      r.Files,
		Bytes:      r.Bytes,
		Provenance: r.Provenance,
		Record:     provenanceRecord(r.Record),
		Dropped:    droppedView(r.Dropped),
	}
}

func idView(id cas.ID) v1.ID { return v1.ID(id) }

// idList is ids as a never-null list.
func idList(ids []cas.ID) []v1.ID {
	if ids == nil {
		return []v1.ID{}
	}
	return each(ids, idView)
}

func entryView(e cas.Entry) v1.Entry {
	return v1.Entry{
		Name:      e.Name,
		Type:      v1.Type(e.Type),
		Attr:      v1.Attr{Mode: e.Mode, UID: e.UID, GID: e.GID, MtimeNs: e.MtimeNs, Xattrs: each(e.Xattrs, func(x cas.Xattr) v1.Xattr { return v1.Xattr(x) })},
		Size:      e.Size,
		ID:        idView(e.ID),
		Target:    e.Target,
		Major:     e.Major,
		Minor:     e.Minor,
		LinkGroup: e.LinkGroup,
		Nlink:     e.Nlink,
		Holes:     each(e.Holes, func(h cas.Hole) v1.Hole { return v1.Hole(h) }),
	}
}

func changeView(c treediff.Change) v1.Change {
	return v1.Change{Path: c.Path, Kind: c.Kind.String(), Meta: c.Meta.String(),
		Old: ptr(c.Old, entryView), New: ptr(c.New, entryView)}
}

// each converts a slice, keeping nil nil and empty empty (the JSON of the
// two differs).
func each[S, T any](in []S, f func(S) T) []T {
	if in == nil {
		return nil
	}
	out := make([]T, len(in))
	for i, s := range in {
		out[i] = f(s)
	}
	return out
}

// ptr converts through a pointer, keeping nil nil.
func ptr[S, T any](in *S, f func(S) T) *T {
	if in == nil {
		return nil
	}
	t := f(*in)
	return &t
}
