// Package wire is the protocol code the server (package api) and the
// client (api/client) share: the framing of POST /v1/exec (see api/v1's
// Frame* constants) and the mapping of HTTP statuses to error codes.
package wire

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/errdefs"
)

// NewWriter returns a writer of frames to w; flush, if not nil, runs
// after each frame.
func NewWriter(w io.Writer, flush func() error) *Writer {
	return &Writer{w: w, flush: flush}
}

// MaxPayload bounds one frame: writers split larger writes, readers
// refuse larger frames rather than allocate what a broken stream claims.
// The request frame may be as large as any JSON request.
const MaxPayload = 64 << 10

// Writer writes frames to a stream, each whole and flushed: the
// command's stdout and stderr are written from different goroutines.
type Writer struct {
	mu    sync.Mutex
	w     io.Writer
	flush func() error
	err   error // sticky: after a failed write the stream is unusable
}

func (f *Writer) Frame(id byte, p []byte) error {
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
func (f *Writer) Stream(id byte) io.Writer {
	return writerFunc(func(p []byte) (int, error) {
		n := 0
		for len(p) > 0 {
			chunk := p[:min(len(p), MaxPayload)]
			if err := f.Frame(id, chunk); err != nil {
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

// Reader reads frames from a stream.
type Reader struct {
	br  *bufio.Reader
	buf []byte
}

func NewReader(r io.Reader) *Reader {
	return &Reader{br: bufio.NewReaderSize(r, 32<<10)}
}

// next reads one frame of at most limit bytes. The payload is valid until
// the next call. A stream that ends between frames is io.EOF; one that
// ends inside a frame is io.ErrUnexpectedEOF; an oversized frame is
// ErrBadStream.
func (fr *Reader) Next(limit int) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(fr.br, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if uint64(n) > uint64(limit) {
		return 0, nil, fmt.Errorf("frame %d of %d bytes, limit %d: %w", hdr[0], n, limit, ErrBadStream)
	}
	if cap(fr.buf) < int(n) {
		fr.buf = make([]byte, max(int(n), MaxPayload))
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

// ReadFrames reads frames from r into stdout and stderr until the exit
// frame, and returns its payload.
func ReadFrames(r io.Reader, stdout, stderr io.Writer) ([]byte, error) {
	return ReadOutput(NewReader(r), stdout, stderr, nil)
}

// ReadOutput reads output frames into stdout and stderr until the exit
// frame and returns its payload. ack, if not nil, takes the stdin credit
// of v1.FrameStdinAck frames; without it they are a malformed stream.
func ReadOutput(fr *Reader, stdout, stderr io.Writer, ack func(n uint32)) ([]byte, error) {
	for {
		id, p, err := fr.Next(MaxPayload)
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, fmt.Errorf("exec stream ended without an exit frame: %w", err)
		}
		var w io.Writer
		switch {
		case id == v1.FrameStdout:
			w = stdout
		case id == v1.FrameStderr:
			w = stderr
		case id == v1.FrameExit:
			return bytes.Clone(p), nil
		case id == v1.FrameStdinAck && ack != nil && len(p) == 4:
			ack(binary.BigEndian.Uint32(p))
			continue
		default:
			return nil, fmt.Errorf("exec stream: unexpected frame id %d (%d bytes): %w", id, len(p), ErrBadStream)
		}
		if w != nil {
			if _, err := w.Write(p); err != nil {
				return nil, &LocalWriteError{Err: err}
			}
		}
	}
}

// ErrBadStream marks a stream that is not made of the frames expected.
var ErrBadStream = errors.New("malformed exec stream")

// LocalWriteError is a failure to write output where the caller asked.
type LocalWriteError struct{ Err error }

func (e *LocalWriteError) Error() string { return "exec: write output: " + e.Err.Error() }
func (e *LocalWriteError) Unwrap() error { return e.Err }

// ExitPayload decodes an exit frame: an error if it has a code, else the
// result.
func ExitPayload(p []byte) (v1.ExecResult, error) {
	var probe struct {
		Code errdefs.Code `json:"code"`
	}
	if err := json.Unmarshal(p, &probe); err != nil {
		return v1.ExecResult{}, &errdefs.Error{Code: errdefs.CodeInternal, Message: fmt.Sprintf("exec: bad exit frame: %v", err)}
	}
	if probe.Code != "" {
		var e errdefs.Error
		_ = json.Unmarshal(p, &e)
		return v1.ExecResult{}, &e
	}
	var res v1.ExecResult
	if err := json.Unmarshal(p, &res); err != nil {
		return res, &errdefs.Error{Code: errdefs.CodeInternal, Message: fmt.Sprintf("exec: bad exit frame: %v", err)}
	}
	return res, nil
}

// Start runs begin under the writer's lock and flushes, as a frame would:
// it starts a stream that has no frame to send yet.
func (f *Writer) Start(begin func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	begin()
	if f.err == nil && f.flush != nil {
		f.err = f.flush()
	}
}
