package daytona

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/esf-dev/esf/workspace"
)

const providerName = "daytona"

// client speaks HTTP to the API and to toolboxes: authentication headers,
// bounded 429 retries, error bodies.
type client struct {
	hc  *http.Client
	cfg *Config
}

// request is one HTTP call. A request with a body reader (stream) cannot be
// replayed and is never retried.
type request struct {
	method string
	url    string
	query  url.Values
	json   any       // marshalled as the body when not nil
	stream io.Reader // streamed body (not replayable)
	ctype  string    // content type of stream
	header http.Header
	// wrote, when set, is told whether the request reached the wire, so a
	// cancelled create knows whether the server may have acted on it.
	wrote *atomic.Bool
}

// httpError is a non-2xx answer. Callers map it to the contract's classes
// with the knowledge of what was addressed.
type httpError struct {
	status     int
	code       string
	message    string
	retryAfter time.Duration
	hasBody    bool // the answer carried a JSON error body
}

func (e *httpError) Error() string {
	s := fmt.Sprintf("HTTP %d", e.status)
	if e.code != "" {
		s += " " + e.code
	}
	if e.message != "" {
		s += ": " + e.message
	}
	return s
}

func statusOf(err error) int {
	var he *httpError
	if errors.As(err, &he) {
		return he.status
	}
	return 0
}

// do sends rq and returns the response of a 2xx answer (the caller closes
// its body), an *httpError for any other answer, or a transport error that
// already matches ctx's error when ctx ended.
func (c *client) do(ctx context.Context, op string, rq request) (*http.Response, error) {
	var body []byte
	if rq.json != nil {
		b, err := json.Marshal(rq.json)
		if err != nil {
			return nil, fmt.Errorf("daytona %s: encode request: %w", op, err)
		}
		body = b
	}
	u := rq.url
	if len(rq.query) > 0 {
		u += "?" + rq.query.Encode()
	}
	for attempt := 0; ; attempt++ {
		var rd io.Reader
		switch {
		case rq.stream != nil:
			rd = rq.stream
		case body != nil:
			rd = bytes.NewReader(body)
		}
		req, err := http.NewRequestWithContext(ctx, rq.method, u, rd)
		if err != nil {
			return nil, fmt.Errorf("daytona %s: %w", op, err)
		}
		if rq.wrote != nil {
			req = req.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
				WroteHeaders: func() { rq.wrote.Store(true) },
			}))
		}
		c.authorize(req.Header)
		switch {
		case rq.stream != nil:
			req.Header.Set("Content-Type", rq.ctype)
		case body != nil:
			req.Header.Set("Content-Type", "application/json")
		}
		for k, v := range rq.header {
			req.Header[k] = v
		}
		resp, err := c.hc.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return nil, workspace.ContextError(ctx, "daytona "+op, err)
			}
			return nil, &workspace.ProviderError{Provider: providerName, Op: op, Message: err.Error()}
		}
		if resp.StatusCode >= 200 && resp.StatusCode < 300 {
			return resp, nil
		}
		he := readError(resp)
		retryable := rq.stream == nil && resp.StatusCode == http.StatusTooManyRequests
		if !retryable || attempt >= c.cfg.MaxRetries {
			return nil, he
		}
		wait := he.retryAfter
		if wait <= 0 {
			wait = time.Duration(1<<attempt) * 500 * time.Millisecond
		}
		if wait > c.cfg.MaxRetryWait {
			return nil, he // the server asks for longer than we may wait
		}
		if err := sleep(ctx, wait); err != nil {
			return nil, workspace.ContextError(ctx, "daytona "+op, he)
		}
	}
}

// doJSON is do for a JSON answer decoded into out (nil to discard).
func (c *client) doJSON(ctx context.Context, op string, rq request, out any) error {
	resp, err := c.do(ctx, op, rq)
	if err != nil {
		return err
	}
	return decodeJSON(ctx, op, resp, out)
}

// decodeJSON reads a 2xx answer into out (nil to discard) and closes it.
func decodeJSON(ctx context.Context, op string, resp *http.Response, out any) error {
	defer resp.Body.Close()
	if out == nil {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		if ctx.Err() != nil {
			return workspace.ContextError(ctx, "daytona "+op, err)
		}
		return &workspace.ProviderError{Provider: providerName, Op: op, Status: resp.StatusCode, Message: "decode answer: " + err.Error()}
	}
	return nil
}

func (c *client) authorize(h http.Header) {
	tok := c.cfg.APIKey
	if tok == "" {
		tok = c.cfg.JWTToken
		h.Set("X-Daytona-Organization-ID", c.cfg.OrganizationID)
	}
	h.Set("Authorization", "Bearer "+tok)
	h.Set("X-Daytona-Source", "esf")
}

// readError decodes both error shapes Daytona uses: the API's NestJS body
// {"statusCode","error","message"} and the toolbox's common-go body
// {"statusCode","code","message"}; the daemon's file handlers answer with
// no body at all.
func readError(resp *http.Response) *httpError {
	defer resp.Body.Close()
	he := &httpError{status: resp.StatusCode, retryAfter: parseRetryAfter(resp.Header.Get("Retry-After"))}
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var body struct {
		Message   json.RawMessage `json:"message"`
		Error     string          `json:"error"`
		Code      any             `json:"code"`
		ErrorCode string          `json:"error_code"`
	}
	if len(bytes.TrimSpace(raw)) > 0 && json.Unmarshal(raw, &body) == nil {
		he.hasBody = true
		var msg string
		if json.Unmarshal(body.Message, &msg) != nil {
			var msgs []string // Nest validation errors come as a list
			if json.Unmarshal(body.Message, &msgs) == nil {
				msg = strings.Join(msgs, ", ")
			}
		}
		he.message = msg
		switch v := body.Code.(type) {
		case string:
			he.code = v
		case float64:
			he.code = strconv.Itoa(int(v))
		}
		if he.code == "" {
			he.code = body.ErrorCode
		}
		if he.message == "" {
			he.message = body.Error
		}
	} else if len(raw) > 0 {
		he.message = strings.TrimSpace(string(raw))
	}
	return he
}

func parseRetryAfter(v string) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(v); err == nil && n >= 0 {
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := time.Until(t); d > 0 {
			return d
		}
	}
	return 0
}

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

// apiError maps an answer of the API. scoped says the call addressed one
// sandbox, so that 404 means the session is gone (and not, say, an unknown
// region on create).
func apiError(op string, err error, scoped bool) error {
	var he *httpError
	if !errors.As(err, &he) {
		return err
	}
	var class error
	switch he.status {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusTooManyRequests:
		class = workspace.ErrPolicy
	case http.StatusNotFound, http.StatusGone:
		if scoped {
			class = workspace.ErrNotFound
		}
	case http.StatusUnprocessableEntity:
		class = workspace.ErrUnsupported
	case http.StatusBadRequest:
		// Quota refusals are plain 400s; only the message tells them apart.
		m := strings.ToLower(he.message)
		if strings.Contains(m, "quota") || strings.Contains(m, "limit exceeded") || strings.Contains(m, "suspended") {
			class = workspace.ErrPolicy
		}
	}
	return he.provider(op, class)
}

func (he *httpError) provider(op string, class error) *workspace.ProviderError {
	return &workspace.ProviderError{
		Provider: providerName, Op: op, Status: he.status, Code: he.code,
		Message: he.message, Class: class, RetryAfter: he.retryAfter,
	}
}
