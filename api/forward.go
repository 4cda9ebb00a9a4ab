package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"

	"github.com/esf-dev/esf/api/internal/wire"
	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/errdefs"
)

// Forwarding. On a graph several workers share, any worker answers graph
// calls, but a call on an attempt runs where the attempt does (its mount,
// its container): a worker that receives one for an attempt another worker
// owns forwards the request, as it came, to the owner's API address, and
// relays the answer, streams (exec, its interactive upgrade) included. An
// activation goes to the worker it is pinned to (ActivateRequest.Worker)
// or, unpinned, to the least loaded worker with free capacity. A forwarded
// request carries HeaderForwarded and is never forwarded again.

// HeaderForwarded marks a request one worker forwarded to another; its
// value is the forwarding worker's id.
const HeaderForwarded = "Esf-Forwarded-By"

// ForwardOptions let a Server forward calls to other workers.
type ForwardOptions struct {
	// Transport reaches the other workers (their TLS roots); default
	// http.DefaultTransport.
	Transport http.RoundTripper
	// Token is sent to the owner when the request itself carries none
	// (it came through the unix socket): the workers of a cluster accept
	// the same tokens.
	Token string
}

// forwardedPaths are the calls on one attempt (or lease) that run on its
// owner, and the activation, which runs where it is placed.
var forwardedPaths = map[string]bool{
	"/v1/suspend": true, "/v1/release": true, "/v1/renew": true, "/v1/exec": true,
	"/v1/mount": true, "/v1/umount": true, "/v1/activate": true, "/v1/retry": true,
}

// forward sends r to the worker that must answer it, if that is not this
// one, and reports whether it did (the response is written then).
func (s *Server) forward(w http.ResponseWriter, r *http.Request) bool {
	if s.fwd == nil || r.Method != http.MethodPost || !forwardedPaths[r.URL.Path] || r.Header.Get(HeaderForwarded) != "" {
		return false
	}
	var body []byte
	var rest io.Reader // what follows body in the request, if it streams
	if r.URL.Path == "/v1/exec" && wire.MediaType(r.Header.Get("Content-Type")) == v1.MediaExecStream {
		// The interactive exec: its first frame is the request; the rest
		// is the stdin stream, which lasts as long as the command.
		var seen bytes.Buffer
		_, p, err := wire.NewReader(io.TeeReader(r.Body, &seen)).Next(maxJSONBody)
		if err != nil {
			return false // the handler reports the bad stream
		}
		body, rest = seen.Bytes(), r.Body
		defer func() { r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), rest)) }()
		var req struct {
			AttemptID string `json:"attempt_id"`
		}
		json.Unmarshal(p, &req)
		return s.forwardTo(w, r, func() (string, error) { return s.f.Route(r.Context(), req.AttemptID, "") }, body, rest)
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxJSONBody+1))
	if err != nil {
		writeError(w, fmt.Errorf("read request: %v: %w", err, errdefs.ErrInvalidArgument))
		return true
	}
	// The handler reads the body again, whatever happens here.
	r.Body = io.NopCloser(bytes.NewReader(body))
	var ids struct {
		AttemptID string `json:"attempt_id"`
		LeaseID   string `json:"lease_id"`
		Worker    string `json:"worker"`
	}
	json.Unmarshal(body, &ids) // a bad body is the handler's to report
	return s.forwardTo(w, r, func() (string, error) {
		if r.URL.Path == "/v1/activate" {
			return s.f.Place(r.Context(), ids.Worker)
		}
		return s.f.Route(r.Context(), ids.AttemptID, ids.LeaseID)
	}, body, nil)
}

// forwardTo proxies r, whose body is body then rest, to the worker route
// names, unless that is this one (false: serve it here).
func (s *Server) forwardTo(w http.ResponseWriter, r *http.Request, route func() (string, error), body []byte, rest io.Reader) bool {
	addr, err := route()
	if err != nil {
		writeError(w, err)
		return true
	}
	if addr == "" {
		return false
	}
	target, err := url.Parse(addr)
	if err != nil || (target.Scheme != "https" && target.Scheme != "http") {
		writeError(w, fmt.Errorf("worker address %q: %w", addr, errdefs.ErrFailedPrecondition))
		return true
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = target.Host
			pr.Out.Header.Set(HeaderForwarded, s.f.WorkerID())
			if pr.Out.Header.Get("Authorization") == "" && s.fwd.Token != "" {
				pr.Out.Header.Set("Authorization", "Bearer "+s.fwd.Token)
			}
		},
		Transport:     s.fwd.Transport,
		FlushInterval: -1, // streams (exec, export) as they come
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			writeError(w, fmt.Errorf("forward to %s: %v: %w", strings.TrimSuffix(addr, "/"), err, errdefs.ErrUnavailable))
		},
	}
	s.log.Debug("forwarded", "path", r.URL.Path, "to", addr)
	if rest != nil {
		// Two-way: the owner's output streams back while stdin still
		// streams in.
		if err := http.NewResponseController(w).EnableFullDuplex(); err != nil {
			writeError(w, fmt.Errorf("forward exec: %v: %w", err, errdefs.ErrUnsupported))
			return true
		}
		r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), rest))
		r.ContentLength = -1
	} else {
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
	}
	proxy.ServeHTTP(w, r)
	return true
}
