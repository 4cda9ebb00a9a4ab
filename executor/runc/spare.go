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
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/executor"
	"github.com/esf-dev/esf/executor/initproto"
)

// A spare is a trampoline the init of an idle pool container forked ahead
// of the first exec (initproto.Spare), already moved into an exec cgroup
// of its own. Moving a process between cgroups waits for an RCU grace
// period (10-25 ms on this project's 2-vCPU VMs, cgroup v1 or v2 without
// favordynmods), and the fork costs the init a few more: both are paid
// while the container is idle, and the first exec of the container that
// adopts it only hands the spare its command and stdio. The spare serves
// that first exec or none: any other first exec (a terminal, another
// user) discards it (killed), so no spare outlives the container's first
// exec. Only execs that run beside that first one can see it, for as long
// as its handover lasts or a cold start's spare is under way: the same
// user, they could stop or trace it as they could the command it becomes;
// a spare that does not answer holds its exec only until the exec's ctx
// ends (TestSpareHandoverHonorsContext).
type spare struct {
	conn  *net.UnixConn // the init's connection: Started came, Exited will
	hs    *net.UnixConn // our end of the spare's handshake
	pid   int           // on the host
	pidfd int           // the spare's, for discard's kill
	cg    *execCgroup
}

// close lets go of the spare: it reads end of file and exits, the init
// reaps it. Its exec cgroup stays, for an exec that takes the usual way
// in it (whose release removes it) or until the container goes.
func (s *spare) close() {
	if s == nil {
		return
	}
	s.hs.Close()
	s.conn.Close()
	unix.Close(s.pidfd)
}

// discard kills the spare and removes its exec cgroup once the init has
// reaped it (it reports the exit on conn; a frozen container's spare
// dies on Thaw, and a Stop ends conn): an unused spare's cgroup would
// otherwise stay for the container's life, and one that does not read
// its end of file (a process of the sandbox stopped it) would stay with
// it.
func (s *spare) discard() {
	if s == nil {
		return
	}
	s.hs.Close()
	unix.PidfdSendSignal(s.pidfd, unix.SIGKILL, nil, 0)
	unix.Close(s.pidfd)
	go func() {
		defer s.conn.Close()
		var ex initproto.Exited
		initproto.Read(s.conn, &ex)
		s.cg.remove()
	}()
}

// makeSpare asks the init of the container in bundle (cgroup cgroupsPath)
// for a spare and moves it into an exec cgroup.
func (e *Executor) makeSpare(bundle, cgroupsPath string) (_ *spare, err error) {
	cg, err := newExecCgroup(cgroupsPath)
	if err != nil {
		return nil, err
	}
	if cg == nil {
		return nil, errors.New("no exec cgroup")
	}
	defer func() {
		if err != nil {
			cg.remove()
		}
	}()
	conn, err := dialAgent(bundle)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			conn.Close()
		}
	}()
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	child := os.NewFile(uintptr(pair[1]), "spare-handshake-child")
	defer child.Close()
	ours := os.NewFile(uintptr(pair[0]), "spare-handshake")
	c, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		return nil, err
	}
	hs := c.(*net.UnixConn)
	defer func() {
		if err != nil {
			hs.Close()
		}
	}()
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer null.Close()
	conn.SetDeadline(time.Now().Add(e.opts.CommandTimeout))
	n := int(null.Fd())
	if err := initproto.Write(conn, initproto.Request{Spare: true}, n, n, n, int(child.Fd())); err != nil {
		return nil, err
	}
	child.Close()
	var st initproto.Started
	fds, err := initproto.Read(conn, &st)
	if err != nil {
		return nil, err
	}
	for _, fd := range fds[min(1, len(fds)):] {
		unix.Close(fd)
	}
	if st.Err != "" || len(fds) != 1 {
		for _, fd := range fds[:min(1, len(fds))] {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("spare: %s (%d fds)", st.Err, len(fds))
	}
	pidfd := fds[0]
	pid, err := pidfdPid(pidfd)
	if err != nil {
		unix.Close(pidfd)
		return nil, err
	}
	conn.SetDeadline(time.Time{})
	if err := cg.add(pid); err != nil {
		unix.Close(pidfd)
		return nil, err
	}
	return &spare{conn: conn, hs: hs, pid: pid, pidfd: pidfd, cg: cg}, nil
}

// makeIdleSpare gives idle container c a spare; without one (logged) its
// first exec takes the usual way.
func (e *Executor) makeIdleSpare(c *idleContainer) {
	var s specs.Spec
	err := readJSON(filepath.Join(e.bundle(c.id), "config.json"), &s)
	if err == nil && s.Linux == nil {
		err = errors.New("config without linux")
	}
	if err == nil {
		c.spare, err = e.makeSpare(e.bundle(c.id), s.Linux.CgroupsPath)
	}
	if err != nil {
		e.opts.Logger.Warn("runc executor: pool container without a spare", "id", c.id, "err", err)
	}
}

// pendingSpare is a container's spare for its first exec: made while the
// container was idle in the pool, or under way since a cold start.
type pendingSpare struct {
	done chan struct{}
	// s is set before done closes (nil: none could be made); discarded
	// asks the maker to close it. Both under the pool's mu.
	s         *spare
	discarded bool
}

func (e *Executor) removeSpare(id string) *pendingSpare {
	p := &e.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	ps := p.spares[id]
	delete(p.spares, id)
	return ps
}

// takeSpare hands container id's spare (cgroup cgroupsPath) to an exec,
// once. One still being made is waited for (a concurrent move into a
// cgroup would share its grace period anyway), unless the container is
// frozen (its init would answer only after Thaw) or ctx ends: it is then
// discarded.
func (e *Executor) takeSpare(ctx context.Context, id, cgroupsPath string) *spare {
	ps := e.removeSpare(id)
	if ps == nil {
		return nil
	}
	if !frozen(cgroupsPath) {
		select {
		case <-ps.done:
			return ps.s
		case <-ctx.Done():
		}
	}
	e.discardPending(ps)
	return nil
}

// discardSpare discards container id's spare, made or under way, without
// waiting for it (Stop: the init's end ends its making).
func (e *Executor) discardSpare(id string) {
	if ps := e.removeSpare(id); ps != nil {
		e.discardPending(ps)
	}
}

func (e *Executor) discardPending(ps *pendingSpare) {
	p := &e.pool
	p.mu.Lock()
	select {
	case <-ps.done:
		p.mu.Unlock()
		ps.s.discard()
		return
	default:
	}
	ps.discarded = true
	p.mu.Unlock()
}

func (e *Executor) putSpare(id string, ps *pendingSpare) {
	p := &e.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.spares == nil {
		p.spares = map[string]*pendingSpare{}
	}
	p.spares[id] = ps
}

// keepSpare files adopted container id's spare for its first exec.
func (e *Executor) keepSpare(id string, s *spare) {
	if s == nil {
		return
	}
	ps := &pendingSpare{done: make(chan struct{}), s: s}
	close(ps.done)
	e.putSpare(id, ps)
}

// spareAfterStart makes a spare for the first exec of container id,
// started cold, in the background: the move into its cgroup overlaps
// whatever the caller does between the start and that exec.
func (e *Executor) spareAfterStart(id, cgroupsPath string) {
	ps := &pendingSpare{done: make(chan struct{})}
	e.putSpare(id, ps)
	go func() {
		s, err := e.makeSpare(e.bundle(id), cgroupsPath)
		p := &e.pool
		p.mu.Lock()
		ps.s = s
		discarded := ps.discarded
		close(ps.done)
		p.mu.Unlock()
		if discarded {
			s.discard()
		} else if err != nil {
			e.opts.Logger.Warn("runc executor: container without a spare", "id", id, "err", err)
		}
	}()
}

// startSpare starts the exec through spare sp: it sends the command with
// the process's stdio and waits for the exec (end of file on the
// handshake). started is false with a nil error when the spare could not
// take it (gone with its init, or a directory only runc exec may enter):
// p's stdio is then closed and the caller goes the usual way. An exec
// whose ctx ends before the command runs fails with ctx's error and
// kills the spare.
func (p *process) startSpare(ctx context.Context, cgroupsPath string, sp *spare, proc specs.Process) (started bool, err error) {
	defer func() {
		switch {
		case err != nil:
			sp.discard()
		case !started:
			// The exec takes the usual way in sp's exec cgroup.
			sp.close()
		}
	}()
	if frozen(cgroupsPath) {
		// A frozen spare would not answer until Thaw.
		return true, fmt.Errorf("container is frozen: %w", executor.ErrFailedPrecondition)
	}
	// A cancelled exec neither starts its command nor waits for a spare
	// that does not answer (one a process of the sandbox stopped, or a
	// freeze caught after the check above): ctx cuts the handover short
	// and the spare is discarded (killed), with anything it may have
	// started.
	if err := ctx.Err(); err != nil {
		return true, err
	}
	sp.hs.SetDeadline(time.Now().Add(p.e.opts.CommandTimeout))
	stop := context.AfterFunc(ctx, func() { sp.hs.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	std := p.io.files()
	err = initproto.Write(sp.hs, initproto.Request{Args: proc.Args, Env: proc.Env, Dir: proc.Cwd},
		int(std[0].Fd()), int(std[1].Fd()), int(std[2].Fd()))
	// The spare has its copies (or never will): ours would hold the
	// process's pipes open.
	p.io.closeChild()
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return true, cerr // the spare never had the request
		}
		p.io.Close()
		p.io, p.stdin = nil, nil
		return false, nil
	}
	// The process may run now (it is in its exec cgroup already): from
	// here on it is the watcher's to kill.
	p.pid = sp.pid
	msg, err := io.ReadAll(io.LimitReader(sp.hs, maxHandshake))
	if err != nil {
		p.e.killTree(p.id, p.pid)
		if cerr := ctx.Err(); cerr != nil {
			return true, cerr
		}
		return true, fmt.Errorf("exec handshake: %w", err)
	}
	if bytes.HasPrefix(msg, []byte(initproto.SpareDirDenied)) {
		// As the init's DirDenied: runc exec enters the directory before
		// it drops privileges.
		p.io.Close()
		p.io, p.stdin = nil, nil
		return false, nil
	}
	if len(msg) > 0 {
		return true, fmt.Errorf("%s: %w", bytes.TrimSpace(msg), p.e.startFailure(ctx, p.id))
	}
	sp.hs.Close()
	unix.Close(sp.pidfd)
	p.conn = sp.conn
	return true, nil
}
