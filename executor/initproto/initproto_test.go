package initproto

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
)

func pair(t *testing.T) (a, b *net.UnixConn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "sock")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// TestFrames: frames keep their boundaries when they queue up, fds travel
// with the frame they were sent with, a frame larger than a socket buffer
// arrives whole, and bad frames are errors, never a panic or a leak.
func TestFrames(t *testing.T) {
	a, b := pair(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	big := Request{Args: []string{"sh", "-c", strings.Repeat("x", 3<<20)}, Dir: "/"}
	done := make(chan error, 1)
	go func() {
		err := Write(a, Started{Pid: 7}, int(w.Fd()))
		if err == nil {
			err = Write(a, Exited{Status: 0})
		}
		if err == nil {
			err = Write(a, big)
		}
		w.Close()
		done <- err
	}()
	var st Started
	fds, err := Read(b, &st)
	if err != nil || st.Pid != 7 || len(fds) != 1 {
		t.Fatalf("started: %+v %d fds %v", st, len(fds), err)
	}
	// The fd is the pipe's write end: what goes in comes out of r.
	f := os.NewFile(uintptr(fds[0]), "w")
	f.Write([]byte("via fd"))
	f.Close()
	var ex Exited
	ex.Status = -1
	if fds, err := Read(b, &ex); err != nil || ex.Status != 0 || len(fds) != 0 {
		t.Fatalf("exited: %+v %d fds %v", ex, len(fds), err)
	}
	var got Request
	if _, err := Read(b, &got); err != nil || len(got.Args) != 3 || got.Args[2] != big.Args[2] {
		t.Fatalf("large frame: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if out, _ := io.ReadAll(r); string(out) != "via fd" {
		t.Fatalf("passed fd: read %q", out)
	}

	for _, tc := range []struct {
		name  string
		bytes []byte
		want  string
	}{
		{"oversized", binary.BigEndian.AppendUint32(nil, MaxFrame+1), "over"},
		{"truncated body", append(binary.BigEndian.AppendUint32(nil, 10), `{"pid"`...), "unexpected EOF"},
		{"truncated header", []byte{0, 0}, "unexpected EOF"},
		{"not json", append(binary.BigEndian.AppendUint32(nil, 3), "abc"...), "frame"},
		{"empty", nil, "EOF"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := pair(t)
			a.Write(tc.bytes)
			a.CloseWrite()
			var st Started
			_, err := Read(b, &st)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("read: %v, want an error mentioning %q", err, tc.want)
			}
			if tc.name == "empty" && !errors.Is(err, io.EOF) {
				t.Fatalf("read of nothing: %v, want io.EOF", err)
			}
		})
	}
}
