package api

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"testing"

	"github.com/esf-dev/esf/api/internal/wire"
	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/fabric"
)

func resizePayload(rows, cols uint16) string {
	return string(binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(nil, rows), cols))
}

// FuzzExecOutputFrames feeds the client's reader of the exec response
// arbitrary bytes: it returns the exit payload or an error that says the
// stream was malformed or cut, never panics, never invents output, and the
// exit payload decodes to a result or an error without a panic.
func FuzzExecOutputFrames(f *testing.F) {
	f.Add(frames(v1.FrameStdout, "out\n", v1.FrameStderr, "err\n", v1.FrameExit, `{"exit_code":3}`))
	f.Add(frames(v1.FrameStdinAck, "\x00\x00\x01\x00", v1.FrameExit, `{"code":"not_found","message":"gone"}`))
	f.Add(frames(v1.FrameExit, `not json`))
	f.Add(frames(v1.FrameStdout, "only output"))
	f.Add(frames(v1.FrameResize, resizePayload(24, 80)))
	f.Add([]byte{v1.FrameStdout, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{v1.FrameExit, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		var out, errOut bytes.Buffer
		var acked uint64
		p, err := wire.ReadOutput(wire.NewReader(bytes.NewReader(data)), &out, &errOut, func(n uint32) { acked += uint64(n) })
		if err != nil {
			if !errors.Is(err, wire.ErrBadStream) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("error %v: neither malformed nor cut", err)
			}
			return
		}
		if out.Len()+errOut.Len()+len(p)+5 > len(data) {
			t.Fatalf("%d bytes of output and %d of exit payload from %d bytes of stream", out.Len()+errOut.Len(), len(p), len(data))
		}
		res, err := wire.ExitPayload(p)
		var e *errdefs.Error
		if err != nil && !errors.As(err, &e) {
			t.Fatalf("exit payload error %T %v: want an errdefs.Error", err, err)
		}
		_ = res
	})
}

// FuzzExecRoundTrip: what the server writes as frames, the client reads
// back byte for byte, however the writes are split.
func FuzzExecRoundTrip(f *testing.F) {
	f.Add([]byte("hello"), []byte("world"), 3)
	f.Add([]byte{}, bytes.Repeat([]byte{1}, 3*wire.MaxPayload+7), 0)
	f.Fuzz(func(t *testing.T, stdout, stderr []byte, code int) {
		var b bytes.Buffer
		fw := wire.NewWriter(&b, nil)
		so, se := fw.Stream(v1.FrameStdout), fw.Stream(v1.FrameStderr)
		for i, j := 0, 0; i < len(stdout) || j < len(stderr); {
			if i < len(stdout) {
				n := min(len(stdout)-i, 1+i%7919)
				so.Write(stdout[i : i+n])
				i += n
			}
			if j < len(stderr) {
				n := min(len(stderr)-j, 1+j%4099)
				se.Write(stderr[j : j+n])
				j += n
			}
		}
		if err := writeExit(fw, fabric.ExecResult{ExitCode: code}, nil); err != nil {
			t.Fatal(err)
		}
		var out, errOut bytes.Buffer
		p, err := wire.ReadFrames(&b, &out, &errOut)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out.Bytes(), stdout) || !bytes.Equal(errOut.Bytes(), stderr) {
			t.Fatalf("read back %d/%d bytes, wrote %d/%d", out.Len(), errOut.Len(), len(stdout), len(stderr))
		}
		res, err := wire.ExitPayload(p)
		if err != nil || res.ExitCode != code {
			t.Fatalf("exit %+v, %v; want code %d", res, err, code)
		}
	})
}

// FuzzExecRequestBody feeds the server's reader of an interactive exec
// body (the frames after the request frame) arbitrary bytes: a malformed
// body kills the command with invalid_argument, stdin in flight never
// exceeds the window, resizes reach the terminal only with a terminal and
// a real size, and nothing panics.
func FuzzExecRequestBody(f *testing.F) {
	f.Add(frames(v1.FrameStdin, "abc", v1.FrameResize, resizePayload(24, 80), v1.FrameStdin, ""), true, true)
	f.Add(frames(v1.FrameStdin, "abc"), false, false)
	f.Add(frames(v1.FrameResize, "\x00\x18"), true, true)
	f.Add(frames(v1.FrameResize, resizePayload(0, 80)), true, true)
	f.Add(frames(v1.FrameStdin, "", v1.FrameStdin, "late"), true, false)
	f.Add(frames(v1.FrameExit, "{}"), true, false)
	f.Add([]byte{v1.FrameStdin, 0, 1, 0, 0, 'x'}, true, false)
	f.Fuzz(func(t *testing.T, data []byte, stdin, tty bool) {
		ctx, cancel := context.WithCancelCause(context.Background())
		defer cancel(nil)
		x := &session{req: fabric.ExecRequest{Args: []string{"sh"}, Stdin: stdin, TTY: tty}, cancel: cancel, in: newStdinQueue()}
		var sizes int
		x.resize = func(rows, cols uint16) error {
			if !tty || rows == 0 || cols == 0 {
				t.Errorf("resize %dx%d reached the terminal (tty %v)", rows, cols, tty)
			}
			sizes++
			return nil
		}
		x.readBody(wire.NewReader(bytes.NewReader(data)))
		if x.in.bytes > v1.StdinWindow {
			t.Fatalf("%d bytes of stdin queued, window %d", x.in.bytes, v1.StdinWindow)
		}
		if !stdin && x.in.bytes > 0 {
			t.Fatalf("%d bytes of stdin queued without stdin in the request", x.in.bytes)
		}
		perr := x.protocolError()
		if perr != nil && !errors.Is(perr, errdefs.ErrInvalidArgument) {
			t.Fatalf("protocol error %v: want invalid_argument", perr)
		}
		if perr != nil && context.Cause(ctx) == nil {
			t.Fatal("a protocol error did not kill the command")
		}
	})
}
