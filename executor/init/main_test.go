package main

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/esf-dev/esf/executor/initproto"
)

// TestReap: children that exited are zombies until reap, and none after.
func TestReap(t *testing.T) {
	var pids []int
	for range 3 {
		// ForkExec rather than os/exec: nothing else may wait for them.
		pid, err := syscall.ForkExec("/bin/true", []string{"true"}, &syscall.ProcAttr{})
		if err != nil {
			t.Fatalf("fork /bin/true: %v", err)
		}
		pids = append(pids, pid)
	}
	state := func(pid int) byte {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		if err != nil {
			return 0 // gone
		}
		for i := len(b) - 1; i >= 0; i-- {
			if b[i] == ')' && i+2 < len(b) {
				return b[i+2]
			}
		}
		return '?'
	}
	deadline := time.Now().Add(time.Minute)
	for _, pid := range pids {
		for state(pid) != 'Z' {
			if time.Now().After(deadline) {
				t.Fatalf("child %d never became a zombie (state %c)", pid, state(pid))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	reapAll(nil)
	for _, pid := range pids {
		if s := state(pid); s != 0 {
			t.Errorf("child %d still in state %c after reap", pid, s)
		}
	}
	reapAll(nil) // nothing left: returns at once
}

// TestSIGTERM: the built binary stays up until SIGTERM, then exits 0.
func TestSIGTERM(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	// With the executor's socket, as runc starts it: its agent answering
	// says the init subscribed to SIGTERM (which it does first). A
	// SIGTERM before that would kill it, and a loaded machine can take
	// long to get there, so no fixed wait can stand for this.
	sock := filepath.Join(t.TempDir(), "exec.sock")
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
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		cmd.Process.Kill()
		<-done
		t.Fatal(err)
	}
	c.CloseWrite() // an empty request: the agent answers it with an error
	var st initproto.Started
	_, err = initproto.Read(c, &st)
	c.Close()
	if err != nil || st.Err == "" {
		cmd.Process.Kill()
		<-done
		t.Fatalf("the init's agent did not answer an empty request: %+v %v", st, err)
	}
	select {
	case err := <-done:
		t.Fatalf("init exited on its own: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("init exited with %v after SIGTERM", err)
		}
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		<-done
		t.Fatal("init ignored SIGTERM")
	}
}

// buildInit builds the binary into a temporary directory.
func buildInit(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "init")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v: %s", err, out)
	}
	return bin
}
