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

// POST /v1/exec streams a command's output as frames:
//
//	[1 byte stream id][4 bytes big-endian payload length][payload]
//
// Stdout and stderr frames carry output as the command produces it; the
// last frame is always an exit frame, whose payload is the JSON
// fabric.ExecResult, or the {"code","message"} error that ended the
// command (a timeout, a cancelled request). A body that ends without an
// exit frame was cut short. Failures before the command produced anything
// are ordinary JSON error responses.
const (
	FrameStdout byte = 1
	FrameStderr byte = 2
	FrameExit   byte = 3
)

// maxFramePayload bounds one frame: writers split larger writes, readers
// refuse larger frames rather than allocate what a broken stream claims.
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
	if _, err := f.w.Write(p); err != nil {
		f.err = err
		return err
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

// readFrames reads frames from r into stdout and stderr until the exit
// frame, and returns its payload.
func readFrames(r io.Reader, stdout, stderr io.Writer) ([]byte, error) {
	br := bufio.NewReaderSize(r, 32<<10)
	buf := make([]byte, maxFramePayload)
	for {
		var hdr [5]byte
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, fmt.Errorf("exec stream ended without an exit frame: %w", err)
		}
		n := binary.BigEndian.Uint32(hdr[1:])
		if n > maxFramePayload {
			return nil, fmt.Errorf("exec stream: frame of %d bytes, limit %d: %w", n, maxFramePayload, errBadStream)
		}
		p := buf[:n]
		if _, err := io.ReadFull(br, p); err != nil {
			return nil, fmt.Errorf("exec stream: truncated frame: %w", io.ErrUnexpectedEOF)
		}
		var w io.Writer
		switch hdr[0] {
		case FrameStdout:
			w = stdout
		case FrameStderr:
			w = stderr
		case FrameExit:
			return bytes.Clone(p), nil
		default:
			return nil, fmt.Errorf("exec stream: unknown frame id %d: %w", hdr[0], errBadStream)
		}
		if w != nil {
			if _, err := w.Write(p); err != nil {
				return nil, &localWriteError{err}
			}
		}
	}
}

// errBadStream marks a stream that is not made of frames at all.
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

func decodeExec(r *http.Request) (fabric.ExecRequest, error) {
	return decodeRequest(r, func(req *fabric.ExecRequest) error {
		if len(req.Args) == 0 && req.Module == "" {
			return fmt.Errorf("exec: no command: %w", errdefs.ErrInvalidArgument)
		}
		return nil
	})
}

// exec runs a command and streams its output. The request's context is
// the command's: a client that goes away kills it.
func (s *Server) exec(w http.ResponseWriter, r *http.Request) error {
	req, err := decodeExec(r)
	if err != nil {
		return err
	}
	if req.Stdin || req.TTY {
		// Both need a two-way connection, which this framed response is
		// not: a valid request this endpoint cannot serve.
		return fmt.Errorf("exec: stdin and tty are not supported over POST /v1/exec: %w", errdefs.ErrUnsupported)
	}
	rc := http.NewResponseController(w)
	ls := &lazyStream{w: w, start: func(h http.Header) {
		h.Set("Content-Type", MediaExecStream)
		h.Set("X-Content-Type-Options", "nosniff")
	}}
	fw := &frameWriter{w: ls, flush: rc.Flush}
	res, err := s.f.Exec(r.Context(), req, fabric.ExecStreams{Stdout: fw.stream(FrameStdout), Stderr: fw.stream(FrameStderr)})
	if err != nil && !ls.started {
		return err
	}
	var payload []byte
	if err != nil {
		payload, _ = json.Marshal(errdefs.Wire(err))
	} else {
		payload, _ = json.Marshal(res)
	}
	if ferr := fw.frame(FrameExit, payload); ferr != nil && err == nil {
		err = ferr // the client left; the log says so
	}
	return err
}

// Exec runs req.Args in an attempt, copying its output to stdout and
// stderr (either may be nil to discard) as it comes. It returns how the
// command ended; an error means it did not end by itself (timeout:
// deadline_exceeded) or could not run. Cancelling ctx kills the command.
func (c *Client) Exec(ctx context.Context, req fabric.ExecRequest, stdout, stderr io.Writer) (fabric.ExecResult, error) {
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
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
	if mediaType(resp.Header.Get("Content-Type")) != MediaExecStream {
		return fabric.ExecResult{}, &errdefs.Error{Code: errdefs.CodeInternal,
			Message: fmt.Sprintf("exec: response Content-Type %q, want %s", resp.Header.Get("Content-Type"), MediaExecStream)}
	}
	p, err := readFrames(resp.Body, stdout, stderr)
	if err != nil {
		var lw *localWriteError
		if errors.As(err, &lw) {
			return fabric.ExecResult{}, &errdefs.Error{Code: errdefs.CodeOf(lw.err), Message: lw.Error()}
		}
		if ctx.Err() != nil {
			return fabric.ExecResult{}, c.transportError(ctx, err)
		}
		code := errdefs.CodeUnavailable // the connection broke mid-stream
		if errors.Is(err, errBadStream) {
			code = errdefs.CodeInternal
		}
		return fabric.ExecResult{}, &errdefs.Error{Code: code, Message: err.Error()}
	}
	return exitPayload(p)
}
