package fusefs

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// The test binary doubles as the projection server process: with
// ESF_FUSEFS_TEST_SERVE set it serves an empty store at that path with fd 3
// as the ready pipe, as `esfd fuse-server` does.
func TestMain(m *testing.M) {
	if dir := os.Getenv("ESF_FUSEFS_TEST_SERVE"); dir != "" {
		f, err := New(Options{Store: newCountingStore()})
		if err == nil {
			err = Serve(context.Background(), dir, f, os.NewFile(3, "ready"))
		}
		if err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	code := m.Run()
	removeProbeBinary()
	os.Exit(code)
}

func TestServerLifecycle(t *testing.T) {
	requireFUSE(t)
	ctx := context.Background()
	dir := t.TempDir()
	mnt := filepath.Join(dir, "mnt")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("ESF_FUSEFS_TEST_SERVE", mnt)
	opts := StartOptions{
		Command: []string{exe, "-test.run=^$"},
		Mount:   mnt, PidFile: filepath.Join(dir, "pid"), LogFile: filepath.Join(dir, "log"),
	}
	p, err := EnsureServer(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop() })
	if fstype, ok := mountType(mnt); !ok || fstype != "fuse.esf" {
		t.Fatalf("mount type %q, %v", fstype, ok)
	}

	// A second daemon start adopts the same server instead of starting one.
	again, err := EnsureServer(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if again.Pid != p.Pid {
		t.Fatalf("adopted pid %d, want %d", again.Pid, p.Pid)
	}

	// A server killed hard leaves a dead mount (ENOTCONN); the next start
	// detaches it and serves again.
	if err := syscall.Kill(p.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, p.Pid)
	var st syscall.Statfs_t
	// The kernel answers ECONNABORTED while it tears the connection down
	// and ENOTCONN after.
	if err := syscall.Statfs(mnt, &st); err != syscall.ENOTCONN && err != syscall.ECONNABORTED {
		t.Fatalf("statfs of a dead projection: %v, want ENOTCONN or ECONNABORTED", err)
	}
	fresh, err := EnsureServer(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if fresh.Pid == p.Pid {
		t.Fatal("no new server after the old one died")
	}
	if _, err := os.Stat(filepath.Join(mnt, "roots")); err != nil {
		t.Fatalf("restarted server: %v", err)
	}

	// Stop unmounts and the process ends.
	if err := fresh.Stop(); err != nil {
		t.Fatal(err)
	}
	waitGone(t, fresh.Pid)
	if _, ok := mountType(mnt); ok {
		t.Fatal("mount left behind after Stop")
	}
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if syscall.Kill(pid, 0) != nil || isZombie(pid) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("process %d still alive", pid)
}
