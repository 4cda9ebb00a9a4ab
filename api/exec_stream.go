package api

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
	"time"

	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/fabric"
)

// The interactive form of POST /v1/exec: Content-Type MediaExecStream and
// a request body made of frames, read by the server while it writes the
// response (HTTP/1.1 full duplex), so one exchange carries both ways:
//
//	up:   FrameRequest (first, the JSON fabric.ExecRequest), then any of
//	      FrameStdin (bytes; an empty one ends stdin) and FrameResize.
//	down: FrameStdout, FrameStderr, FrameStdinAck, and FrameExit last.
//
// With a terminal, the end of stdin is sent as the terminal's end-of-file
// character (^D): a terminal has no other way to say it.
//
// The response starts (200) when the command runs; a failure before that
// is an ordinary JSON error. The body's clean end (the terminating chunk)
// ends stdin and nothing else; a body that breaks means the client is
// gone, and kills the command. The connection is not reused (Connection:
// close): after the exit frame the server stops reading.
//
// Flow control: the server reads the body all the time, so that it sees a
// client leave even while the command does not read its stdin; instead of
// pushing back through the socket it grants credit. A client may have at
// most StdinWindow bytes of stdin sent and not yet acknowledged; each
// FrameStdinAck gives back what the command's stdin took. Stdin beyond
// the window, stdin after its end or without Stdin in the request, and
// frames the server does not know are invalid_argument and kill the
// command. Resize frames without a terminal are ignored.
//
// Why not a protocol upgrade (101 and a hijacked connection): the server
// would lose track of a hijacked connection, so graceful shutdown neither
// waits for such a command nor cancels it; full duplex keeps the exchange
// an ordinary request.

// StdinWindow is how many bytes of stdin a client may have in flight.
const StdinWindow = 256 << 10

// requestFrameTimeout bounds the wait for the request frame, as the
// server's ReadHeaderTimeout bounds the headers.
const requestFrameTimeout = 10 * time.Second

// serveInteractive serves the interactive form.
func serveInteractive(w http.ResponseWriter, r *http.Request, run execFunc) error {
	rc := http.NewResponseController(w)
	// Before anything is written: by default the server reads what is left
	// of a request body before it sends a response, and this body ends
	// only after the response.
	if err := rc.EnableFullDuplex(); err != nil {
		return fmt.Errorf("exec: this connection cannot carry a two-way stream: %v: %w", err, errdefs.ErrUnsupported)
	}
	w.Header().Set("Connection", "close")
	// Whatever way this ends, nothing more of the body is wanted: the
	// server's own drain of it after the response must not wait for a
	// client that keeps it open.
	defer rc.SetReadDeadline(time.Now())
	fr := newFrameReader(r.Body)
	// The request frame comes with the headers; a client that sends none
	// does not hold a handler.
	rc.SetReadDeadline(time.Now().Add(requestFrameTimeout))
	id, p, err := fr.next(maxJSONBody)
	rc.SetReadDeadline(time.Time{})
	if err != nil || id != FrameRequest {
		if err == nil {
			err = fmt.Errorf("frame id %d", id)
		}
		return fmt.Errorf("exec: the stream must start with a request frame: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	req, err := decodeJSON[fabric.ExecRequest](bytes.NewReader(p))
	if err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	if err := checkExec(&req); err != nil {
		return err
	}

	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	ls := &lazyStream{w: w, start: startExecStream}
	fw := &frameWriter{w: ls, flush: rc.Flush}
	x := &session{req: req, fw: fw, cancel: cancel, in: newStdinQueue()}
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		x.readBody(fr)
	}()
	streams := fabric.ExecStreams{
		Stdout: fw.stream(FrameStdout),
		Stderr: fw.stream(FrameStderr),
		Started: func(stdin io.WriteCloser, resize func(rows, cols uint16) error) {
			x.started(stdin, resize)
			// The command runs: say so now rather than at its first
			// output, which may wait for stdin.
			fw.mu.Lock()
			ls.begin()
			if fw.err == nil {
				fw.err = fw.flush()
			}
			fw.mu.Unlock()
		},
	}
	res, err := run(ctx, req, streams)
	x.in.close()
	x.pumps.Wait()
	if perr := x.protocolError(); perr != nil {
		err = perr // the command was killed for it
	}
	if err != nil && !ls.started {
		x.stopReading(rc, readDone)
		return err
	}
	err = writeExit(fw, res, err)
	x.stopReading(rc, readDone)
	return err
}

// session is the server's side of one interactive exec.
type session struct {
	req    fabric.ExecRequest
	fw     *frameWriter
	cancel context.CancelCauseFunc
	in     *stdinQueue
	pumps  sync.WaitGroup

	mu       sync.Mutex // guards what follows; held across resize calls to keep their order
	resize   func(rows, cols uint16) error
	pending  [2]uint16 // the last size asked for before the command ran
	protoErr error
}

// readBody reads the client's frames until the body ends or breaks.
func (x *session) readBody(fr *frameReader) {
	for {
		id, p, err := fr.next(maxFramePayload)
		if err != nil {
			if err == io.EOF {
				x.in.end() // the client is done sending; it still reads
				return
			}
			if errors.Is(err, errBadStream) {
				x.fail(fmt.Errorf("exec stream: %v: %w", err, errdefs.ErrInvalidArgument))
				return
			}
			// The client is gone (or the handler is done with the body).
			x.cancel(fmt.Errorf("exec: client went away: %w", context.Canceled))
			return
		}
		switch id {
		case FrameStdin:
			if !x.req.Stdin {
				x.fail(fmt.Errorf("exec stream: stdin frame without stdin in the request: %w", errdefs.ErrInvalidArgument))
				return
			}
			if len(p) == 0 {
				x.in.end()
				continue
			}
			if err := x.in.push(bytes.Clone(p)); err != nil {
				x.fail(err)
				return
			}
		case FrameResize:
			if len(p) != 4 {
				x.fail(fmt.Errorf("exec stream: resize frame of %d bytes, want 4: %w", len(p), errdefs.ErrInvalidArgument))
				return
			}
			x.setSize(binary.BigEndian.Uint16(p), binary.BigEndian.Uint16(p[2:]))
		default:
			x.fail(fmt.Errorf("exec stream: unexpected frame id %d from the client: %w", id, errdefs.ErrInvalidArgument))
			return
		}
	}
}

// fail kills the command for a protocol error, which its exit frame reports.
func (x *session) fail(err error) {
	x.mu.Lock()
	if x.protoErr == nil {
		x.protoErr = err
	}
	x.mu.Unlock()
	x.cancel(err)
}

func (x *session) protocolError() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.protoErr
}

func (x *session) setSize(rows, cols uint16) {
	if !x.req.TTY || rows == 0 || cols == 0 {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.resize == nil {
		x.pending = [2]uint16{rows, cols}
		return
	}
	_ = x.resize(rows, cols) // fails only once the command ended
}

// started connects the running command: a size asked for before it ran,
// and the pump from the stdin queue.
func (x *session) started(stdin io.WriteCloser, resize func(rows, cols uint16) error) {
	x.mu.Lock()
	x.resize = resize
	if resize != nil && x.pending != [2]uint16{} && x.pending != [2]uint16{x.req.Rows, x.req.Cols} {
		_ = resize(x.pending[0], x.pending[1])
	}
	x.mu.Unlock()
	if stdin == nil {
		return
	}
	x.pumps.Add(1)
	go func() {
		defer x.pumps.Done()
		x.pumpStdin(stdin)
	}()
}

// ttyEOF is a terminal's default end-of-file character, ^D.
const ttyEOF = 0x04

// pumpStdin writes the queued stdin to the command and returns the credit.
// It ends at the end of stdin (closing it) or when the command ended; a
// stdin that fails (the command closed it) drops what comes.
func (x *session) pumpStdin(stdin io.WriteCloser) {
	broken := false
	for {
		chunk, ok := x.in.pop()
		if !ok {
			return // the command ended
		}
		if chunk == nil {
			if x.req.TTY && !broken {
				// Closing a terminal's input ends nothing: its reader
				// sees end-of-file at the EOF character, as typed.
				stdin.Write([]byte{ttyEOF})
			}
			stdin.Close()
			return
		}
		if !broken {
			if _, err := stdin.Write(chunk); err != nil {
				broken = true
			}
		}
		var ack [4]byte
		binary.BigEndian.PutUint32(ack[:], uint32(len(chunk)))
		x.in.release(len(chunk))
		if x.fw.frame(FrameStdinAck, ack[:]) != nil {
			broken = true // the client is gone; the reader cancels
		}
	}
}

// stopReading ends readBody: after the exit frame nothing the client sends
// matters, and a past read deadline unblocks the read at once.
func (x *session) stopReading(rc *http.ResponseController, readDone <-chan struct{}) {
	// Without deadlines (not a net.Conn) the read ends when the client
	// closes, which Client does after the exit frame.
	_ = rc.SetReadDeadline(time.Now())
	<-readDone
}

// stdinQueue holds the client's stdin until the command takes it. It never
// blocks its writer (the body reader); the window bounds it.
type stdinQueue struct {
	mu     sync.Mutex
	chunks [][]byte
	bytes  int  // queued or being written, not yet released
	ended  bool // the client ended stdin
	closed bool // the command ended: pop returns false
	wake   chan struct{}
}

func newStdinQueue() *stdinQueue { return &stdinQueue{wake: make(chan struct{}, 1)} }

func (q *stdinQueue) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *stdinQueue) push(p []byte) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.ended:
		return fmt.Errorf("exec stream: stdin after its end: %w", errdefs.ErrInvalidArgument)
	case q.bytes+len(p) > StdinWindow:
		return fmt.Errorf("exec stream: %d bytes of stdin in flight, window %d: %w", q.bytes+len(p), StdinWindow, errdefs.ErrInvalidArgument)
	}
	if !q.closed {
		q.chunks = append(q.chunks, p)
		q.bytes += len(p)
		q.signal()
	}
	return nil
}

func (q *stdinQueue) end() {
	q.mu.Lock()
	q.ended = true
	q.mu.Unlock()
	q.signal()
}

func (q *stdinQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.chunks = nil
	q.mu.Unlock()
	q.signal()
}

// pop returns the next chunk, nil at the end of stdin, or false once the
// command ended.
func (q *stdinQueue) pop() ([]byte, bool) {
	for {
		q.mu.Lock()
		switch {
		case q.closed:
			q.mu.Unlock()
			return nil, false
		case len(q.chunks) > 0:
			p := q.chunks[0]
			q.chunks[0] = nil
			q.chunks = q.chunks[1:]
			q.mu.Unlock()
			return p, true
		case q.ended:
			q.mu.Unlock()
			return nil, true
		}
		q.mu.Unlock()
		<-q.wake
	}
}

func (q *stdinQueue) release(n int) {
	q.mu.Lock()
	q.bytes -= n
	q.mu.Unlock()
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
func (c *Client) execInteractive(ctx context.Context, req fabric.ExecRequest, s ExecStreams) (fabric.ExecResult, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return fabric.ExecResult{}, &errdefs.Error{Code: errdefs.CodeInvalidArgument, Message: err.Error()}
	}
	hr, err := c.newRequest(ctx, http.MethodPost, "/v1/exec", nil, MediaExecStream, CallOptions{})
	if err != nil {
		return fabric.ExecResult{}, err
	}
	conn, err := c.dial(ctx)
	if err != nil {
		return fabric.ExecResult{}, c.transportError(ctx, err)
	}
	done := make(chan struct{}) // the command ended, or ExecIO gives up
	var wg sync.WaitGroup
	defer func() {
		close(done)
		conn.Close()
		wg.Wait()
	}()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()

	bw := bufio.NewWriter(conn)
	auth := ""
	if c.token != "" {
		auth = "Authorization: Bearer " + c.token + "\r\n"
	}
	fmt.Fprintf(bw, "POST /v1/exec HTTP/1.1\r\nHost: %s\r\n%sContent-Type: %s\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
		c.host, auth, MediaExecStream)
	// Each frame is a chunk or two, flushed whole.
	up := &frameWriter{w: httputil.NewChunkedWriter(bw), flush: bw.Flush}
	if err := up.frame(FrameRequest, b); err != nil {
		return fabric.ExecResult{}, c.transportError(ctx, err)
	}
	cr := newCredit(StdinWindow, done)
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
		return fabric.ExecResult{}, c.stdinFailure(stdinErr, c.transportError(ctx, err))
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fabric.ExecResult{}, errorFromResponse(resp)
	}
	if err := checkExecResponse(resp); err != nil {
		return fabric.ExecResult{}, err
	}
	p, err := readOutput(newFrameReader(resp.Body), s.Stdout, s.Stderr, func(n uint32) { cr.give(int(n)) })
	if err != nil {
		return fabric.ExecResult{}, c.stdinFailure(stdinErr, c.streamError(ctx, err))
	}
	return exitPayload(p)
}

// stdinFailure prefers a failure to read the caller's stdin, which killed
// the command, to what the exchange saw of it.
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
func sendStdin(r io.Reader, up *frameWriter, cr *credit, done <-chan struct{}, errc chan<- error, cancel func()) {
	buf := make([]byte, 32<<10)
	for {
		n, ok := cr.take(len(buf))
		if !ok {
			return
		}
		m, err := r.Read(buf[:n])
		cr.give(n - m)
		select {
		case <-done:
			return // the command ended while we read: drop it
		default:
		}
		if m > 0 {
			if up.frame(FrameStdin, buf[:m]) != nil {
				return
			}
		}
		switch {
		case err == io.EOF:
			up.frame(FrameStdin, nil)
			return
		case err != nil:
			errc <- err
			cancel()
			return
		}
	}
}

// sendSizes forwards window sizes until the command ends.
func sendSizes(sizes <-chan [2]uint16, up *frameWriter, done <-chan struct{}) {
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
			if up.frame(FrameResize, p[:]) != nil {
				return
			}
		}
	}
}
