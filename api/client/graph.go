package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/errdefs"
)

// callFor sends one JSON request and decodes the response into a new Res.
func callFor[Res any](ctx context.Context, c *Client, method, path string, in any, opt CallOptions) (*Res, error) {
	var out Res
	if err := c.call(ctx, method, path, in, &out, opt); err != nil {
		return nil, err
	}
	return &out, nil
}

// CreateGroup creates a group from req.RootID, or, when it is empty, from
// req.Source (an absolute path on the daemon's host), imported first.
func (c *Client) CreateGroup(ctx context.Context, req v1.CreateGroupRequest, opt CallOptions) (*v1.CreateGroupResult, error) {
	return callFor[v1.CreateGroupResult](ctx, c, http.MethodPost, "/v1/groups", req, opt)
}

// Fork creates req.N draft children of a sealed node.
func (c *Client) Fork(ctx context.Context, req v1.ForkRequest, opt CallOptions) (*v1.ForkResult, error) {
	return callFor[v1.ForkResult](ctx, c, http.MethodPost, "/v1/fork", req, opt)
}

// Inspect reads a group, node or attempt. (opt sets only Raw and
// Traceparent: a read has no idempotency key.)
func (c *Client) Inspect(ctx context.Context, id string, opt CallOptions) (*v1.Inspection, error) {
	return callFor[v1.Inspection](ctx, c, http.MethodGet, "/v1/inspect/"+url.PathEscape(id), nil, opt)
}

// Tree reads a group's whole graph.
func (c *Client) Tree(ctx context.Context, groupID string, opt CallOptions) (*v1.TreeResponse, error) {
	return callFor[v1.TreeResponse](ctx, c, http.MethodGet, "/v1/tree/"+url.PathEscape(groupID), nil, opt)
}

// Promote moves a group's canonical node by compare-and-swap.
func (c *Client) Promote(ctx context.Context, req v1.PromoteRequest, opt CallOptions) (*v1.Group, error) {
	return callFor[v1.Group](ctx, c, http.MethodPost, "/v1/promote", req, opt)
}

// PutEvidence streams r to the daemon's store as one object and returns its
// id, for EvaluateRequest.Evidence. Read errors of r fail the request (an
// *errdefs.Error from r keeps its code).
func (c *Client) PutEvidence(ctx context.Context, r io.Reader, opt CallOptions) (*v1.EvidenceResponse, error) {
	req, err := c.newRequest(ctx, http.MethodPost, "/v1/evidence", struct{ io.Reader }{r}, v1.MediaBinary, opt)
	if err != nil {
		return nil, err
	}
	resp, err := c.do(req)
	if err != nil {
		return nil, err
	}
	var out v1.EvidenceResponse
	if err := decodeResponse(ctx, c, resp, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Evaluate records an evaluation of a sealed node or an attempt's result.
func (c *Client) Evaluate(ctx context.Context, req v1.EvaluateRequest, opt CallOptions) (*v1.Evaluation, error) {
	return callFor[v1.Evaluation](ctx, c, http.MethodPost, "/v1/evaluate", req, opt)
}

// Prune marks an unleased subtree pruned.
func (c *Client) Prune(ctx context.Context, req v1.PruneRequest, opt CallOptions) (*v1.PruneResult, error) {
	return callFor[v1.PruneResult](ctx, c, http.MethodPost, "/v1/prune", req, opt)
}

// Activate leases a node for a new attempt and mounts its writable root.
func (c *Client) Activate(ctx context.Context, req v1.ActivateRequest, opt CallOptions) (*v1.AttemptView, error) {
	return callFor[v1.AttemptView](ctx, c, http.MethodPost, "/v1/activate", req, opt)
}

// Suspend seals an attempt's delta into a node.
func (c *Client) Suspend(ctx context.Context, req v1.SuspendRequest, opt CallOptions) (*v1.SuspendResult, error) {
	return callFor[v1.SuspendResult](ctx, c, http.MethodPost, "/v1/suspend", req, opt)
}

// Release ends an attempt and deletes its delta.
func (c *Client) Release(ctx context.Context, req v1.ReleaseRequest, opt CallOptions) (*v1.AttemptView, error) {
	return callFor[v1.AttemptView](ctx, c, http.MethodPost, "/v1/release", req, opt)
}

// Retry starts a new attempt where a failed one ended.
func (c *Client) Retry(ctx context.Context, req v1.RetryRequest, opt CallOptions) (*v1.AttemptView, error) {
	return callFor[v1.AttemptView](ctx, c, http.MethodPost, "/v1/retry", req, opt)
}

// Renew extends a lease.
func (c *Client) Renew(ctx context.Context, req v1.RenewRequest, opt CallOptions) (*v1.Lease, error) {
	return callFor[v1.Lease](ctx, c, http.MethodPost, "/v1/renew", req, opt)
}

// Mount shows a node at req.Dir (absolute, on the daemon's host).
func (c *Client) Mount(ctx context.Context, req v1.MountRequest, opt CallOptions) (*v1.MountResult, error) {
	return callFor[v1.MountResult](ctx, c, http.MethodPost, "/v1/mount", req, opt)
}

// Umount undoes a Mount.
func (c *Client) Umount(ctx context.Context, req v1.UmountRequest, opt CallOptions) (*v1.MountResult, error) {
	return callFor[v1.MountResult](ctx, c, http.MethodPost, "/v1/umount", req, opt)
}

// Events calls fn for each event q selects, in Seq order, on the caller's
// goroutine. Without q.Follow it returns nil once the daemon marked the
// listing complete. With q.Follow it returns when ctx ends (a
// deadline_exceeded error), when fn fails (that error), or when the daemon
// ends the stream (unavailable when it shuts down: resume with After set to
// the last Seq seen).
func (c *Client) Events(ctx context.Context, q v1.EventsQuery, fn func(v1.Event) error) error {
	path := "/v1/events"
	if v := q.Values(); len(v) > 0 {
		path += "?" + v.Encode()
	}
	req, err := c.newRequest(ctx, http.MethodGet, path, nil, "", CallOptions{})
	if err != nil {
		return err
	}
	resp, err := c.do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	n := 0
	for {
		var ev v1.Event
		err := dec.Decode(&ev)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if ctx.Err() != nil {
				return c.transportError(ctx, err)
			}
			return &errdefs.Error{Code: errdefs.CodeUnavailable, Message: fmt.Sprintf("events: stream broken after %d events: %v", n, err)}
		}
		n++
		if err := fn(ev); err != nil {
			return err
		}
	}
	switch resp.Trailer.Get(v1.TrailerStatus) {
	case "ok":
		return nil
	case "error":
		var e errdefs.Error
		if json.Unmarshal([]byte(resp.Trailer.Get(v1.TrailerError)), &e) == nil && e.Code != "" {
			return &e
		}
	}
	if ctx.Err() != nil {
		return c.transportError(ctx, ctx.Err())
	}
	return &errdefs.Error{Code: errdefs.CodeUnavailable, Message: fmt.Sprintf("events: stream ended after %d events without completion status", n)}
}
