package opensandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// Lifecycle states (SandboxState). Clients must tolerate others.
const (
	statePending    = "Pending"
	stateRunning    = "Running"
	statePausing    = "Pausing"
	statePaused     = "Paused"
	stateResuming   = "Resuming"
	stateStopping   = "Stopping"
	stateTerminated = "Terminated"
	stateFailed     = "Failed"
)

type imageSpec struct {
	URI string `json:"uri"`
}

type createRequest struct {
	Image          imageSpec         `json:"image"`
	Entrypoint     []string          `json:"entrypoint"`
	ResourceLimits map[string]string `json:"resourceLimits,omitempty"`
	// Timeout is seconds; omitted means manual cleanup.
	Timeout  *int64            `json:"timeout,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

type sandboxStatus struct {
	State   string `json:"state"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// apiSandbox is both Sandbox and CreateSandboxResponse; fields the adapter
// does not use are not decoded.
type apiSandbox struct {
	ID       string            `json:"id"`
	Status   sandboxStatus     `json:"status"`
	Metadata map[string]string `json:"metadata"`
}

type listResponse struct {
	Items      []apiSandbox `json:"items"`
	Pagination struct {
		Page        int  `json:"page"`
		TotalPages  int  `json:"totalPages"`
		HasNextPage bool `json:"hasNextPage"`
	} `json:"pagination"`
}

type endpointResponse struct {
	Endpoint string            `json:"endpoint"`
	Headers  map[string]string `json:"headers"`
}

func (p *Provider) lifecycleURL(parts ...string) string {
	u := *p.api
	for _, s := range parts {
		u.Path += "/" + url.PathEscape(s)
	}
	return u.String()
}

func (p *Provider) lifecycleHeader() http.Header {
	h := http.Header{}
	if p.cfg.APIKey != "" {
		h.Set("OPEN-SANDBOX-API-KEY", p.cfg.APIKey)
	}
	return h
}

func (p *Provider) decode(op string, resp *http.Response, v any) error {
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("opensandbox %s: decode response: %w", op, err)
	}
	return nil
}

// createSandbox is not retried on 5xx: the server may have acted. A 429 is
// retried (the server did not act).
func (p *Provider) createSandbox(ctx context.Context, body createRequest) (apiSandbox, error) {
	resp, err := p.send(ctx, call{op: "create", method: http.MethodPost, url: p.lifecycleURL("sandboxes"),
		header: p.lifecycleHeader(), json: body})
	if err != nil {
		return apiSandbox{}, err
	}
	var sb apiSandbox
	if err := p.decode("create", resp, &sb); err != nil {
		return apiSandbox{}, err
	}
	if sb.ID == "" {
		return apiSandbox{}, fmt.Errorf("opensandbox create: response without a sandbox id")
	}
	return sb, nil
}

func (p *Provider) getSandbox(ctx context.Context, id string) (apiSandbox, error) {
	resp, err := p.send(ctx, call{op: "get", method: http.MethodGet, url: p.lifecycleURL("sandboxes", id),
		header: p.lifecycleHeader(), idempotent: true})
	if err != nil {
		return apiSandbox{}, err
	}
	var sb apiSandbox
	return sb, p.decode("get", resp, &sb)
}

// listSandboxes returns every sandbox carrying all of filter, following
// pagination. Items seen twice (the list shifts while paging) count once.
func (p *Provider) listSandboxes(ctx context.Context, filter map[string]string) ([]apiSandbox, error) {
	var out []apiSandbox
	seen := map[string]bool{}
	for page := 1; ; page++ {
		q := url.Values{"page": {strconv.Itoa(page)}, "pageSize": {"100"}}
		if len(filter) > 0 {
			f := url.Values{}
			for k, v := range filter {
				f.Set(k, v)
			}
			q.Set("metadata", f.Encode())
		}
		resp, err := p.send(ctx, call{op: "list", method: http.MethodGet, url: p.lifecycleURL("sandboxes"),
			query: q, header: p.lifecycleHeader(), idempotent: true})
		if err != nil {
			return nil, err
		}
		var lr listResponse
		if err := p.decode("list", resp, &lr); err != nil {
			return nil, err
		}
		for _, sb := range lr.Items {
			if !seen[sb.ID] {
				seen[sb.ID] = true
				out = append(out, sb)
			}
		}
		if !lr.Pagination.HasNextPage || len(lr.Items) == 0 || page > 10000 {
			return out, nil
		}
	}
}

func (p *Provider) deleteSandbox(ctx context.Context, id string) error {
	resp, err := p.send(ctx, call{op: "delete", method: http.MethodDelete, url: p.lifecycleURL("sandboxes", id),
		header: p.lifecycleHeader(), idempotent: true})
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// transition posts pause or resume. Both are safe to repeat (the state
// check makes a second one a 409), so they are retried like idempotent calls.
func (p *Provider) transition(ctx context.Context, id, verb string) error {
	resp, err := p.send(ctx, call{op: verb, method: http.MethodPost, url: p.lifecycleURL("sandboxes", id, verb),
		header: p.lifecycleHeader(), idempotent: true})
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// endpoint resolves execd the way the provider's SDK does: the endpoint
// lookup names host[:port][/path] and the headers every execd call must
// carry.
func (p *Provider) endpoint(ctx context.Context, id string) (*execdEndpoint, error) {
	q := url.Values{}
	if p.cfg.UseServerProxy {
		q.Set("use_server_proxy", "true")
	}
	resp, err := p.send(ctx, call{op: "endpoint", method: http.MethodGet,
		url:   p.lifecycleURL("sandboxes", id, "endpoints", strconv.Itoa(p.cfg.ExecdPort)),
		query: q, header: p.lifecycleHeader(), idempotent: true})
	if err != nil {
		return nil, err
	}
	var er endpointResponse
	if err := p.decode("endpoint", resp, &er); err != nil {
		return nil, err
	}
	if er.Endpoint == "" {
		return nil, fmt.Errorf("opensandbox endpoint: empty endpoint for sandbox %s", id)
	}
	base := er.Endpoint
	if !strings.Contains(base, "://") {
		base = p.cfg.ExecdScheme + "://" + base
	}
	if _, err := url.Parse(base); err != nil {
		return nil, fmt.Errorf("opensandbox endpoint: %q: %w", base, err)
	}
	ep := &execdEndpoint{base: strings.TrimRight(base, "/"), header: http.Header{}}
	for k, v := range er.Headers {
		ep.header.Set(k, v)
	}
	if ep.header.Get(execdTokenHeader) == "" {
		switch {
		case p.cfg.ExecdAccessToken != "":
			ep.header.Set(execdTokenHeader, p.cfg.ExecdAccessToken)
		case p.cfg.UseServerProxy && p.cfg.APIKey != "":
			ep.header.Set(execdTokenHeader, p.cfg.APIKey)
		}
	}
	return ep, nil
}
