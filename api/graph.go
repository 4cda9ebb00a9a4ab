package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/esf-dev/esf/api/internal/wire"
	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/fabric"
)

// The graph and attempt endpoints. Their bodies are the fabric request and
// result types themselves (their JSON tags are the spec's field names), so
// the API adds no second vocabulary; the decoders below only check what
// the transport owns (strict JSON, host paths) and leave the meaning of a
// request to fabric.

func (s *Server) routeGraph() {
	s.handle("POST /v1/groups", true, s.createGroup)
	s.handle("POST /v1/fork", true, jsonOp(decodeFork, s.f.Fork, forkResult))
	s.handle("GET /v1/inspect/{id}", false, s.inspect)
	s.handle("GET /v1/tree/{group_id}", false, s.tree)
	s.handle("POST /v1/promote", true, jsonOp(decodePromote, s.f.Promote, groupView))
	s.handle("POST /v1/evidence", true, s.putEvidence)
	s.handle("POST /v1/evaluate", true, jsonOp(decodeEvaluate, s.f.Evaluate, evaluationView))
	s.handle("POST /v1/prune", true, jsonOp(decodePrune, s.f.Prune, pruneResult))
}

func (s *Server) routeAttempts() {
	s.handle("POST /v1/activate", true, jsonOp(decodeActivate, s.f.Activate, attemptView))
	s.handle("POST /v1/suspend", true, jsonOp(decodeSuspend, s.f.Suspend, suspendResult))
	s.handle("POST /v1/release", true, jsonOp(decodeRelease, s.f.Release, attemptView))
	s.handle("POST /v1/retry", true, jsonOp(decodeRetry, s.f.Retry, attemptView))
	s.handle("POST /v1/renew", true, jsonOp(decodeRenew, s.f.Renew, leaseView))
	s.handle("POST /v1/mount", true, jsonOp(decodeMount, s.f.Mount, mountResult))
	s.handle("POST /v1/umount", true, jsonOp(decodeUmount, s.f.Umount, mountResult))
}

// jsonOp is the handler of an endpoint that decodes one request, calls one
// fabric operation and returns the view of its result.
func jsonOp[Req, Res, View any](decode func(*http.Request) (Req, error), op func(context.Context, Req) (Res, error),
	view func(Res) View) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		req, err := decode(r)
		if err != nil {
			return err
		}
		res, err := op(r.Context(), req)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, view(res))
		return nil
	}
}

// decodeRequest decodes a JSON request body strictly (see decodeJSON) and
// then lets check normalise and validate it.
func decodeRequest[T any](r *http.Request, check func(*T) error) (T, error) {
	var zero T
	if mt := wire.MediaType(r.Header.Get("Content-Type")); mt != "" && mt != v1.MediaJSON {
		return zero, fmt.Errorf("Content-Type %q: want %s: %w", mt, v1.MediaJSON, errdefs.ErrInvalidArgument)
	}
	req, err := decodeJSON[T](r.Body)
	if err != nil {
		return zero, err
	}
	if check != nil {
		if err := check(&req); err != nil {
			return zero, err
		}
	}
	return req, nil
}

// decodeAs decodes the request view V strictly, converts it to the fabric
// request and lets check normalise and validate that.
func decodeAs[V, F any](r *http.Request, conv func(V) F, check func(*F) error) (F, error) {
	var zero F
	v, err := decodeRequest[V](r, nil)
	if err != nil {
		return zero, err
	}
	f := conv(v)
	if check != nil {
		if err := check(&f); err != nil {
			return zero, err
		}
	}
	return f, nil
}

// absentIfNull makes an explicit JSON null mean "not given", as an omitted
// field does, so both fingerprint and behave alike.
func absentIfNull(b json.RawMessage) json.RawMessage {
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		return nil
	}
	return b
}

func decodeCreateGroup(r *http.Request) (fabric.CreateGroupRequest, error) {
	return decodeAs(r, createGroupRequest, func(req *fabric.CreateGroupRequest) error {
		req.Policy = absentIfNull(req.Policy)
		req.LogicalState = absentIfNull(req.LogicalState)
		if req.RootID != "" {
			return nil // source, if any, only describes where the root came from
		}
		if req.Source == "" {
			return fmt.Errorf("create group: root_id or source is required: %w", errdefs.ErrInvalidArgument)
		}
		var err error
		req.Source, err = hostPath("source", req.Source)
		return err
	})
}

// createGroup imports source first when no root_id is given. The import is
// content-addressed, so a retry stores nothing new and finds the same root;
// the create itself is keyed by the request's idempotency key.
func (s *Server) createGroup(w http.ResponseWriter, r *http.Request) error {
	req, err := decodeCreateGroup(r)
	if err != nil {
		return err
	}
	ctx := r.Context()
	var res fabric.CreateGroupResult
	if req.RootID == "" {
		res, err = s.f.CreateGroupFrom(ctx, fabric.ImportSource{Path: req.Source}, req)
	} else {
		res, err = s.f.CreateGroup(ctx, req)
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, createGroupResult(res))
	return nil
}

func decodeFork(r *http.Request) (fabric.ForkRequest, error) {
	return decodeAs(r, forkRequest, func(req *fabric.ForkRequest) error {
		req.LogicalState = absentIfNull(req.LogicalState)
		return nil
	})
}

func decodePromote(r *http.Request) (fabric.PromoteRequest, error) {
	return decodeAs(r, promoteRequest, nil)
}

func decodeEvaluate(r *http.Request) (fabric.EvaluateRequest, error) {
	return decodeAs(r, evaluateRequest, func(req *fabric.EvaluateRequest) error {
		if len(req.Evidence) == 0 {
			req.Evidence = nil // [] and absent are the same request
		}
		return nil
	})
}

func decodePrune(r *http.Request) (fabric.PruneRequest, error) {
	return decodeAs(r, pruneRequest, nil)
}

func (s *Server) inspect(w http.ResponseWriter, r *http.Request) error {
	res, err := s.f.Inspect(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, inspection(res))
	return nil
}

// tree answers a v1.TreeResponse, written from fabric.TreeRecords: the
// node records pass through as stored (the JSON of journal.Node, which is
// the JSON of v1.Node: same fields and names; checkTreePassThrough fails
// the day they differ, and then this must convert), one snapshot
// for nodes and rewards, and compact, not indented as other answers are.
// Decoding 10,000 records to encode them again, and indenting megabytes,
// were most of the time the web view waited for a large tree (issue 23).
func (s *Server) tree(w http.ResponseWriter, r *http.Request) error {
	tr, err := s.f.TreeRecords(r.Context(), r.PathValue("group_id"))
	if err != nil {
		return err
	}
	group, err := json.Marshal(groupView(tr.Group))
	if err != nil {
		return err
	}
	rewards, err := json.Marshal(tr.Rewards)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", v1.MediaJSON)
	w.WriteHeader(http.StatusOK)
	// The records are compact JSON already (json.Marshal wrote them and
	// GetNodeJSON checked them), so they are copied, not re-encoded: the
	// bytes are the ones json.Encoder would write for tr.
	bw := bufio.NewWriterSize(w, 64<<10)
	bw.WriteString(`{"group":`)
	bw.Write(group)
	bw.WriteString(`,"nodes":[`)
	for i, n := range tr.Nodes {
		if i > 0 {
			bw.WriteByte(',')
		}
		bw.Write(n)
	}
	bw.WriteString(`],"rewards":`)
	bw.Write(rewards)
	bw.WriteString("}\n")
	_ = bw.Flush() // a write error means the client left; nothing to tell it
	return nil
}

// putEvidence stores the body, any bytes, as one object. It is naturally
// idempotent: the same bytes are the same object.
func (s *Server) putEvidence(w http.ResponseWriter, r *http.Request) error {
	info, created, err := s.f.Store().Put(r.Context(), r.Body)
	if err != nil {
		return fmt.Errorf("store evidence: %w", err)
	}
	writeJSON(w, http.StatusOK, v1.EvidenceResponse{ID: idView(info.ID), Size: info.Size, New: created})
	return nil
}

func decodeActivate(r *http.Request) (fabric.ActivateRequest, error) {
	return decodeAs(r, activateRequest, func(req *fabric.ActivateRequest) error {
		if req.Root == "" {
			return nil
		}
		var err error
		req.Root, err = hostPath("root", req.Root)
		return err
	})
}

func decodeSuspend(r *http.Request) (fabric.SuspendRequest, error) {
	return decodeAs(r, suspendRequest, func(req *fabric.SuspendRequest) error {
		req.LogicalState = absentIfNull(req.LogicalState)
		return nil
	})
}

func decodeRelease(r *http.Request) (fabric.ReleaseRequest, error) {
	return decodeAs(r, releaseRequest, nil)
}

func decodeRetry(r *http.Request) (fabric.RetryRequest, error) {
	return decodeAs(r, retryRequest, nil)
}

func decodeRenew(r *http.Request) (fabric.RenewRequest, error) {
	return decodeAs(r, renewRequest, nil)
}

func decodeMount(r *http.Request) (fabric.MountRequest, error) {
	return decodeAs(r, mountRequest, func(req *fabric.MountRequest) error {
		var err error
		req.Dir, err = hostPath("dir", req.Dir)
		return err
	})
}

func decodeUmount(r *http.Request) (fabric.UmountRequest, error) {
	return decodeAs(r, umountRequest, func(req *fabric.UmountRequest) error {
		var err error
		req.Dir, err = hostPath("dir", req.Dir)
		return err
	})
}
