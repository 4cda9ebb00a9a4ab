package api

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/esf-dev/esf/api/internal/wire"
	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/fabric"
)

// The interactive form of POST /v1/exec: Content-Type v1.MediaExecStream and
// a request body made of frames, read by the server while it writes the
// response (HTTP/1.1 full duplex), so one exchange carries both ways:
//
//	up:   v1.FrameRequest (first, the JSON v1.ExecRequest), then any of
//	      v1.FrameStdin (bytes; an empty one ends stdin) and v1.FrameResize.
//	down: v1.FrameStdout, v1.FrameStderr, v1.FrameStdinAck, and v1.FrameExit last.
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
// most v1.StdinWindow bytes of stdin sent and not yet acknowledged; each
// v1.FrameStdinAck gives back what the command's stdin took. Stdin beyond
// the window, stdin after its end or without Stdin in the request, and
// frames the server does not know are invalid_argument and kill the
// command. Resize frames without a terminal are ignored.
//
// Why not a protocol upgrade (101 and a hijacked connection): the server
// would lose track of a hijacked connection, so graceful shutdown neither
// waits for such a command nor cancels it; full duplex keeps the exchange
// an ordinary request.

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
	fr := wire.NewReader(r.Body)
	// The request frame comes with the headers; a client that sends none
	// does not hold a handler.
	rc.SetReadDeadline(time.Now().Add(requestFrameTimeout))
	id, p, err := fr.Next(maxJSONBody)
	rc.SetReadDeadline(time.Time{})
	if err != nil || id != v1.FrameRequest {
		if err == nil {
			err = fmt.Errorf("frame id %d", id)
		}
		return fmt.Errorf("exec: the stream must start with a request frame: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	view, err := decodeJSON[v1.ExecRequest](bytes.NewReader(p))
	if err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	req := execRequest(view)
	if err := checkExec(&req); err != nil {
		return err
	}

	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	ls := &lazyStream{w: w, start: startExecStream}
	fw := wire.NewWriter(ls, rc.Flush)
	x := &session{req: req, fw: fw, cancel: cancel, in: newStdinQueue()}
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		x.readBody(fr)
	}()
	streams := fabric.ExecStreams{
		Stdout: fw.Stream(v1.FrameStdout),
		Stderr: fw.Stream(v1.FrameStderr),
		Started: func(stdin io.WriteCloser, resize func(rows, cols uint16) error) {
			x.started(stdin, resize)
			// The command runs: say so now rather than at its first
			// output, which may wait for stdin.
			fw.Start(ls.begin)
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
	fw     *wire.Writer
	cancel context.CancelCauseFunc
	in     *stdinQueue
	pumps  sync.WaitGroup

	mu       sync.Mutex // guards what follows; held across resize calls to keep their order
	resize   func(rows, cols uint16) error
	pending  [2]uint16 // the last size asked for before the command ran
	protoErr error
}

// readBody reads the client's frames until the body ends or breaks.
func (x *session) readBody(fr *wire.Reader) {
	for {
		id, p, err := fr.Next(wire.MaxPayload)
		if err != nil {
			if err == io.EOF {
				x.in.end() // the client is done sending; it still reads
				return
			}
			if errors.Is(err, wire.ErrBadStream) {
				x.fail(fmt.Errorf("exec stream: %v: %w", err, errdefs.ErrInvalidArgument))
				return
			}
			// The client is gone (or the handler is done with the body).
			x.cancel(fmt.Errorf("exec: client went away: %w", context.Canceled))
			return
		}
		switch id {
		case v1.FrameStdin:
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
		case v1.FrameResize:
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
		if x.fw.Frame(v1.FrameStdinAck, ack[:]) != nil {
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
	case q.bytes+len(p) > v1.StdinWindow:
		return fmt.Errorf("exec stream: %d bytes of stdin in flight, window %d: %w", q.bytes+len(p), v1.StdinWindow, errdefs.ErrInvalidArgument)
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
