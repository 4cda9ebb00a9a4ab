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
	"sync"

	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/fabric"
)

// POST /v1/exec has two forms, told apart by the request's Content-Type.
// Both stream the command's output back as frames:
//
//	[1 byte frame id][4 bytes big-endian payload length][payload]
//
// Stdout and stderr frames carry output as the command produces it; the
// last frame is always an exit frame, whose payload is the JSON
// fabric.ExecResult, or the {"code","message"} error that ended the
// command (a timeout, a cancelled request). A body that ends without an
// exit frame was cut short.
//
// The plain form (application/json) sends the fabric.ExecRequest as its
// body and takes no stdin and no terminal. Failures before the command
// produced anything are ordinary JSON error responses.
//
// The interactive form (MediaExecStream, see exec_stream.go) carries frames
// in both directions on one HTTP/1.1 exchange: stdin, end of stdin and
// window sizes go up in the request body while output comes down.
const (
	FrameStdin  byte = 0 // up: stdin bytes; an empty payload ends stdin
	FrameStdout byte = 1 // down
	FrameStderr byte = 2 // down
	FrameExit   byte = 3 // down, last: the result or the error
	FrameResize byte = 4 // up: rows, cols, big-endian uint16 each
	// FrameRequest is the first frame of an interactive request body: the
	// JSON fabric.ExecRequest.
	FrameRequest byte = 5
	// FrameStdinAck returns stdin credit: a big-endian uint32 count of
	// stdin bytes the command's stdin took (or dropped, once it was
	// closed). See StdinWindow.
	FrameStdinAck byte = 6
)

// maxFramePayload bounds one frame: writers split larger writes, readers
// refuse larger frames rather than allocate what a broken stream claims.
// The request frame may be as large as any JSON request (maxJSONBody).
const maxFramePayload = 64 << 10

// frameWriter writes frames to a stream, each whole and flushed: the
// command's stdout and stderr are written from different goroutines.
type frameWriter struct {
	mu    sync.Mutex
	w     io.Writer
	flush func() error
	err   error // sticky: after a failed write the stream is unusable
}

func (f *frameWriter) frame(id byte, p []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	var hdr [5]byte
	hdr[0] = id
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(p)))
	if _, err := f.w.Write(hdr[:]); err != nil {
		f.err = err
		return err
	}
	if len(p) > 0 {
		if _, err := f.w.Write(p); err != nil {
			f.err = err
			return err
		}
	}
	if f.flush != nil {
		if err := f.flush(); err != nil {
			f.err = err
			return err
		}
	}
	return nil
}

// stream returns the writer of one output stream.
func (f *frameWriter) stream(id byte) io.Writer {
	return writerFunc(func(p []byte) (int, error) {
		n := 0
		for len(p) > 0 {
			chunk := p[:min(len(p), maxFramePayload)]
			if err := f.frame(id, chunk); err != nil {
				return n, err
			}
			n += len(chunk)
			p = p[len(chunk):]
		}
		return n, nil
	})
}

type writerFunc func([]byte) (int, error)

func (w writerFunc) Write(p []byte) (int, error) { return w(p) }

// frameReader reads frames from a stream.
type frameReader struct {
	br  *bufio.Reader
	buf []byte
}

func newFrameReader(r io.Reader) *frameReader {
	return &frameReader{br: bufio.NewReaderSize(r, 32<<10)}
}

// next reads one frame of at most limit bytes. The payload is valid until
// the next call. A stream that ends between frames is io.EOF; one that
// ends inside a frame is io.ErrUnexpectedEOF; an oversized frame is
// errBadStream.
func (fr *frameReader) next(limit int) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(fr.br, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if uint64(n) > uint64(limit) {
		return 0, nil, fmt.Errorf("frame %d of %d bytes, limit %d: %w", hdr[0], n, limit, errBadStream)
	}
	if cap(fr.buf) < int(n) {
		fr.buf = make([]byte, max(int(n), maxFramePayload))
	}
	p := fr.buf[:n]
	if _, err := io.ReadFull(fr.br, p); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, fmt.Errorf("truncated frame: %w", err)
	}
	return hdr[0], p, nil
}

// readFrames reads frames from r into stdout and stderr until the exit
// frame, and returns its payload.
func readFrames(r io.Reader, stdout, stderr io.Writer) ([]byte, error) {
	return readOutput(newFrameReader(r), stdout, stderr, nil)
}

// readOutput reads output frames into stdout and stderr until the exit
// frame and returns its payload. ack, if not nil, takes the stdin credit
// of FrameStdinAck frames; without it they are a malformed stream.
func readOutput(fr *frameReader, stdout, stderr io.Writer, ack func(n uint32)) ([]byte, error) {
	for {
		id, p, err := fr.next(maxFramePayload)
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, fmt.Errorf("exec stream ended without an exit frame: %w", err)
		}
		var w io.Writer
		switch {
		case id == FrameStdout:
			w = stdout
		case id == FrameStderr:
			w = stderr
		case id == FrameExit:
			return bytes.Clone(p), nil
		case id == FrameStdinAck && ack != nil && len(p) == 4:
			ack(binary.BigEndian.Uint32(p))
			continue
		default:
			return nil, fmt.Errorf("exec stream: unexpected frame id %d (%d bytes): %w", id, len(p), errBadStream)
		}
		if w != nil {
			if _, err := w.Write(p); err != nil {
				return nil, &localWriteError{err}
			}
		}
	}
}

// errBadStream marks a stream that is not made of the frames expected.
var errBadStream = errors.New("malformed exec stream")

// localWriteError is a failure to write output where the caller asked.
type localWriteError struct{ err error }

func (e *localWriteError) Error() string { return "exec: write output: " + e.err.Error() }
func (e *localWriteError) Unwrap() error { return e.err }

// exitPayload decodes an exit frame: an error if it has a code, else the
// result.
func exitPayload(p []byte) (fabric.ExecResult, error) {
	var probe struct {
		Code errdefs.Code `json:"code"`
	}
	if err := json.Unmarshal(p, &probe); err != nil {
		return fabric.ExecResult{}, &errdefs.Error{Code: errdefs.CodeInternal, Message: fmt.Sprintf("exec: bad exit frame: %v", err)}
	}
	if probe.Code != "" {
		var e errdefs.Error
		_ = json.Unmarshal(p, &e)
		return fabric.ExecResult{}, &e
	}
	var res fabric.ExecResult
	if err := json.Unmarshal(p, &res); err != nil {
		return res, &errdefs.Error{Code: errdefs.CodeInternal, Message: fmt.Sprintf("exec: bad exit frame: %v", err)}
	}
	return res, nil
}

// checkExec is what every exec request must hold, whichever form.
func checkExec(req *fabric.ExecRequest) error {
	if len(req.Args) == 0 && req.Module == "" {
		return fmt.Errorf("exec: no command: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

func decodeExec(r *http.Request) (fabric.ExecRequest, error) {
	return decodeRequest(r, checkExec)
}

// exec runs a command and streams its output; an exec-stream request body
// is the interactive form.
func (s *Server) exec(w http.ResponseWriter, r *http.Request) error {
	return serveExec(w, r, s.f.Exec)
}

func serveExec(w http.ResponseWriter, r *http.Request, run execFunc) error {
	if mediaType(r.Header.Get("Content-Type")) == MediaExecStream {
		return serveInteractive(w, r, run)
	}
	return servePlain(w, r, run)
}

// execFunc runs a command: fabric.Fabric.Exec, or a fake in tests.
type execFunc func(context.Context, fabric.ExecRequest, fabric.ExecStreams) (fabric.ExecResult, error)

// servePlain serves the plain form. The request's context is the command's:
// a client that goes away kills it.
func servePlain(w http.ResponseWriter, r *http.Request, run execFunc) error {
	req, err := decodeExec(r)
	if err != nil {
		return err
	}
	if req.Stdin || req.TTY {
		// Both need a two-way stream, which this response alone is not.
		return fmt.Errorf("exec: stdin and tty need the interactive form (Content-Type %s): %w", MediaExecStream, errdefs.ErrUnsupported)
	}
	rc := http.NewResponseController(w)
	ls := &lazyStream{w: w, start: startExecStream}
	fw := &frameWriter{w: ls, flush: rc.Flush}
	res, err := run(r.Context(), req, fabric.ExecStreams{Stdout: fw.stream(FrameStdout), Stderr: fw.stream(FrameStderr)})
	if err != nil && !ls.started {
		return err
	}
	return writeExit(fw, res, err)
}

func startExecStream(h http.Header) {
	h.Set("Content-Type", MediaExecStream)
	h.Set("X-Content-Type-Options", "nosniff")
}

// writeExit ends a stream with the exit frame of res or err, and returns
// what the request log should say: err, or the failure to write the frame
// (the client left).
func writeExit(fw *frameWriter, res fabric.ExecResult, err error) error {
	var payload []byte
	if err != nil {
		payload, _ = json.Marshal(errdefs.Wire(err))
	} else {
		payload, _ = json.Marshal(res)
	}
	if ferr := fw.frame(FrameExit, payload); ferr != nil && err == nil {
		err = ferr
	}
	return err
}

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
func (c *Client) Exec(ctx context.Context, req fabric.ExecRequest, stdout, stderr io.Writer) (fabric.ExecResult, error) {
	return c.ExecIO(ctx, req, ExecStreams{Stdout: stdout, Stderr: stderr})
}

// ExecIO runs req in an attempt connected to s: stdin (s.Stdin), output,
// and with req.TTY a terminal and its window sizes. It returns how the
// command ended (its exit code, 128+N for signal N); an error means it did
// not end by itself (timeout: deadline_exceeded) or could not run, or that
// reading s.Stdin or writing the output failed (the command is killed
// then). Cancelling ctx kills the command. Without stdin and terminal it
// uses the plain form of POST /v1/exec, else the interactive one.
func (c *Client) ExecIO(ctx context.Context, req fabric.ExecRequest, s ExecStreams) (fabric.ExecResult, error) {
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
		return fabric.ExecResult{}, &errdefs.Error{Code: errdefs.CodeInvalidArgument, Message: err.Error()}
	}
	hr, err := c.newRequest(ctx, http.MethodPost, "/v1/exec", bytes.NewReader(b), MediaJSON, CallOptions{})
	if err != nil {
		return fabric.ExecResult{}, err
	}
	resp, err := c.do(hr)
	if err != nil {
		return fabric.ExecResult{}, err
	}
	defer resp.Body.Close()
	if err := checkExecResponse(resp); err != nil {
		return fabric.ExecResult{}, err
	}
	p, err := readFrames(resp.Body, s.Stdout, s.Stderr)
	if err != nil {
		return fabric.ExecResult{}, c.streamError(ctx, err)
	}
	return exitPayload(p)
}

func checkExecResponse(resp *http.Response) error {
	if mediaType(resp.Header.Get("Content-Type")) != MediaExecStream {
		return &errdefs.Error{Code: errdefs.CodeInternal,
			Message: fmt.Sprintf("exec: response Content-Type %q, want %s", resp.Header.Get("Content-Type"), MediaExecStream)}
	}
	return nil
}

// streamError is the error of an exec stream that broke before its exit
// frame.
func (c *Client) streamError(ctx context.Context, err error) error {
	var lw *localWriteError
	if errors.As(err, &lw) {
		return &errdefs.Error{Code: errdefs.CodeOf(lw.err), Message: lw.Error()}
	}
	if ctx.Err() != nil {
		return c.transportError(ctx, err)
	}
	code := errdefs.CodeUnavailable // the connection broke mid-stream
	if errors.Is(err, errBadStream) {
		code = errdefs.CodeInternal
	}
	return &errdefs.Error{Code: code, Message: err.Error()}
}
