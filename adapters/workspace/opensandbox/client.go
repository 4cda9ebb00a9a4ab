package opensandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/esf-dev/esf/workspace"
)

const providerName = "opensandbox"

// surface says which server answered, because the same status means
// different things: a lifecycle 404 is a missing sandbox, an execd 404 is a
// missing file unless its code says the sandbox itself is gone.
type surface int

const (
	lifecycleAPI surface = iota
	execdAPI
)

// call is one HTTP request. A call with a JSON body (or none) can be sent
// again; a call with a stream body cannot, so it is never retried.
type call struct {
	op     string
	method string
	url    string // absolute
	query  url.Values
	header http.Header
	json   any       // request body, encoded once
	stream io.Reader // one-shot request body (uploads)
	ctype  string    // content type of stream
	accept string
	// idempotent calls are also retried on 502/503/504; every replayable
	// call is retried on 429, which means the server did not act on it.
	idempotent bool
	surface    surface
}

// send performs c, retrying as Config allows, and returns a 2xx response
// (the caller closes its body) or an error: a *workspace.ProviderError for
// an HTTP failure, or a transport error made to match ctx when ctx ended.
func (p *Provider) send(ctx context.Context, c call) (*http.Response, error) {
	var body []byte
	if c.json != nil {
		b, err := json.Marshal(c.json)
		if err != nil {
			return nil, fmt.Errorf("opensandbox %s: encode request: %w", c.op, err)
		}
		body = b
	}
	target := c.url
	if len(c.query) > 0 {
		target += "?" + c.query.Encode()
	}
	for attempt := 0; ; attempt++ {
		var rd io.Reader
		switch {
		case c.stream != nil:
			rd = c.stream
		case body != nil:
			rd = bytes.NewReader(body)
		}
		req, err := http.NewRequestWithContext(ctx, c.method, target, rd)
		if err != nil {
			return nil, fmt.Errorf("opensandbox %s: %w", c.op, err)
		}
		for k, vs := range c.header {
			req.Header[k] = vs
		}
		switch {
		case c.stream != nil:
			req.Header.Set("Content-Type", c.ctype)
		case body != nil:
			req.Header.Set("Content-Type", "application/json")
		}
		if c.accept != "" {
			req.Header.Set("Accept", c.accept)
		}
		req.Header.Set("User-Agent", "esf-workspace-opensandbox/1")
		resp, err := p.cfg.HTTPClient.Do(req)
		if err != nil {
			return nil, transportError(ctx, c.op, err)
		}
		if resp.StatusCode >= 200 && resp.StatusCode < 300 {
			return resp, nil
		}
		perr := p.statusError(c, resp)
		retryable := c.stream == nil && (resp.StatusCode == http.StatusTooManyRequests ||
			(c.idempotent && (resp.StatusCode == http.StatusBadGateway ||
				resp.StatusCode == http.StatusServiceUnavailable ||
				resp.StatusCode == http.StatusGatewayTimeout)))
		if !retryable || attempt >= p.cfg.MaxRetries {
			return nil, perr
		}
		wait := perr.RetryAfter
		if wait == 0 {
			wait = p.cfg.PollInterval << attempt
		}
		if wait > p.cfg.MaxRetryWait {
			return nil, perr
		}
		if dl, ok := retryDeadline(ctx); ok && time.Until(dl) < wait {
			// Waiting would only end in the caller's deadline: report the
			// refusal and its hint now, while the caller can still act.
			return nil, perr
		}
		if err := sleep(ctx, wait); err != nil {
			return nil, workspace.ContextError(ctx, c.op, err)
		}
	}
}

// transportError is a failure below HTTP. After ctx ended it matches
// ctx.Err(); otherwise it is a provider failure that keeps the cause.
func transportError(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil {
		return workspace.ContextError(ctx, "opensandbox "+op, err)
	}
	return fmt.Errorf("%w: %w", &workspace.ProviderError{Provider: providerName, Op: op, Message: "transport", Class: workspace.ErrProvider}, err)
}

// errorBody holds every error shape the two servers produce: the lifecycle
// server's and execd's {"code","message"}, execd's auth middleware
// {"error"}, and FastAPI's validation {"detail"}.
type errorBody struct {
	Code    string          `json:"code"`
	Message string          `json:"message"`
	Error   string          `json:"error"`
	Detail  json.RawMessage `json:"detail"`
}

// statusError reads a non-2xx response (and closes it) into a
// *workspace.ProviderError with its class.
func (p *Provider) statusError(c call, resp *http.Response) *workspace.ProviderError {
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	pe := &workspace.ProviderError{Provider: providerName, Op: c.op, Status: resp.StatusCode}
	var eb errorBody
	if json.Unmarshal(raw, &eb) == nil {
		pe.Code, pe.Message = eb.Code, eb.Message
		if pe.Message == "" {
			pe.Message = eb.Error
		}
		if pe.Message == "" && len(eb.Detail) > 0 {
			pe.Message = string(eb.Detail)
		}
	} else {
		pe.Message = strings.TrimSpace(string(raw))
	}
	if rid := resp.Header.Get("X-Request-ID"); rid != "" && pe.Message != "" {
		pe.Message += " (request " + rid + ")"
	}
	switch resp.StatusCode {
	case http.StatusUnauthorized, http.StatusForbidden:
		pe.Class = workspace.ErrPolicy
	case http.StatusTooManyRequests:
		pe.Class = workspace.ErrPolicy
		pe.RetryAfter = parseRetryAfter(resp.Header.Get("Retry-After"))
	case http.StatusNotFound:
		switch {
		case strings.HasSuffix(pe.Code, "SANDBOX_NOT_FOUND"):
			pe.Class = workspace.ErrNotFound
		case c.surface == lifecycleAPI:
			pe.Class = workspace.ErrNotFound
		case pe.Code == "FILE_NOT_FOUND":
			pe.Class = fs.ErrNotExist
		default:
			pe.Class = workspace.ErrProvider
		}
	case http.StatusInternalServerError:
		pe.Class = workspace.ErrProvider
		// execd reports every file failure but a missing path as 500
		// RUNTIME_ERROR with the OS error in the text; a refused
		// permission is worth telling apart.
		if c.surface == execdAPI && pe.Code == "RUNTIME_ERROR" && strings.Contains(pe.Message, "permission denied") {
			pe.Class = fs.ErrPermission
		}
	default:
		pe.Class = workspace.ErrProvider
	}
	return pe
}

// parseRetryAfter reads delay-seconds or an HTTP date; 0 when absent.
func parseRetryAfter(v string) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(v); err == nil {
		if n < 0 {
			return 0
		}
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := time.Until(t); d > 0 {
			return d
		}
	}
	return 0
}

// detach is ctx without its cancellation, for requests that must outlive
// the caller's ctx (see createOrClean and Run); it keeps ctx's deadline
// for send's retry decisions only.
func detach(ctx context.Context) context.Context {
	d := context.WithoutCancel(ctx)
	if dl, ok := ctx.Deadline(); ok {
		d = context.WithValue(d, deadlineKey{}, dl)
	}
	return d
}

type deadlineKey struct{}

// retryDeadline is ctx's deadline, or the one detach kept.
func retryDeadline(ctx context.Context) (time.Time, bool) {
	if dl, ok := ctx.Deadline(); ok {
		return dl, true
	}
	dl, ok := ctx.Value(deadlineKey{}).(time.Time)
	return dl, ok
}

// ctxError is the error of an operation stopped because ctx ended. It
// matches ctx.Err() (context.Canceled or DeadlineExceeded) and, when ctx
// carries a cause of its own, that cause too.
func ctxError(ctx context.Context, op string) error {
	err, cause := ctx.Err(), context.Cause(ctx)
	if cause == nil || cause == err {
		return fmt.Errorf("opensandbox %s: %w", op, err)
	}
	return fmt.Errorf("opensandbox %s: %w: %w", op, err, cause)
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// backoff is the polling schedule: PollInterval growing by half up to
// MaxPollInterval.
type backoff struct {
	next, max time.Duration
}

func (p *Provider) newBackoff() *backoff {
	return &backoff{next: p.cfg.PollInterval, max: p.cfg.MaxPollInterval}
}

func (b *backoff) wait(ctx context.Context) error {
	d := b.next
	b.next += b.next / 2
	if b.next > b.max {
		b.next = b.max
	}
	return sleep(ctx, d)
}

// isStatus reports whether err carries a provider answer with that status.
func isStatus(err error, status int) bool {
	var pe *workspace.ProviderError
	return errors.As(err, &pe) && pe.Status == status
}
