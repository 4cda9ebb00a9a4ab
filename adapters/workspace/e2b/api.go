package e2b

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/esf-dev/esf/workspace"
)

// api is the control-plane client: one method per REST call the adapter
// makes, JSON in and out, retries on 429 for idempotent calls.
type api struct {
	cfg Config
}

// sandboxInfo is the union of the control plane's Sandbox, SandboxDetail and
// ListedSandbox shapes; absent fields stay zero.
type sandboxInfo struct {
	TemplateID         string            `json:"templateID"`
	SandboxID          string            `json:"sandboxID"`
	EnvdVersion        string            `json:"envdVersion"`
	EnvdAccessToken    *string           `json:"envdAccessToken"`
	TrafficAccessToken *string           `json:"trafficAccessToken"`
	Domain             *string           `json:"domain"`
	State              string            `json:"state"`
	Metadata           map[string]string `json:"metadata"`
}

type newSandbox struct {
	TemplateID string            `json:"templateID"`
	Timeout    int               `json:"timeout"`
	Secure     bool              `json:"secure"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	EnvVars    map[string]string `json:"envVars,omitempty"`
}

type timeoutBody struct {
	Timeout int `json:"timeout"`
}

type errorBody struct {
	Code      int    `json:"code"`
	Message   string `json:"message"`
	ErrorCode string `json:"error_code"`
	Detail    string `json:"detail"`
}

// seconds rounds up: the API counts whole seconds and a session must not
// be reclaimed before the caller's timeout.
func seconds(d time.Duration) int {
	return int((d + time.Second - 1) / time.Second)
}

// do sends one call. It returns the HTTP status (0 when no answer arrived)
// and, for a status >= 400, a *workspace.ProviderError classed by status:
// 401/403 and 429 are ErrPolicy, 404 ErrNotFound, the rest ErrProvider.
// When retry is set, a 429 is retried up to MaxRetries times, waiting as
// Retry-After says (or backing off) while the wait is within MaxRetryWait.
func (a *api) do(ctx context.Context, op, method, path string, in, out any, retry bool) (int, error) {
	return a.doHeader(ctx, op, method, path, in, out, retry, nil)
}

// doHeader is do that also copies the final response's headers into hdr.
func (a *api) doHeader(ctx context.Context, op, method, path string, in, out any, retry bool, hdr http.Header) (int, error) {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return 0, fmt.Errorf("%s: %w", op, err)
		}
	}
	for attempt := 0; ; attempt++ {
		var rd io.Reader
		if body != nil {
			rd = bytes.NewReader(body)
		}
		req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(a.cfg.APIURL, "/")+path, rd)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", op, err)
		}
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		req.Header.Set("Accept", "application/json")
		req.Header.Set("User-Agent", a.cfg.UserAgent)
		if a.cfg.APIKey != "" {
			if a.cfg.BearerAuth {
				req.Header.Set("Authorization", "Bearer "+a.cfg.APIKey)
			} else {
				req.Header.Set("X-API-Key", a.cfg.APIKey)
			}
		}
		resp, err := a.cfg.HTTPClient.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return 0, workspace.ContextError(ctx, a.cfg.Name+" "+op, err)
			}
			return 0, &workspace.ProviderError{Provider: a.cfg.Name, Op: op, Message: err.Error()}
		}
		if resp.StatusCode == http.StatusTooManyRequests && retry && attempt < a.cfg.MaxRetries {
			wait, ok := retryAfter(resp.Header, attempt)
			if ok && wait <= a.cfg.MaxRetryWait {
				drain(resp)
				if err := sleep(ctx, wait); err != nil {
					return 0, workspace.ContextError(ctx, a.cfg.Name+" "+op, err)
				}
				continue
			}
		}
		for k, v := range resp.Header {
			if hdr != nil {
				hdr[k] = v
			}
		}
		if resp.StatusCode >= 400 {
			defer drain(resp)
			return resp.StatusCode, a.httpError(op, resp)
		}
		defer drain(resp)
		if out != nil && resp.StatusCode != http.StatusNoContent {
			if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
				return resp.StatusCode, workspace.ContextError(ctx, op, &workspace.ProviderError{
					Provider: a.cfg.Name, Op: op, Status: resp.StatusCode, Message: "decode response: " + err.Error()})
			}
		}
		return resp.StatusCode, nil
	}
}

func drain(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
}

func (a *api) httpError(op string, resp *http.Response) *workspace.ProviderError {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	e := &workspace.ProviderError{Provider: a.cfg.Name, Op: op, Status: resp.StatusCode}
	var b errorBody
	if json.Unmarshal(data, &b) == nil && (b.Message != "" || b.Detail != "") {
		e.Message, e.Code = b.Message, b.ErrorCode
		if e.Message == "" {
			e.Message = b.Detail
		}
	} else {
		e.Message = strings.TrimSpace(string(data))
	}
	switch resp.StatusCode {
	case http.StatusUnauthorized, http.StatusForbidden:
		e.Class = workspace.ErrPolicy
	case http.StatusNotFound:
		e.Class = workspace.ErrNotFound
	case http.StatusTooManyRequests:
		e.Class = workspace.ErrPolicy
		e.RetryAfter, _ = retryAfter(resp.Header, 0)
	}
	return e
}

// retryAfter reads Retry-After (seconds or an HTTP date). Without it, the
// wait backs off from 250 ms; ok is false only for an unreadable header.
func retryAfter(h http.Header, attempt int) (time.Duration, bool) {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return (250 * time.Millisecond) << min(attempt, 6), true
	}
	if n, err := strconv.Atoi(v); err == nil && n >= 0 {
		return time.Duration(n) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(0, time.Until(t)), true
	}
	return 0, false
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func sandboxPath(id string, suffix string) string {
	return "/sandboxes/" + url.PathEscape(id) + suffix
}

func (a *api) create(ctx context.Context, body *newSandbox) (*sandboxInfo, error) {
	var sb sandboxInfo
	// Not retried: a create is not idempotent, and the service's 429 for
	// the concurrency limit does not clear by waiting.
	if _, err := a.do(ctx, "create", http.MethodPost, "/sandboxes", body, &sb, false); err != nil {
		return nil, err
	}
	if sb.SandboxID == "" {
		return nil, &workspace.ProviderError{Provider: a.cfg.Name, Op: "create", Message: "response without sandboxID"}
	}
	return &sb, nil
}

func (a *api) get(ctx context.Context, id string) (*sandboxInfo, error) {
	var sb sandboxInfo
	if _, err := a.do(ctx, "get", http.MethodGet, sandboxPath(id, ""), nil, &sb, true); err != nil {
		return nil, err
	}
	return &sb, nil
}

func (a *api) kill(ctx context.Context, id string) error {
	_, err := a.do(ctx, "kill", http.MethodDelete, sandboxPath(id, ""), nil, nil, true)
	return err
}

func (a *api) pause(ctx context.Context, id string) (int, error) {
	return a.do(ctx, "pause", http.MethodPost, sandboxPath(id, "/pause"), nil, nil, true)
}

// connect resumes a paused sandbox (201 on E2B, 200 on CubeSandbox) or
// returns a running one's details (200).
func (a *api) connect(ctx context.Context, id string, timeout time.Duration) (*sandboxInfo, int, error) {
	var sb sandboxInfo
	st, err := a.do(ctx, "connect", http.MethodPost, sandboxPath(id, "/connect"), &timeoutBody{Timeout: seconds(timeout)}, &sb, true)
	if err != nil {
		return nil, st, err
	}
	return &sb, st, nil
}

func (a *api) setTimeout(ctx context.Context, id string, d time.Duration) error {
	_, err := a.do(ctx, "timeout", http.MethodPost, sandboxPath(id, "/timeout"), &timeoutBody{Timeout: seconds(d)}, nil, true)
	return err
}

// refresh extends the sandbox's lifetime to at least d from now (at most
// an hour per call on E2B).
func (a *api) refresh(ctx context.Context, id string, d time.Duration) error {
	body := struct {
		Duration int `json:"duration"`
	}{seconds(d)}
	_, err := a.do(ctx, "refresh", http.MethodPost, sandboxPath(id, "/refreshes"), &body, nil, true)
	return err
}

// list pages through GET /v2/sandboxes. metadata filters server-side where
// the service supports it; callers still check, since a service that
// ignores the filter must not make them act on other sandboxes.
func (a *api) list(ctx context.Context, metadata map[string]string) ([]sandboxInfo, error) {
	var all []sandboxInfo
	next := ""
	for page := 0; page < 1000; page++ {
		q := url.Values{"state": {"running,paused"}, "limit": {"100"}}
		if len(metadata) > 0 {
			m := url.Values{}
			for k, v := range metadata {
				m.Set(k, v)
			}
			q.Set("metadata", m.Encode())
		}
		if next != "" {
			q.Set("nextToken", next)
		}
		var got []sandboxInfo
		hdr := http.Header{}
		if _, err := a.doHeader(ctx, "list", http.MethodGet, "/v2/sandboxes?"+q.Encode(), nil, &got, true, hdr); err != nil {
			return nil, err
		}
		all = append(all, got...)
		next = hdr.Get("X-Next-Token")
		if next == "" || len(got) == 0 {
			return all, nil
		}
	}
	return all, nil
}
