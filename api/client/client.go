// Package client is the Go client of esfd's /v1 API, over the unix socket
// or the network. It imports only api/v1 and the standard library (and
// errdefs), so a program that talks to esfd links none of the daemon.
package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/esf-dev/esf/api/internal/wire"
	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/errdefs"
)

// Client calls esfd over its unix socket, or over the network API
// (NewRemoteClient). Every error it returns is an *errdefs.Error (or a
// *PathsError wrapping one): errors.Is(err, errdefs.ErrNotFound) works as
// on the server, and a daemon that cannot be reached is CodeUnavailable.
type Client struct {
	where string // the socket or the address, for messages
	base  string // scheme and host of every request's URL
	host  string // the Host header of a request written by hand
	token string // bearer token, network API only
	// dial opens a connection of its own (the interactive exec), TLS
	// handshake included.
	dial func(ctx context.Context) (net.Conn, error)
	hc   *http.Client
}

// NewClient returns a client of the daemon listening on socketPath. It
// connects lazily, on the first call.
func NewClient(socketPath string) *Client {
	dial := func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socketPath)
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
		// Bodies are tars and JSON we handle ourselves; no transparent gzip.
		DisableCompression: true,
		MaxIdleConns:       4,
	}
	return &Client{where: socketPath, base: base, host: "esfd", dial: dial, hc: &http.Client{Transport: tr}}
}

// RemoteOptions say how to reach esfd's network API (esfd --listen).
type RemoteOptions struct {
	// Host is https://HOST:PORT, or http://HOST:PORT for a listener the
	// operator left without TLS.
	Host string
	// Token is the bearer token every request carries.
	Token string
	// TLS verifies the daemon (default: the system's roots; see ClientTLS
	// for a private CA).
	TLS *tls.Config
}

// NewRemoteClient returns a client of the network API. It connects
// lazily, on the first call.
func NewRemoteClient(o RemoteOptions) (*Client, error) {
	u, err := url.Parse(o.Host)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") || (u.Path != "" && u.Path != "/") ||
		u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, &errdefs.Error{Code: errdefs.CodeInvalidArgument, Message: fmt.Sprintf("host %q: want https://HOST:PORT", o.Host)}
	}
	hostport := u.Host
	if u.Port() == "" {
		return nil, &errdefs.Error{Code: errdefs.CodeInvalidArgument, Message: fmt.Sprintf("host %q: no port", o.Host)}
	}
	if strings.ContainsAny(o.Token, "\r\n") {
		return nil, &errdefs.Error{Code: errdefs.CodeInvalidArgument, Message: "token: more than one line"}
	}
	cfg := o.TLS
	if cfg == nil {
		cfg = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	cfg = cfg.Clone()
	cfg.NextProtos = []string{"http/1.1"}
	dial := func(ctx context.Context) (net.Conn, error) {
		if u.Scheme == "http" {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", hostport)
		}
		d := tls.Dialer{Config: cfg}
		return d.DialContext(ctx, "tcp", hostport)
	}
	tr := &http.Transport{
		DialContext:        func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
		DialTLSContext:     func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
		DisableCompression: true,
		MaxIdleConns:       4,
		// HTTP/1.1 only: the exec stream is a full-duplex HTTP/1.1 exchange.
		TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{},
	}
	return &Client{where: hostport, base: u.Scheme + "://" + hostport, host: hostport, token: o.Token, dial: dial,
		hc: &http.Client{Transport: tr}}, nil
}

// ClientTLS is a client TLS configuration that trusts the CA certificates
// (PEM) in caFile instead of the system's roots.
func ClientTLS(caFile string) (*tls.Config, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, &errdefs.Error{Code: errdefs.CodeInvalidArgument, Message: fmt.Sprintf("CA file: %v", err)}
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, &errdefs.Error{Code: errdefs.CodeInvalidArgument, Message: fmt.Sprintf("CA file %s: no PEM certificate", caFile)}
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}, nil
}

// Close releases idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// CallOptions are the per-call headers of a request.
type CallOptions struct {
	// IdempotencyKey names a mutation so that a retry does it once. Empty
	// sends none.
	IdempotencyKey string
	// KeyGenerated says IdempotencyKey was made up for this call, so the
	// daemon may forget its result after a day (v1.HeaderKeyGenerated).
	KeyGenerated bool
	// Traceparent is the W3C trace context to continue. Empty lets the
	// daemon start a trace.
	Traceparent string
	// Raw, if not nil, receives the body of a successful JSON response
	// exactly as the daemon sent it (esfctl -o json prints it).
	Raw *[]byte
	// RawOnly, with Raw, leaves the result zero instead of decoding the
	// body into it, for a caller that only passes the bytes on (the web
	// view's server: decoding a 10,000-node tree it never reads cost it
	// a good part of the tree's fetch, issue 23). The body is still
	// checked to be JSON.
	RawOnly bool
}

// base is the URL every request on the unix socket goes to; the host is
// never resolved.
const base = "http://esfd"

func (c *Client) newRequest(ctx context.Context, method, path string, body io.Reader, contentType string, opt CallOptions) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, &errdefs.Error{Code: errdefs.CodeInvalidArgument, Message: err.Error()}
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if opt.IdempotencyKey != "" {
		req.Header.Set(v1.HeaderIdempotencyKey, opt.IdempotencyKey)
		if opt.KeyGenerated {
			req.Header.Set(v1.HeaderKeyGenerated, "true")
		}
	}
	if opt.Traceparent != "" {
		req.Header.Set(v1.HeaderTraceparent, opt.Traceparent)
	}
	return req, nil
}

// do sends req and returns the response of a 2xx; anything else becomes
// the *errdefs.Error the daemon sent.
func (c *Client) do(req *http.Request) (*http.Response, error) {
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, c.transportError(req.Context(), err)
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	return nil, errorFromResponse(resp)
}

func (c *Client) transportError(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return &errdefs.Error{Code: errdefs.CodeOf(cerr), Message: fmt.Sprintf("esfd at %s: %v", c.where, err)}
	}
	var e *errdefs.Error
	if errors.As(err, &e) {
		return e // from a body reader we were given (see ImportTar)
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return &errdefs.Error{Code: errdefs.CodeUnavailable, Message: fmt.Sprintf("esfd at %s: %v", c.where, err)}
}

func errorFromResponse(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	var body struct {
		errdefs.Error
		Paths []string `json:"paths"`
	}
	if json.Unmarshal(b, &body) == nil && body.Code != "" {
		if len(body.Paths) > 0 {
			return &PathsError{Err: &body.Error, Paths: body.Paths}
		}
		return &body.Error
	}
	msg := strings.TrimSpace(string(b))
	if len(msg) > 200 {
		msg = msg[:200] + "..."
	}
	return &errdefs.Error{Code: wire.CodeForStatus(resp.StatusCode), Message: fmt.Sprintf("esfd: HTTP %s: %s", resp.Status, msg)}
}

// call sends a JSON request (in == nil sends no body) and decodes the JSON
// response into out.
func (c *Client) call(ctx context.Context, method, path string, in, out any, opt CallOptions) error {
	var body io.Reader
	ct := ""
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return &errdefs.Error{Code: errdefs.CodeInvalidArgument, Message: err.Error()}
		}
		body, ct = bytes.NewReader(b), v1.MediaJSON
	}
	req, err := c.newRequest(ctx, method, path, body, ct, opt)
	if err != nil {
		return err
	}
	resp, err := c.do(req)
	if err != nil {
		return err
	}
	if opt.Raw != nil {
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return c.transportError(ctx, err)
		}
		switch {
		case opt.RawOnly:
			if !json.Valid(b) {
				return &errdefs.Error{Code: errdefs.CodeInternal, Message: "esfd: decode response: not JSON"}
			}
		default:
			if err := json.Unmarshal(b, out); err != nil {
				return &errdefs.Error{Code: errdefs.CodeInternal, Message: fmt.Sprintf("esfd: decode response: %v", err)}
			}
		}
		*opt.Raw = b
		return nil
	}
	return decodeResponse(ctx, c, resp, out)
}

func decodeResponse(ctx context.Context, c *Client, resp *http.Response, out any) error {
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		if ctx.Err() != nil {
			return c.transportError(ctx, err)
		}
		return &errdefs.Error{Code: errdefs.CodeInternal, Message: fmt.Sprintf("esfd: decode response: %v", err)}
	}
	// The decoder stops at the end of the value, before the encoder's
	// newline and, on a chunked response (any reply over 2 KiB), before
	// the last chunk. A body closed short of EOF costs the connection: the
	// next call would dial again. What is left is a few bytes.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxTrailer))
	return nil
}

// maxTrailer bounds what decodeResponse reads past a response's JSON value
// to let the connection be reused; a body with more is closed instead.
const maxTrailer = 4 << 10

// Status returns the daemon's version, state dir and object tally.
func (c *Client) Status(ctx context.Context) (*v1.StatusResponse, error) {
	var out v1.StatusResponse
	if err := c.call(ctx, http.MethodGet, "/v1/status", nil, &out, CallOptions{}); err != nil {
		return nil, err
	}
	return &out, nil
}

// Workers lists the workers of the graph and their load.
func (c *Client) Workers(ctx context.Context) (*v1.WorkersResponse, error) {
	var out v1.WorkersResponse
	if err := c.call(ctx, http.MethodGet, "/v1/workers", nil, &out, CallOptions{}); err != nil {
		return nil, err
	}
	return &out, nil
}

// Import imports source, an absolute path on the daemon's host.
func (c *Client) Import(ctx context.Context, source string, opt CallOptions) (*v1.ImportResponse, error) {
	var out v1.ImportResponse
	if err := c.call(ctx, http.MethodPost, "/v1/import", v1.ImportRequest{Source: source}, &out, opt); err != nil {
		return nil, err
	}
	return &out, nil
}

// ImportTar streams r, a tar (plain, gzip or zstd), to the daemon and
// imports it. If reading r fails, the request fails with that error; a
// reader may return an *errdefs.Error to choose the code.
func (c *Client) ImportTar(ctx context.Context, r io.Reader, opt CallOptions) (*v1.ImportResponse, error) {
	// Hide any WriterTo/Len of r: the transport must stream it, and must not
	// guess a Content-Length.
	req, err := c.newRequest(ctx, http.MethodPost, "/v1/import", struct{ io.Reader }{r}, v1.MediaTar, opt)
	if err != nil {
		return nil, err
	}
	resp, err := c.do(req)
	if err != nil {
		return nil, err
	}
	var out v1.ImportResponse
	if err := decodeResponse(ctx, c, resp, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Export writes the tree of id into the directory to (absolute, on the
// daemon's host).
func (c *Client) Export(ctx context.Context, id, to string, opt CallOptions) (*v1.ExportResponse, error) {
	var out v1.ExportResponse
	if err := c.call(ctx, http.MethodPost, "/v1/export", v1.ExportRequest{ID: id, To: to}, &out, opt); err != nil {
		return nil, err
	}
	return &out, nil
}

// ExportTarResult describes a completed tar stream.
type ExportTarResult struct {
	RootID string // the root the id resolved to
	Bytes  int64  // tar bytes written to w
	// Dropped is what a tar export left out because it could give
	// privilege on the host; nil for other streams.
	Dropped *v1.Dropped
}

// ExportTar streams the tree of id as an uncompressed tar into w. It
// succeeds only if the daemon marked the stream complete; on error, what was
// written to w is a truncated tar and must be discarded. Privileged content
// is dropped unless opts say otherwise.
func (c *Client) ExportTar(ctx context.Context, id string, w io.Writer, opts ...ExportOptions) (*ExportTarResult, error) {
	path := "/v1/export/" + url.PathEscape(id) + ".tar"
	for _, o := range opts {
		if o.PreservePrivileged {
			path += "?" + v1.QueryPreservePrivileged + "=true"
			break
		}
	}
	req, err := c.newRequest(ctx, http.MethodGet, path, nil, "", CallOptions{})
	if err != nil {
		return nil, err
	}
	resp, err := c.do(req)
	if err != nil {
		return nil, err
	}
	res, err := c.readStream(ctx, resp, "export "+id, w)
	if err != nil {
		return nil, err
	}
	if v := resp.Trailer.Get(v1.TrailerDropped); v != "" {
		var d v1.Dropped
		if err := json.Unmarshal([]byte(v), &d); err != nil {
			return nil, &errdefs.Error{Code: errdefs.CodeInternal, Message: fmt.Sprintf("export %s: bad %s trailer: %v", id, v1.TrailerDropped, err)}
		}
		res.Dropped = &d
	}
	return res, nil
}

// Fsck re-hashes every stored object and returns the bad ones.
func (c *Client) Fsck(ctx context.Context, opt CallOptions) (*v1.FsckResponse, error) {
	return c.FsckWith(ctx, v1.FsckRequest{}, opt)
}

// FsckWith is Fsck with a request (Remote: check the remote content
// store).
func (c *Client) FsckWith(ctx context.Context, req v1.FsckRequest, opt CallOptions) (*v1.FsckResponse, error) {
	var out v1.FsckResponse
	if err := c.call(ctx, http.MethodPost, "/v1/fsck", req, &out, opt); err != nil {
		return nil, err
	}
	return &out, nil
}

// trackingWriter tells the caller's write errors from the stream's.
type trackingWriter struct {
	w   io.Writer
	err error
}

func (t *trackingWriter) Write(p []byte) (int, error) {
	n, err := t.w.Write(p)
	if err != nil {
		t.err = err
	}
	return n, err
}

// ExportOptions are the options of ExportTar.
type ExportOptions struct {
	// PreservePrivileged keeps setuid/setgid bits, security.* xattrs and
	// device nodes, which are dropped by default.
	PreservePrivileged bool
}

// maxErrorBody bounds the error body a client reads.
const maxErrorBody = 1 << 20

// ReadTokenFile reads the first token of a token file (one token a line,
// # comments), as esfd reads its --token-file.
func ReadTokenFile(path string) (string, error) { return wire.ReadTokenFile(path) }
