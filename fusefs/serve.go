package fusefs

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/internal/atomicfile"
)

// Serve mounts f at dir, writes "ready\n" to ready (if not nil) once the
// kernel answers on the mount, and blocks until the mount goes away (an
// unmount by anyone) or ctx is done, in which case it unmounts first. It is
// the body of the `esfd fuse-server` child process.
func Serve(ctx context.Context, dir string, f *FS, ready io.Writer) error {
	srv, err := Mount(dir, f)
	if err != nil {
		return err
	}
	if ready != nil {
		if _, err := io.WriteString(ready, "ready\n"); err != nil {
			srv.Unmount()
			return fmt.Errorf("signal readiness: %w", err)
		}
	}
	done := make(chan struct{})
	go func() {
		srv.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	// Unmount; if attempts still stack overlays on the projection the kernel
	// says EBUSY, and we keep serving rather than pull the floor from under
	// them: a lazy detach here would fail every live attempt.
	for {
		err := srv.Unmount()
		if err == nil {
			<-done
			return nil
		}
		f.opts.Logger.Warn("projection busy; still serving", "mount", dir, "err", err)
		select {
		case <-done:
			return nil
		case <-time.After(time.Second):
		}
	}
}

// Process is a projection server running as a child (or adopted) process.
type Process struct {
	Pid   int
	Mount string
}

// StartOptions say how to run the server process.
type StartOptions struct {
	// Command runs the server: it must call Serve with fd 3 as the ready
	// writer (e.g. []string{"/proc/self/exe", "fuse-server", "--state", dir}).
	Command []string
	// Mount is the mountpoint the server mounts.
	Mount string
	// PidFile records the server's pid so a restarted daemon can adopt it.
	PidFile string
	// LogFile receives the server's stderr; empty discards it.
	LogFile string
	// ReadyTimeout bounds the wait for the mount; default 30s.
	ReadyTimeout time.Duration
}

// EnsureServer adopts a live projection server at opts.Mount or starts a
// new one. A server that died leaves its mount answering ENOTCONN; that
// stale mount is detached first. The new process runs in its own session so
// it outlives the daemon that started it: attempts keep their mounts across
// a daemon restart.
func EnsureServer(ctx context.Context, opts StartOptions) (*Process, error) {
	if p, ok := adopt(opts); ok {
		return p, nil
	}
	if err := os.MkdirAll(opts.Mount, 0o755); err != nil {
		return nil, err
	}
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = 30 * time.Second
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	cmd := exec.Command(opts.Command[0], opts.Command[1:]...)
	cmd.ExtraFiles = []*os.File{w}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Dir = "/"
	if opts.LogFile != "" {
		lf, err := os.OpenFile(opts.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			w.Close()
			return nil, err
		}
		defer lf.Close()
		cmd.Stdout, cmd.Stderr = lf, lf
	}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, fmt.Errorf("start projection server: %w", err)
	}
	w.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(r).ReadString('\n')
		line <- s
	}()
	timer := time.NewTimer(opts.ReadyTimeout)
	defer timer.Stop()
	select {
	case s := <-line:
		if s != "ready\n" {
			cmd.Process.Kill()
			return nil, fmt.Errorf("projection server exited before mounting (%v); see %s", <-exited, opts.LogFile)
		}
	case <-timer.C:
		cmd.Process.Kill()
		<-exited
		return nil, fmt.Errorf("projection server not ready after %s", opts.ReadyTimeout)
	case <-ctx.Done():
		cmd.Process.Kill()
		<-exited
		return nil, ctx.Err()
	}
	// The child is ours until this process exits; the Wait goroutine reaps
	// it if it ends first, and init adopts it otherwise.
	p := &Process{Pid: cmd.Process.Pid, Mount: opts.Mount}
	if opts.PidFile != "" {
		if err := atomicfile.WriteFile(opts.PidFile, []byte(strconv.Itoa(p.Pid)+"\n"), 0o600); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// adopt returns the running server if opts.Mount is a live esf projection.
func adopt(opts StartOptions) (*Process, bool) {
	fstype, ok := mountType(opts.Mount)
	if !ok {
		return nil, false
	}
	// statfs always reaches the server (stat may be answered from the
	// kernel's attribute cache even after the server died).
	var st unix.Statfs_t
	if fstype != "fuse.esf" || unix.Statfs(opts.Mount, &st) != nil {
		// Dead (ENOTCONN) or foreign: detach it so a new server can mount.
		unix.Unmount(opts.Mount, unix.MNT_DETACH)
		return nil, false
	}
	pid := 0
	if b, err := os.ReadFile(opts.PidFile); err == nil {
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	return &Process{Pid: pid, Mount: opts.Mount}, true
}

// Stop unmounts the projection, which ends its server. It fails with EBUSY
// while attempts still use it.
func (p *Process) Stop() error {
	if err := unix.Unmount(p.Mount, 0); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount projection %s: %w", p.Mount, err)
	}
	if p.Pid > 0 {
		// Wait for the process to go, so no server outlives Stop.
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) && syscall.Kill(p.Pid, 0) == nil && !isZombie(p.Pid) {
			time.Sleep(10 * time.Millisecond)
		}
	}
	return nil
}

func isZombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] == 'Z'
}

// MountType returns the file system type mounted exactly at dir
// ("fuse.esf" for the projection and its binds).
func MountType(dir string) (string, bool) { return mountType(dir) }

// Binds lists the mount points of binds of the projection mounted at mnt
// (same device), other than mnt itself.
func Binds(mnt string) []string {
	abs, _ := filepath.Abs(mnt)
	infos, err := mountinfo.GetMounts(nil)
	if err != nil {
		return nil
	}
	major, minor, found := 0, 0, false
	for _, in := range infos {
		if in.Mountpoint == abs {
			major, minor, found = in.Major, in.Minor, true
		}
	}
	if !found {
		return nil
	}
	var out []string
	for _, in := range infos {
		if in.Major == major && in.Minor == minor && in.Mountpoint != abs {
			out = append(out, in.Mountpoint)
		}
	}
	return out
}

// mountType returns the file system type mounted exactly at dir.
func mountType(dir string) (string, bool) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", false
	}
	infos, err := mountinfo.GetMounts(func(in *mountinfo.Info) (skip, stop bool) {
		return in.Mountpoint != abs, false
	})
	if err != nil || len(infos) == 0 {
		return "", false
	}
	return infos[len(infos)-1].FSType, true // the last mount at a path is the visible one
}

// Alive reports whether the server still answers on its mount.
func (p *Process) Alive() bool {
	var st unix.Statfs_t
	fstype, ok := mountType(p.Mount)
	return ok && fstype == "fuse.esf" && unix.Statfs(p.Mount, &st) == nil
}
