package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/fabric"
	"github.com/esf-dev/esf/treediff"
)

// The content operations beyond import and export: collection, merge, diff,
// patch, provenance. Like the graph endpoints, their bodies are the fabric
// and treediff types themselves.

func (s *Server) routeOps() {
	s.handle("POST /v1/gc", true, jsonOp(decodeCollect, s.f.Collect, collectReport))
	s.handle("POST /v1/merge", true, jsonOp(decodeMerge, s.f.Merge, mergeResult))
	s.handle("GET /v1/diff", false, s.diff)
	s.handle("GET /v1/patch", false, s.patch)
	s.handle("POST /v1/export-node", true, jsonOp(decodeExportNode, s.f.Export, exportNodeResult))
	s.handle("GET /v1/provenance/{id}", false, s.provenance)
	s.handle("POST /v1/verify-provenance", false, s.verifyProvenance)
	s.handle("POST /v1/exec", true, s.exec)
}

// decodeCollect takes an empty body as the default collection, as fsck does.
func decodeCollect(r *http.Request) (fabric.CollectRequest, error) {
	if r.ContentLength == 0 {
		return fabric.CollectRequest{}, nil
	}
	return decodeAs(r, collectRequest, nil)
}

func decodeMerge(r *http.Request) (fabric.MergeRequest, error) {
	return decodeAs(r, mergeRequest, func(req *fabric.MergeRequest) error {
		req.LogicalState = absentIfNull(req.LogicalState)
		if len(req.Nodes) == 0 {
			req.Nodes = nil // [] and an omitted list are the same (invalid) request
		}
		return nil
	})
}

func decodeExportNode(r *http.Request) (fabric.ExportRequest, error) {
	return decodeAs(r, exportNodeRequest, func(req *fabric.ExportRequest) error {
		if req.ID == "" {
			return fmt.Errorf("id: empty: %w", errdefs.ErrInvalidArgument)
		}
		var err error
		if req.To, err = hostPath("to", req.To); err != nil {
			return err
		}
		if req.Provenance != "" {
			req.Provenance, err = hostPath("provenance", req.Provenance)
		}
		return err
	})
}

// conflictBody is the error body of a merge conflict: the usual code and
// message, and every conflicting path, so a client need not parse the
// message to find them.
type conflictBody struct {
	errdefs.Error
	Paths []string `json:"paths"`
}

// queryID returns the one value of a required query parameter.
func queryID(r *http.Request, name string) (string, error) {
	v := r.URL.Query()[name]
	if len(v) != 1 || v[0] == "" {
		return "", fmt.Errorf("query parameter %s: want exactly one non-empty value: %w", name, errdefs.ErrInvalidArgument)
	}
	return v[0], nil
}

// diff lists the changes from tree a to tree b (node or root ids) as one
// JSON document. Directories added or deleted are expanded, so every path
// that differs is listed.
func (s *Server) diff(w http.ResponseWriter, r *http.Request) error {
	a, err := queryID(r, "a")
	if err != nil {
		return err
	}
	b, err := queryID(r, "b")
	if err != nil {
		return err
	}
	ctx := r.Context()
	ra, err := s.f.ResolveRoot(ctx, a)
	if err != nil {
		return err
	}
	rb, err := s.f.ResolveRoot(ctx, b)
	if err != nil {
		return err
	}
	changes := []v1.Change{}
	err = treediff.DiffWith(ctx, s.f.Store(), ra, rb, treediff.Options{Expand: true}, func(c treediff.Change) error {
		changes = append(changes, changeView(c))
		return nil
	})
	if err != nil {
		return fmt.Errorf("diff %s %s: %w", a, b, err)
	}
	writeJSON(w, http.StatusOK, v1.DiffResponse{A: ra.String(), B: rb.String(), Changes: changes})
	return nil
}

// patch streams a git patch from base to id, with the completion trailers
// of a tar export: a patch cut short must not pass for a whole one.
func (s *Server) patch(w http.ResponseWriter, r *http.Request) error {
	base, err := queryID(r, "base")
	if err != nil {
		return err
	}
	id, err := queryID(r, "id")
	if err != nil {
		return err
	}
	ctx := r.Context()
	rb, err := s.f.ResolveRoot(ctx, base)
	if err != nil {
		return err
	}
	root, err := s.f.ResolveRoot(ctx, id)
	if err != nil {
		return err
	}
	pw := &lazyStream{w: w, start: func(h http.Header) {
		h.Set("Content-Type", v1.MediaPatch)
		h.Set(v1.HeaderRootID, root.String())
		h.Set("Trailer", v1.TrailerStatus+", "+v1.TrailerError)
	}}
	err = treediff.Patch(ctx, s.f.Store(), rb, root, pw)
	if err != nil && !pw.started {
		return fmt.Errorf("patch %s %s: %w", base, id, err)
	}
	pw.begin() // an empty patch (identical trees) is still a complete one
	if err != nil {
		w.Header().Set(v1.TrailerStatus, "error")
		w.Header().Set(v1.TrailerError, asciiJSON(errdefs.Wire(err)))
		return err
	}
	w.Header().Set(v1.TrailerStatus, "ok")
	return nil
}

// provenance returns the signed record of an export of {id} the client
// makes itself (a tar or patch streamed to a file of its own).
func (s *Server) provenance(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	for k, v := range q {
		switch k {
		case "format", "base", "artifact", "destination":
			if len(v) != 1 {
				return fmt.Errorf("query parameter %s given %d times: %w", k, len(v), errdefs.ErrInvalidArgument)
			}
		default:
			return fmt.Errorf("unknown query parameter %q: %w", k, errdefs.ErrInvalidArgument)
		}
	}
	info := fabric.ExportInfo{Format: q.Get("format"), Base: q.Get("base"), Artifact: q.Get("artifact"), Destination: q.Get("destination")}
	switch info.Format {
	case "dir", "tar", "patch":
	default:
		return fmt.Errorf("format %q: want dir, tar or patch: %w", info.Format, errdefs.ErrInvalidArgument)
	}
	rec, err := s.f.Provenance(r.Context(), r.PathValue("id"), info)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, provenanceRecord(rec))
	return nil
}

// verifyProvenance checks a record as given: its body is the record, not a
// request wrapping it, so `curl --data-binary @x.provenance.json` works.
func (s *Server) verifyProvenance(w http.ResponseWriter, r *http.Request) error {
	raw, err := io.ReadAll(io.LimitReader(r.Body, maxJSONBody+1))
	if err != nil {
		return fmt.Errorf("verify provenance: read body: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if len(raw) > maxJSONBody {
		return fmt.Errorf("request body over %d bytes: %w", maxJSONBody, errdefs.ErrInvalidArgument)
	}
	if !json.Valid(raw) {
		return fmt.Errorf("verify provenance: body is not JSON: %w", errdefs.ErrInvalidArgument)
	}
	rep, err := s.f.VerifyProvenance(r.Context(), raw)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, provenanceReport(rep))
	return nil
}

// errorBody is what writeError sends for err: the wire error, plus the
// conflicting paths of a merge conflict.
func errorBody(err error) (int, any) {
	e := errdefs.Wire(err)
	var ce *treediff.ConflictError
	if errors.As(err, &ce) && e.Code == errdefs.CodeConflict {
		return HTTPStatus(e.Code), conflictBody{Error: *e, Paths: ce.Paths}
	}
	return HTTPStatus(e.Code), e
}
