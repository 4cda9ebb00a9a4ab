package envd

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
)

// Target says how to reach one sandbox's envd.
type Target struct {
	// BaseURL is where requests are sent, without a trailing slash: the
	// per-sandbox host ("https://49983-<id>.e2b.app") or one proxy URL that
	// routes by the E2b-Sandbox-Id header.
	BaseURL string
	// Host, when set, is sent as the HTTP Host instead of BaseURL's host:
	// dial a proxy node directly while naming the sandbox's virtual host.
	Host string
	// Header is set on every request (access token, routing, traffic
	// tokens, user agent).
	Header http.Header
	// User runs commands and owns files; "" leaves it to envd's default.
	User string
}

// Client calls one sandbox's envd. It is safe for concurrent use.
type Client struct {
	t  Target
	hc *http.Client

	start      *connect.Client[StartRequest, StartResponse]
	sendInput  *connect.Client[SendInputRequest, Empty]
	closeStdin *connect.Client[CloseStdinRequest, Empty]
	sendSignal *connect.Client[SendSignalRequest, Empty]
	stat       *connect.Client[PathRequest, EntryResponse]
	listDir    *connect.Client[ListDirRequest, ListDirResponse]
	makeDir    *connect.Client[PathRequest, EntryResponse]
	remove     *connect.Client[PathRequest, Empty]
	move       *connect.Client[MoveRequest, EntryResponse]
}

// NewClient binds a client to t. hc (nil means http.DefaultClient) must
// not have a Timeout: streams and transfers last as long as their ctx.
func NewClient(hc *http.Client, t Target) *Client {
	if hc == nil {
		hc = http.DefaultClient
	}
	base := hc.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	wrapped := *hc
	wrapped.Transport = &transport{base: base, host: t.Host, header: t.Header.Clone()}
	c := &Client{t: t, hc: &wrapped}
	opts := []connect.ClientOption{
		connect.WithCodec(Codec{}),
		// E2B's SDKs speak identity only; gzip would cost CPU on every
		// output chunk for nothing on a fast link.
		connect.WithAcceptCompression("gzip", nil, nil),
	}
	u := strings.TrimRight(t.BaseURL, "/")
	c.start = connect.NewClient[StartRequest, StartResponse](c.hc, u+ProcStart, opts...)
	c.sendInput = connect.NewClient[SendInputRequest, Empty](c.hc, u+ProcSendInput, opts...)
	c.closeStdin = connect.NewClient[CloseStdinRequest, Empty](c.hc, u+ProcCloseStdin, opts...)
	c.sendSignal = connect.NewClient[SendSignalRequest, Empty](c.hc, u+ProcSendSignal, opts...)
	c.stat = connect.NewClient[PathRequest, EntryResponse](c.hc, u+FsStat, opts...)
	c.listDir = connect.NewClient[ListDirRequest, ListDirResponse](c.hc, u+FsListDir, opts...)
	c.makeDir = connect.NewClient[PathRequest, EntryResponse](c.hc, u+FsMakeDir, opts...)
	c.remove = connect.NewClient[PathRequest, Empty](c.hc, u+FsRemove, opts...)
	c.move = connect.NewClient[MoveRequest, EntryResponse](c.hc, u+FsMove, opts...)
	return c
}

// transport adds the sandbox's headers and virtual host to every request,
// Connect and plain HTTP alike, so both paths route the same way.
type transport struct {
	base   http.RoundTripper
	host   string
	header http.Header
}

func (t *transport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range t.header {
		r.Header[k] = v
	}
	if t.host != "" {
		r.Host = t.host
	}
	return t.base.RoundTrip(r)
}

// userHeader selects the user for RPCs: Basic auth with an empty password.
func (c *Client) userHeader(h http.Header) {
	if c.t.User != "" {
		h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(c.t.User+":")))
	}
}

func unary[Req, Res any](ctx context.Context, c *Client, cl *connect.Client[Req, Res], msg *Req) (*Res, error) {
	req := connect.NewRequest(msg)
	c.userHeader(req.Header())
	res, err := cl.CallUnary(ctx, req)
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

// Start runs a process and returns its event stream (start, data..., end,
// then the end-of-stream frame). ctx's deadline travels as
// Connect-Timeout-Ms, on which envd kills the process. Cancelling ctx only
// closes the stream: envd keeps the process running, so a caller that gives
// up must SendSignal it. keepalive > 0 asks envd for keepalive events at
// that interval.
func (c *Client) Start(ctx context.Context, msg *StartRequest, keepalive time.Duration) (*connect.ServerStreamForClient[StartResponse], error) {
	req := connect.NewRequest(msg)
	c.userHeader(req.Header())
	if keepalive > 0 {
		req.Header().Set(HeaderKeepalive, strconv.Itoa(max(1, int(keepalive/time.Second))))
	}
	return c.start.CallServerStream(ctx, req)
}

// SendInput writes data to a process's stdin.
func (c *Client) SendInput(ctx context.Context, pid uint32, data []byte) error {
	_, err := unary(ctx, c, c.sendInput, &SendInputRequest{Process: &ProcessSelector{Pid: pid}, Input: &ProcessInput{Stdin: data}})
	return err
}

// CloseStdin closes a process's stdin (envd >= 0.5.2).
func (c *Client) CloseStdin(ctx context.Context, pid uint32) error {
	_, err := unary(ctx, c, c.closeStdin, &CloseStdinRequest{Process: &ProcessSelector{Pid: pid}})
	return err
}

// SendSignal signals the selected process (SignalKill or SignalTerm).
func (c *Client) SendSignal(ctx context.Context, sel *ProcessSelector, signal string) error {
	_, err := unary(ctx, c, c.sendSignal, &SendSignalRequest{Process: sel, Signal: signal})
	return err
}

// Stat describes path without following a final symlink.
func (c *Client) Stat(ctx context.Context, path string) (*EntryInfo, error) {
	res, err := unary(ctx, c, c.stat, &PathRequest{Path: path})
	if err != nil {
		return nil, err
	}
	if res.Entry == nil {
		return nil, connect.NewError(connect.CodeInternal, errors.New("stat: response without entry"))
	}
	return res.Entry, nil
}

// ListDir lists a directory to depth levels (0 means 1).
func (c *Client) ListDir(ctx context.Context, path string, depth uint32) ([]*EntryInfo, error) {
	res, err := unary(ctx, c, c.listDir, &ListDirRequest{Path: path, Depth: depth})
	if err != nil {
		return nil, err
	}
	return res.Entries, nil
}

// MakeDir creates path and its parents; an existing directory is
// connect.CodeAlreadyExists.
func (c *Client) MakeDir(ctx context.Context, path string) (*EntryInfo, error) {
	res, err := unary(ctx, c, c.makeDir, &PathRequest{Path: path})
	if err != nil {
		return nil, err
	}
	return res.Entry, nil
}

// Remove removes path recursively; a missing path is success.
func (c *Client) Remove(ctx context.Context, path string) error {
	_, err := unary(ctx, c, c.remove, &PathRequest{Path: path})
	return err
}

// Move renames src to dst.
func (c *Client) Move(ctx context.Context, src, dst string) (*EntryInfo, error) {
	res, err := unary(ctx, c, c.move, &MoveRequest{Source: src, Destination: dst})
	if err != nil {
		return nil, err
	}
	return res.Entry, nil
}

// HTTPError is a non-2xx answer of the /files API (or of the proxy in
// front of it).
type HTTPError struct {
	Status     int
	Message    string
	RetryAfter string // the Retry-After header, if any
}

func (e *HTTPError) Error() string {
	return fmt.Sprintf("envd: HTTP %d: %s", e.Status, e.Message)
}

func (c *Client) filesURL(path string) string {
	q := url.Values{"path": {path}}
	if c.t.User != "" {
		q.Set("username", c.t.User)
	}
	return strings.TrimRight(c.t.BaseURL, "/") + "/files?" + q.Encode()
}

// Download opens path for reading; the caller closes the body.
func (c *Client) Download(ctx context.Context, path string) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.filesURL(path), nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, readHTTPError(resp)
	}
	return resp.Body, nil
}

// errUploadDone unblocks the multipart writer once the request is over.
var errUploadDone = errors.New("envd: upload request finished")

// sourceReader remembers the error of the reader being uploaded, to tell
// it apart from the pipe's.
type sourceReader struct {
	r   io.Reader
	err error
}

func (s *sourceReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && err != io.EOF {
		s.err = err
	}
	return n, err
}

// Upload streams r into path as one multipart "file" part. envd creates
// missing parents and overwrites in place (not atomically).
//
// When r fails, the body is still ended cleanly: envd finishes a truncated
// file and answers, and Upload returns r's error. So once Upload returns,
// envd is done with path and a caller can remove it; aborting the request
// instead would leave envd writing after the caller's cleanup. r is read
// on a goroutine that Upload waits for, so a reader that blocks forever
// blocks Upload too.
func (c *Client) Upload(ctx context.Context, path string, r io.Reader) error {
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	src := &sourceReader{r: r}
	done := make(chan error, 1)
	go func() {
		part, err := mw.CreateFormFile("file", path)
		if err == nil {
			_, err = io.Copy(part, src)
		}
		if src.err != nil || err == nil {
			err = mw.Close()
		}
		pw.CloseWithError(err)
		done <- src.err
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.filesURL(path), pr)
	if err != nil {
		pr.CloseWithError(errUploadDone)
		<-done
		return err
	}
	req.Header.Set("Content-Type", mw.FormDataContentType())
	resp, err := c.hc.Do(req)
	pr.CloseWithError(errUploadDone) // the server may answer before reading everything
	srcErr := <-done
	if err != nil {
		if srcErr != nil {
			return srcErr
		}
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return readHTTPError(resp)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	return srcErr
}

func readHTTPError(resp *http.Response) error {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	e := &HTTPError{Status: resp.StatusCode, RetryAfter: resp.Header.Get("Retry-After")}
	var body HTTPErrorBody
	if json.Unmarshal(data, &body) == nil && body.Message != "" {
		e.Message = body.Message
	} else {
		e.Message = strings.TrimSpace(string(data))
		if e.Message == "" {
			e.Message = http.StatusText(resp.StatusCode)
		}
	}
	return e
}

// VersionAtLeast reports whether the dotted version v is at least min. An
// empty or unreadable v counts as new: the control plane always reports
// envdVersion, and guessing old would disable features for nothing.
func VersionAtLeast(v, min string) bool {
	a, ok := parseVersion(v)
	if !ok {
		return true
	}
	b, _ := parseVersion(min)
	for i := range a {
		if a[i] != b[i] {
			return a[i] > b[i]
		}
	}
	return true
}

func parseVersion(v string) ([3]int, bool) {
	var out [3]int
	v = strings.TrimPrefix(strings.TrimSpace(v), "v")
	if i := strings.IndexAny(v, "-+"); i >= 0 {
		v = v[:i]
	}
	parts := strings.Split(v, ".")
	if v == "" || len(parts) > 3 {
		return out, false
	}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return out, false
		}
		out[i] = n
	}
	return out, true
}
