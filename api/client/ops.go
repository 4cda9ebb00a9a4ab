package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/errdefs"
)

// PathsError is a conflict that names the paths it is about (a merge's
// conflicting paths). It wraps the *errdefs.Error of the response, so
// errors.Is(err, errdefs.ErrConflict) and errdefs.CodeOf work on it.
type PathsError struct {
	Err   *errdefs.Error
	Paths []string
}

func (e *PathsError) Error() string { return e.Err.Error() }
func (e *PathsError) Unwrap() error { return e.Err }

// Collect garbage-collects the daemon's store (or, dry, counts what it
// would delete).
func (c *Client) Collect(ctx context.Context, req v1.CollectRequest, opt CallOptions) (*v1.CollectReport, error) {
	return callFor[v1.CollectReport](ctx, c, http.MethodPost, "/v1/gc", req, opt)
}

// Merge merges sealed nodes into a new one. A conflict is a *PathsError
// listing every conflicting path.
func (c *Client) Merge(ctx context.Context, req v1.MergeRequest, opt CallOptions) (*v1.MergeResult, error) {
	return callFor[v1.MergeResult](ctx, c, http.MethodPost, "/v1/merge", req, opt)
}

// Diff lists the changes from a to b (node or root ids).
func (c *Client) Diff(ctx context.Context, a, b string, opt CallOptions) (*v1.DiffResponse, error) {
	q := url.Values{"a": {a}, "b": {b}}
	return callFor[v1.DiffResponse](ctx, c, http.MethodGet, "/v1/diff?"+q.Encode(), nil, opt)
}

// ExportNode writes a node's or root's tree (or one directory of it) to a
// directory on the daemon's host, and its provenance record beside it.
func (c *Client) ExportNode(ctx context.Context, req v1.ExportNodeRequest, opt CallOptions) (*v1.ExportNodeResult, error) {
	return callFor[v1.ExportNodeResult](ctx, c, http.MethodPost, "/v1/export-node", req, opt)
}

// Provenance returns the signed record for an export of id the caller
// makes itself; info.ExportedAt is set by the daemon.
func (c *Client) Provenance(ctx context.Context, id string, info v1.ExportInfo, opt CallOptions) (*v1.ProvenanceRecord, error) {
	q := url.Values{"format": {info.Format}}
	for k, v := range map[string]string{"base": info.Base, "artifact": info.Artifact, "destination": info.Destination} {
		if v != "" {
			q.Set(k, v)
		}
	}
	return callFor[v1.ProvenanceRecord](ctx, c, http.MethodGet, "/v1/provenance/"+url.PathEscape(id)+"?"+q.Encode(), nil, opt)
}

// VerifyProvenance checks a provenance record (its JSON as written by an
// export) against the daemon's key, graph and store.
func (c *Client) VerifyProvenance(ctx context.Context, record []byte, opt CallOptions) (*v1.ProvenanceReport, error) {
	if !json.Valid(record) {
		return nil, &errdefs.Error{Code: errdefs.CodeInvalidArgument, Message: "verify provenance: the record is not JSON"}
	}
	req, err := c.newRequest(ctx, http.MethodPost, "/v1/verify-provenance", bytes.NewReader(record), v1.MediaJSON, opt)
	if err != nil {
		return nil, err
	}
	resp, err := c.do(req)
	if err != nil {
		return nil, err
	}
	var out v1.ProvenanceReport
	if err := decodeResponse(ctx, c, resp, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Patch streams a git patch from base to id into w. As with ExportTar, on
// error what was written is a truncated patch and must be discarded.
func (c *Client) Patch(ctx context.Context, base, id string, w io.Writer) (*ExportTarResult, error) {
	q := url.Values{"base": {base}, "id": {id}}
	req, err := c.newRequest(ctx, http.MethodGet, "/v1/patch?"+q.Encode(), nil, "", CallOptions{})
	if err != nil {
		return nil, err
	}
	resp, err := c.do(req)
	if err != nil {
		return nil, err
	}
	return c.readStream(ctx, resp, "patch "+id, w)
}

// readStream copies a streamed body with completion trailers into w.
func (c *Client) readStream(ctx context.Context, resp *http.Response, what string, w io.Writer) (*ExportTarResult, error) {
	defer resp.Body.Close()
	res := &ExportTarResult{RootID: resp.Header.Get(v1.HeaderRootID)}
	tw := &trackingWriter{w: w}
	n, err := io.Copy(tw, resp.Body)
	res.Bytes = n
	if tw.err != nil {
		return nil, &errdefs.Error{Code: errdefs.CodeOf(tw.err), Message: fmt.Sprintf("%s: write: %v", what, tw.err)}
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, c.transportError(ctx, err)
		}
		return nil, &errdefs.Error{Code: errdefs.CodeUnavailable, Message: fmt.Sprintf("%s: stream broken after %d bytes: %v", what, n, err)}
	}
	switch resp.Trailer.Get(v1.TrailerStatus) {
	case "ok":
		return res, nil
	case "error":
		var e errdefs.Error
		if json.Unmarshal([]byte(resp.Trailer.Get(v1.TrailerError)), &e) == nil && e.Code != "" {
			e.Message = fmt.Sprintf("%s: failed after %d bytes: %s", what, n, e.Message)
			return nil, &e
		}
	}
	return nil, &errdefs.Error{Code: errdefs.CodeInternal, Message: fmt.Sprintf("%s: stream ended after %d bytes without completion status", what, n)}
}
