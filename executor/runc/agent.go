package runc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	gorunc "github.com/containerd/go-runc"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/executor"
	"github.com/esf-dev/esf/executor/initproto"
)

// agentSocket is the init's exec socket in a bundle (package initproto).
const agentSocket = "exec.sock"

// maxHandshake bounds what a failed trampoline may say.
const maxHandshake = 64 << 10

// listenAgent binds the bundle's exec socket and returns the listening
// socket for runc to hand to the init. The caller closes it once runc
// has: from then on only the init holds it.
func listenAgent(bundle string) (*os.File, error) {
	var f *os.File
	err := inDir(bundle, func(dir string) error {
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, agentSocket), Net: "unix"})
		if err != nil {
			return err
		}
		// The path stays for the init's whole life, and Stop removes it
		// with the bundle.
		l.SetUnlinkOnClose(false)
		f, err = l.File()
		l.Close()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("exec socket: %w", err)
	}
	return f, nil
}

func dialAgent(bundle string) (*net.UnixConn, error) {
	var c *net.UnixConn
	err := inDir(bundle, func(dir string) (err error) {
		c, err = net.DialUnix("unix", nil, &net.UnixAddr{Name: filepath.Join(dir, agentSocket), Net: "unix"})
		return err
	})
	return c, err
}

// inDir calls fn with a name for dir short enough for a unix socket
// address (108 bytes): dir itself, or its /proc/self/fd link.
func inDir(dir string, fn func(dir string) error) error {
	if len(dir)+len(agentSocket)+2 <= 100 {
		return fn(dir)
	}
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return fn("/proc/self/fd/" + strconv.Itoa(fd))
}

// viaAgent reports whether the init can start this exec: the process
// differs from the init only in command, environment and directory, so
// what it inherits from the init is what runc exec would give it. A
// terminal or another user needs runc exec.
func viaAgent(init specs.User, proc specs.Process) bool {
	return !proc.Terminal && proc.User.UID == init.UID && proc.User.GID == init.GID &&
		slicesEqual(proc.User.AdditionalGids, init.AdditionalGids)
}

func slicesEqual(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// startAgent starts the process through the container's init. started is
// false, with a nil error, when the container has no reachable agent (an
// init of an older executor, or a dead one) or when only runc can start
// this process (a workdir the user may not enter): the caller then uses
// runc exec, which also knows how to report a dead container, after
// making p's stdio anew if p.io is nil.
func (p *process) startAgent(ctx context.Context, cgroupsPath string, proc specs.Process) (started bool, err error) {
	if frozen(cgroupsPath) {
		// A frozen init would not answer until Thaw.
		return true, fmt.Errorf("container is frozen: %w", executor.ErrFailedPrecondition)
	}
	conn, err := dialAgent(p.e.bundle(p.id))
	if err != nil {
		return false, nil
	}
	defer func() {
		if err != nil {
			conn.Close()
		}
	}()
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return true, err
	}
	// Ours is nonblocking so that deadlines apply to it.
	unix.SetNonblock(pair[0], true)
	hs := os.NewFile(uintptr(pair[0]), "handshake")
	defer hs.Close()
	child := os.NewFile(uintptr(pair[1]), "handshake-child")

	// A cancelled exec must not wait for an init that is slow to answer.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	std := p.io.files()
	err = initproto.Write(conn, initproto.Request{Args: proc.Args, Env: proc.Env, Dir: proc.Cwd},
		int(std[0].Fd()), int(std[1].Fd()), int(std[2].Fd()), int(child.Fd()))
	// The init has its copies (or never will): ours would hold the
	// process's pipes open.
	p.io.closeChild()
	child.Close()
	if err != nil {
		return true, p.agentError(ctx, err)
	}
	var st initproto.Started
	fds, err := initproto.Read(conn, &st)
	if err != nil {
		return true, p.agentError(ctx, err)
	}
	for _, fd := range fds[min(1, len(fds)):] {
		unix.Close(fd)
	}
	if st.DirDenied {
		// runc exec can: it enters the directory before it drops
		// privileges. The pipes went to the init; the caller makes new
		// ones.
		p.io.Close()
		p.io, p.stdin = nil, nil
		return false, nil
	}
	if st.Err != "" || len(fds) != 1 {
		for _, fd := range fds[:min(1, len(fds))] {
			unix.Close(fd)
		}
		if st.Err == "" {
			st.Err = fmt.Sprintf("init sent %d fds, want a pidfd", len(fds))
		}
		return true, fmt.Errorf("%s: %w", st.Err, p.e.startFailure(ctx, p.id))
	}
	pid, err := pidfdPid(fds[0])
	unix.Close(fds[0])
	if err != nil {
		return true, err
	}
	p.pid = pid
	// The trampoline waits for the byte below before it runs the command:
	// moved now, nothing the command starts is outside the exec cgroup.
	if p.cg != nil {
		if err := p.cg.add(pid); err != nil {
			p.e.opts.Logger.Warn("runc executor: exec left in the container's cgroup", "id", p.id, "err", err)
		}
	}
	// The process may run now. From here on it is the watcher's to kill,
	// so ctx no longer cuts the handshake short.
	if !stop() {
		conn.SetDeadline(time.Time{})
	}
	hs.SetDeadline(time.Now().Add(p.e.opts.CommandTimeout))
	_, err = hs.Write([]byte{1})
	var msg []byte
	if err == nil {
		msg, err = io.ReadAll(io.LimitReader(hs, maxHandshake))
	}
	if err != nil {
		// Nobody would wait for a process that starts after all.
		p.e.killTree(p.id, p.pid)
		return true, fmt.Errorf("exec handshake: %w", err)
	}
	if len(msg) > 0 {
		// The trampoline failed and exits; the init reaps it.
		return true, fmt.Errorf("%s: %w", bytes.TrimSpace(msg), p.e.startFailure(ctx, p.id))
	}
	p.conn = conn
	return true, nil
}

// agentError classifies a broken conversation with the init: a cancelled
// exec, or a container that went away under it.
func (p *process) agentError(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	return fmt.Errorf("exec through init: %v: %w", err, p.e.startFailure(ctx, p.id))
}

// awaitAgentExit stands in for runc exec's exit: the init reports the
// status when it reaps the process, and the exec ends once its output
// has too (the last writer may be a background process). A connection
// that breaks without a status means the init died, and with it every
// process of the container: SIGKILL, as Stop documents.
func (p *process) awaitAgentExit() {
	defer close(p.runcDone)
	var ex initproto.Exited
	_, err := initproto.Read(p.conn, &ex)
	if err != nil {
		ex.Status = 128 + int(unix.SIGKILL)
	}
	p.pumps.Wait()
	if ex.Status != 0 {
		p.runcErr = &gorunc.ExitError{Status: ex.Status}
	}
}

// pidfdPid is the pid, in our namespace, of the process a pidfd names.
func pidfdPid(fd int) (int, error) {
	b, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(fd))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Pid:"); ok {
			pid, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil || pid <= 0 {
				return 0, errors.New("the process ended before it started")
			}
			return pid, nil
		}
	}
	return 0, errors.New("pidfd: no pid in fdinfo")
}

// frozen reports whether the cgroup's freezer holds it, under cgroup v1
// or v2; false when that cannot be read.
func frozen(cgroupsPath string) bool {
	if !strings.HasPrefix(cgroupsPath, "/") {
		return false
	}
	if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/freezer", cgroupsPath, "freezer.state")); err == nil {
		s := strings.TrimSpace(string(b))
		return s == "FROZEN" || s == "FREEZING"
	}
	if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", cgroupsPath, "cgroup.freeze")); err == nil {
		return strings.TrimSpace(string(b)) == "1"
	}
	return false
}
