package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"sync"

	"github.com/esf-dev/esf/api/internal/wire"
	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/errdefs"
)

// ExecStreams connect a command run by Client.ExecIO to its caller.
type ExecStreams struct {
	// Stdin, if not nil, is copied to the command's stdin (the request's
	// Stdin field is set from it) and its io.EOF closes it (on a
	// terminal, where closing ends nothing, it types ^D). It is read
	// only while the command runs: a Read still blocked when the command
	// ends is not waited for (its bytes are dropped, and it is the last
	// Read), so a Stdin that can block forever (a terminal) may leave one
	// goroutine behind until that Read returns.
	Stdin io.Reader
	// Stdout and Stderr receive the output as it comes; nil discards it.
	// With a terminal (ExecRequest.TTY) all output is on Stdout.
	Stdout, Stderr io.Writer
	// Resize, with a terminal, sends window sizes (rows, cols) as they
	// change; the initial size is the request's Rows and Cols. It is read
	// until the command ends or it is closed.
	Resize <-chan [2]uint16
}

// Exec runs req.Args in an attempt, copying its output to stdout and
// stderr (either may be nil to discard) as it comes. It returns how the
// command ended; an error means it did not end by itself (timeout:
// deadline_exceeded) or could not run. Cancelling ctx kills the command.
// It is ExecIO without stdin.
func (c *Client) Exec(ctx context.Context, req v1.ExecRequest, stdout, stderr io.Writer) (v1.ExecResult, error) {
	return c.ExecIO(ctx, req, ExecStreams{Stdout: stdout, Stderr: stderr})
}

// ExecIO runs req in an attempt connected to s: stdin (s.Stdin), output,
// and with req.TTY a terminal and its window sizes. It returns how the
// command ended (its exit code, 128+N for signal N); an error means it did
// not end by itself (timeout: deadline_exceeded) or could not run, or that
// reading s.Stdin or writing the output failed (the command is killed
// then). Cancelling ctx kills the command. Without stdin and terminal it
// uses the plain form of POST /v1/exec, else the interactive one.
func (c *Client) ExecIO(ctx context.Context, req v1.ExecRequest, s ExecStreams) (v1.ExecResult, error) {
	if s.Stdout == nil {
		s.Stdout = io.Discard
	}
	if s.Stderr == nil {
		s.Stderr = io.Discard
	}
	req.Stdin = s.Stdin != nil
	if req.Stdin || req.TTY {
		return c.execInteractive(ctx, req, s)
	}
	b, err := json.Marshal(req)
	if err != nil {
		return v1.ExecResult{}, &errdefs.Error{Code: errdefs.CodeInvalidArgument, Message: err.Error()}
	}
	hr, err := c.newRequest(ctx, http.MethodPost, "/v1/exec", bytes.NewReader(b), v1.MediaJSON, CallOptions{})
	if err != nil {
		return v1.ExecResult{}, err
	}
	resp, err := c.do(hr)
	if err != nil {
		return v1.ExecResult{}, err
	}
	defer resp.Body.Close()
	if err := checkExecResponse(resp); err != nil {
		return v1.ExecResult{}, err
	}
	p, err := wire.ReadFrames(resp.Body, s.Stdout, s.Stderr)
	if err != nil {
		return v1.ExecResult{}, c.streamError(ctx, err)
	}
	return wire.ExitPayload(p)
}

func checkExecResponse(resp *http.Response) error {
	if wire.MediaType(resp.Header.Get("Content-Type")) != v1.MediaExecStream {
		return &errdefs.Error{Code: errdefs.CodeInternal,
			Message: fmt.Sprintf("exec: response Content-Type %q, want %s", resp.Header.Get("Content-Type"), v1.MediaExecStream)}
	}
	return nil
}

// streamError is the error of an exec stream that broke before its exit
// frame.
func (c *Client) streamError(ctx context.Context, err error) error {
	var lw *wire.LocalWriteError
	if errors.As(err, &lw) {
		return &errdefs.Error{Code: errdefs.CodeOf(lw.Err), Message: lw.Error()}
	}
	if ctx.Err() != nil {
		return c.transportError(ctx, err)
	}
	code := errdefs.CodeUnavailable // the connection broke mid-stream
	if errors.Is(err, wire.ErrBadStream) {
		code = errdefs.CodeInternal
	}
	return &errdefs.Error{Code: code, Message: err.Error()}
}

// credit is the client's side of the stdin window.
type credit struct {
	mu   sync.Mutex
	n    int
	more chan struct{}
	done <-chan struct{}
}

func newCredit(n int, done <-chan struct{}) *credit {
	return &credit{n: n, more: make(chan struct{}, 1), done: done}
}

// take waits for credit and takes up to max bytes of it; false once done.
func (c *credit) take(max int) (int, bool) {
	for {
		c.mu.Lock()
		if c.n > 0 {
			k := min(c.n, max)
			c.n -= k
			c.mu.Unlock()
			return k, true
		}
		c.mu.Unlock()
		select {
		case <-c.more:
		case <-c.done:
			return 0, false
		}
	}
}

// give returns n bytes of credit (an ack, or credit taken and not used).
func (c *credit) give(n int) {
	if n <= 0 {
		return
	}
	c.mu.Lock()
	c.n += n
	c.mu.Unlock()
	select {
	case c.more <- struct{}{}:
	default:
	}
}

// execInteractive runs req over the interactive form, on a connection of
// its own rather than through the http.Transport: a Transport whose
// request fails waits for the request body's Read to return before it
// returns, and this body's next bytes may be a keystroke away. Here every
// way out closes the connection, which unblocks everything but a
// caller's Stdin.Read.
func (c *Client) execInteractive(ctx context.Context, req v1.ExecRequest, s ExecStreams) (v1.ExecResult, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return v1.ExecResult{}, &errdefs.Error{Code: errdefs.CodeInvalidArgument, Message: err.Error()}
	}
	hr, err := c.newRequest(ctx, http.MethodPost, "/v1/exec", nil, v1.MediaExecStream, CallOptions{})
	if err != nil {
		return v1.ExecResult{}, err
	}
	conn, err := c.dial(ctx)
	if err != nil {
		return v1.ExecResult{}, c.transportError(ctx, err)
	}
	// xctx ends when the command ended, ExecIO gives up, or the caller
	// cancels: its end closes the connection, so whatever the server
	// answers to that (an ack for stdin it drops) comes after done is
	// closed, and the stdin sender reads no more of the caller's stdin.
	xctx, end := context.WithCancel(ctx)
	done := xctx.Done()
	var wg sync.WaitGroup
	defer func() {
		end()
		conn.Close()
		wg.Wait()
	}()
	stop := context.AfterFunc(xctx, func() { conn.Close() })
	defer stop()

	bw := bufio.NewWriter(conn)
	auth := ""
	if c.token != "" {
		auth = "Authorization: Bearer " + c.token + "\r\n"
	}
	fmt.Fprintf(bw, "POST /v1/exec HTTP/1.1\r\nHost: %s\r\n%sContent-Type: %s\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
		c.host, auth, v1.MediaExecStream)
	// Each frame is a chunk or two, flushed whole.
	up := wire.NewWriter(httputil.NewChunkedWriter(bw), bw.Flush)
	if err := up.Frame(v1.FrameRequest, b); err != nil {
		return v1.ExecResult{}, c.transportError(ctx, err)
	}
	cr := newCredit(v1.StdinWindow, done)
	stdinErr := make(chan error, 1)
	if s.Stdin != nil {
		// Not in wg: it may be blocked in s.Stdin.Read (see ExecStreams).
		go sendStdin(s.Stdin, up, cr, done, stdinErr, func() { conn.Close() })
	}
	if s.Resize != nil && req.TTY {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sendSizes(s.Resize, up, done)
		}()
	}

	resp, err := http.ReadResponse(bufio.NewReaderSize(conn, 32<<10), hr)
	if err != nil {
		return v1.ExecResult{}, c.stdinFailure(stdinErr, c.transportError(ctx, err))
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return v1.ExecResult{}, c.stdinFailure(stdinErr, errorFromResponse(resp))
	}
	if err := checkExecResponse(resp); err != nil {
		return v1.ExecResult{}, err
	}
	p, err := wire.ReadOutput(wire.NewReader(resp.Body), s.Stdout, s.Stderr, func(n uint32) { cr.give(int(n)) })
	if err != nil {
		return v1.ExecResult{}, c.stdinFailure(stdinErr, c.streamError(ctx, err))
	}
	res, err := wire.ExitPayload(p)
	if err != nil {
		// The server may have seen us leave and answered before the
		// connection closed: a TLS connection says close_notify first,
		// and the exit frame can come back through it in between.
		return res, c.stdinFailure(stdinErr, err)
	}
	return res, nil
}

// stdinFailure prefers a failure to read the caller's stdin, which killed
// the command, to what the exchange saw of it. A command that ended by
// itself is not an error even if stdin failed after.
func (c *Client) stdinFailure(stdinErr <-chan error, err error) error {
	select {
	case serr := <-stdinErr:
		return &errdefs.Error{Code: errdefs.CodeOf(serr), Message: fmt.Sprintf("exec: read stdin: %v", serr)}
	default:
		return err
	}
}

// sendStdin copies r up as stdin frames within the window, then ends
// stdin. A read error kills the command (cancel) and is reported.
func sendStdin(r io.Reader, up *wire.Writer, cr *credit, done <-chan struct{}, errc chan<- error, cancel func()) {
	buf := make([]byte, 32<<10)
	for {
		n, ok := cr.take(len(buf))
		if !ok {
			return
		}
		select {
		case <-done:
			return // credit that came as the exchange ended: read no more
		default:
		}
		m, err := r.Read(buf[:n])
		cr.give(n - m)
		select {
		case <-done:
			return // the command ended while we read: drop it
		default:
		}
		if m > 0 {
			if up.Frame(v1.FrameStdin, buf[:m]) != nil {
				return
			}
		}
		switch {
		case err == io.EOF:
			up.Frame(v1.FrameStdin, nil)
			return
		case err != nil:
			errc <- err
			cancel()
			return
		}
	}
}

// sendSizes forwards window sizes until the command ends.
func sendSizes(sizes <-chan [2]uint16, up *wire.Writer, done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		case sz, ok := <-sizes:
			if !ok {
				return
			}
			var p [4]byte
			binary.BigEndian.PutUint16(p[:], sz[0])
			binary.BigEndian.PutUint16(p[2:], sz[1])
			if up.Frame(v1.FrameResize, p[:]) != nil {
				return
			}
		}
	}
}
