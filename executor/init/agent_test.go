package main

import (
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/esf-dev/esf/executor/initproto"
)

// TestAgent runs the built init with a listening socket at fd 3, as the
// runc executor starts it, and speaks the protocol to it: the process
// runs only after the go byte, with the given stdio, directory and
// environment, as a session leader; the init reports its pid (with a
// pidfd) and its status; a bad request, a missing directory or command,
// and an executor that leaves before the go are answered, not fatal.
func TestAgent(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "exec.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	lf, err := ln.File()
	ln.Close()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(buildInit(t))
	cmd.ExtraFiles = []*os.File{lf}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lf.Close()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	})

	type outcome struct {
		startErr  string // Started.Err
		handshake string // what the trampoline said
		pid       int
		stdout    string
		status    int
	}
	// run sends req; goByte false leaves before the go.
	run := func(t *testing.T, req initproto.Request, nfds int, goByte bool) outcome {
		t.Helper()
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		outR, outW, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer outR.Close()
		null, _ := os.Open(os.DevNull)
		defer null.Close()
		pair, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		hs := os.NewFile(uintptr(pair[0]), "hs")
		defer hs.Close()
		fds := []int{int(null.Fd()), int(outW.Fd()), int(outW.Fd()), pair[1]}[:nfds]
		if err := initproto.Write(c, req, fds...); err != nil {
			t.Fatal(err)
		}
		outW.Close()
		syscall.Close(pair[1])
		var o outcome
		var st initproto.Started
		got, err := initproto.Read(c, &st)
		if err != nil {
			t.Fatal(err)
		}
		for _, fd := range got {
			defer syscall.Close(fd)
		}
		if st.Err != "" {
			o.startErr = st.Err
			return o
		}
		if len(got) != 1 || st.Pid <= 0 {
			t.Fatalf("started %+v with %d fds, want a pid and a pidfd", st, len(got))
		}
		o.pid = st.Pid
		if goByte {
			hs.Write([]byte{1})
			b, _ := io.ReadAll(hs)
			o.handshake = string(b)
		} else {
			hs.Close()
		}
		b, _ := io.ReadAll(outR)
		o.stdout = string(b)
		var ex initproto.Exited
		if _, err := initproto.Read(c, &ex); err != nil {
			t.Fatalf("exited: %v", err)
		}
		o.status = ex.Status
		return o
	}

	env := []string{"PATH=/usr/bin:/bin", "GREETING=hello"}
	t.Run("runs with stdio, dir, env, session", func(t *testing.T) {
		o := run(t, initproto.Request{Args: []string{"sh", "-c", `echo "$GREETING $(pwd) $HOME"; ps -o sid= -p $$; echo $$; exit 3`},
			Env: env, Dir: dir}, 4, true)
		lines := strings.Fields(o.stdout)
		if o.handshake != "" || o.status != 3 || len(lines) != 5 || lines[0] != "hello" || lines[1] != dir || lines[3] != lines[4] {
			t.Fatalf("got %+v; want status 3, output \"hello %s <home>\", sid == pid", o, dir)
		}
	})
	t.Run("signal status", func(t *testing.T) {
		if o := run(t, initproto.Request{Args: []string{"sh", "-c", "kill -TERM $$"}, Env: env, Dir: "/"}, 4, true); o.status != 128+15 {
			t.Fatalf("got %+v, want status 143", o)
		}
	})
	t.Run("no such command", func(t *testing.T) {
		o := run(t, initproto.Request{Args: []string{"no-such-command"}, Env: env, Dir: "/"}, 4, true)
		if !strings.Contains(o.handshake, "executable file not found") || o.status != 127 {
			t.Fatalf("got %+v, want the lookup error and 127", o)
		}
	})
	t.Run("no such directory", func(t *testing.T) {
		o := run(t, initproto.Request{Args: []string{"true"}, Env: env, Dir: "/no/where"}, 4, true)
		if !strings.Contains(o.startErr, "/no/where") {
			t.Fatalf("got %+v, want a start error naming the directory", o)
		}
	})
	t.Run("missing fds", func(t *testing.T) {
		o := run(t, initproto.Request{Args: []string{"true"}, Env: env}, 2, true)
		if !strings.Contains(o.startErr, "want 4 fds") {
			t.Fatalf("got %+v, want a refused request", o)
		}
	})
	t.Run("executor leaves before the go", func(t *testing.T) {
		mark := filepath.Join(dir, "ran")
		o := run(t, initproto.Request{Args: []string{"touch", mark}, Env: env}, 4, false)
		if o.status != 126 {
			t.Fatalf("got %+v, want 126", o)
		}
		if _, err := os.Stat(mark); err == nil {
			t.Fatal("the command ran without the go")
		}
	})
}
