package runc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/console"
	gorunc "github.com/containerd/go-runc"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/executor"
)

// killGrace is how long Wait waits for runc exec to exit after the
// process tree was killed. runc copies the process's output and exits only
// when its pipes close; a daemon that left the session still holds them,
// and then runc itself is killed.
const killGrace = 2 * time.Second

// Exec implements executor.Executor.
//
// runc exec runs in the foreground (not --detach): it stays the parent of
// the process, reaps it and exits with its status (128+N for a signal), so
// the daemon needs no subreaper. In that mode runc copies the process's
// stdio through pipes of its own and exits once those close, which is why
// Wait also waits for background processes that keep stdout or stderr
// open (as docker exec and ssh do). With a TTY, runc allocates the
// container's pty and proxies it to its stdio, which is the slave of a
// host pty whose master Exec reads and writes; Resize sizes the host pty
// and tells runc (SIGWINCH) to copy the size inward.
func (e *Executor) Exec(ctx context.Context, id string, x executor.ExecSpec) (_ executor.Process, err error) {
	if err := checkID(id); err != nil {
		return nil, fmt.Errorf("exec: %w", err)
	}
	if err := x.Validate(); err != nil {
		return nil, fmt.Errorf("exec %s: %w", id, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("exec %s: %w", id, err)
	}
	bundle := e.bundle(id)
	var cs specs.Spec
	if err := readJSON(filepath.Join(bundle, "config.json"), &cs); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("exec: container %s: %w", id, executor.ErrNotFound)
		}
		return nil, fmt.Errorf("exec %s: %w", id, err)
	}
	var initUser specs.User
	if cs.Process != nil {
		initUser = cs.Process.User
	}
	var cgroupsPath string
	if cs.Linux != nil {
		cgroupsPath = cs.Linux.CgroupsPath
	}
	proc, err := e.processSpec(ctx, id, &cs, x)
	if err != nil {
		return nil, fmt.Errorf("exec %s: %w", id, err)
	}
	p := &process{
		e:         e,
		id:        id,
		cgroup:    cgroupsPath,
		oomBefore: oomKills(cgroupsPath),
		drain:     e.opts.DrainTimeout,
		runcPidfd: -1,
		runcDone:  make(chan struct{}),
		watchDone: make(chan struct{}),
	}
	defer func() {
		if err != nil {
			p.release()
		}
	}()
	// The first exec after an adoption finds a spare (spare.go), already
	// in its exec cgroup; an exec it cannot serve discards it.
	agent := !e.noAgent && viaAgent(initUser, proc)
	sp := e.takeSpare(ctx, id, cgroupsPath)
	if sp != nil && !agent {
		sp.discard()
		sp = nil
	}
	if sp != nil {
		p.cg = sp.cg
	} else if p.cg, err = newExecCgroup(cgroupsPath); err != nil {
		// Without an exec cgroup, a kill still reaches the session and
		// the descendants (killTree).
		e.opts.Logger.Warn("runc executor: exec without a cgroup of its own", "id", id, "err", err)
		p.cg, err = nil, nil
	}
	if err := p.setupIO(x, proc.User); err != nil {
		if sp != nil {
			// Removed once the spare has gone (discard), not by release.
			p.cg = nil
			sp.discard()
		}
		return nil, fmt.Errorf("exec %s: %w", id, err)
	}
	if sp != nil {
		started, err := p.startSpare(ctx, cgroupsPath, sp, proc)
		if err != nil {
			return nil, fmt.Errorf("exec %s: %w", id, err)
		}
		if started {
			p.startPumps(x)
			go p.awaitAgentExit()
			go p.watch(ctx)
			return p, nil
		}
		// The usual way, in the spare's exec cgroup (it leaves it).
		if err := p.setupIO(x, proc.User); err != nil {
			return nil, fmt.Errorf("exec %s: %w", id, err)
		}
	}
	if agent {
		started, err := p.startAgent(ctx, cgroupsPath, proc)
		if err != nil {
			return nil, fmt.Errorf("exec %s: %w", id, err)
		}
		if started {
			p.startPumps(x)
			go p.awaitAgentExit()
			go p.watch(ctx)
			return p, nil
		}
		if p.io == nil {
			if err := p.setupIO(x, proc.User); err != nil {
				return nil, fmt.Errorf("exec %s: %w", id, err)
			}
		}
	}

	// runc's log and pid file; an exec of the init needs neither.
	if p.dir, err = os.MkdirTemp(bundle, "exec-"); err != nil {
		return nil, fmt.Errorf("exec %s: %w", id, err)
	}
	logPath := filepath.Join(p.dir, "runc.log")
	pidPath := filepath.Join(p.dir, "pid")
	rc := e.rc
	rc.LogFormat = gorunc.JSON
	started := make(chan int, 1)
	opts := &gorunc.ExecOpts{IO: p.io, PidFile: pidPath, LogFile: logPath, Started: started}
	if p.cg != nil {
		opts.ExtraArgs = []string{"--cgroup", p.cg.runcArg()}
	}
	// runc runs detached from ctx: go-runc would SIGKILL it on
	// cancellation, orphaning the process inside. The watcher kills the
	// process tree instead, and runc then exits on its own.
	rctx := context.WithoutCancel(ctx)
	go func() {
		defer close(p.runcDone)
		p.runcErr = rc.Exec(rctx, e.runcID(id), proc, opts)
	}()
	if runcPid, ok := <-started; ok {
		p.openRuncPidfd(runcPid)
	}
	if err := p.awaitPid(pidPath); err != nil {
		<-p.runcDone
		return nil, fmt.Errorf("exec %s: %s: %w", id, runcMessage(logPath, err), e.startFailure(ctx, id))
	}
	p.startPumps(x)
	go p.watch(ctx)
	return p, nil
}

// startFailure classifies a process that never started: the container's
// state decides between "not there", "not runnable now" and "your
// command".
func (e *Executor) startFailure(ctx context.Context, id string) error {
	info, err := e.state(ctx, id)
	switch {
	case errors.Is(err, executor.ErrNotFound):
		return executor.ErrNotFound
	case err != nil:
		return err
	case info.Status != executor.StatusRunning:
		return executor.ErrFailedPrecondition
	default:
		return executor.ErrInvalidArgument
	}
}

type process struct {
	e     *Executor
	id    string
	dir   string
	drain time.Duration

	io  *stdio          // runc's stdio: pipes, or the host pty's slave
	con console.Console // host pty master as opened, for Resize
	pty *os.File        // nonblocking dup of the master, for reads and writes

	stdin io.WriteCloser
	outs  []*os.File // what the pumps read
	pumps sync.WaitGroup
	pid   int

	// conn is the init's connection of an exec it started (agent.go),
	// nil for runc exec.
	conn *net.UnixConn
	// cg is the exec's own cgroup; nil when none could be made.
	cg *execCgroup

	// runcPidfd names the runc exec process, for SIGWINCH and, as a last
	// resort, SIGKILL; -1 if it could not be opened.
	runcPidfd int
	mu        sync.Mutex // guards con, runcPidfd and closed against release
	closed    bool

	runcDone chan struct{}
	runcErr  error // set before runcDone closes

	watchDone chan struct{}
	killedBy  error // ctx.Err() when the watcher killed; read after watchDone

	// cgroup is the container's cgroup path; oomBefore its OOM kill
	// count when the exec started (-1: unknown).
	cgroup    string
	oomBefore int64
	oomKilled bool

	once sync.Once
	code int
	err  error
}

// OOMKilled implements executor.OOMReporter: the exec ended by SIGKILL
// while the kernel's OOM killer killed in the container. (With concurrent
// execs, one SIGKILLed by someone else while another was OOM-killed reads
// as OOM-killed too; the count says only that the container hit its
// limit.)
func (p *process) OOMKilled() bool {
	p.Wait()
	return p.oomKilled
}

var (
	_ executor.Process     = (*process)(nil)
	_ executor.OOMReporter = (*process)(nil)
)

func (p *process) Pid() int              { return p.pid }
func (p *process) Stdin() io.WriteCloser { return p.stdin }

// setupIO makes runc's stdio before it starts.
func (p *process) setupIO(x executor.ExecSpec, user specs.User) error {
	if x.TTY {
		return p.setupPTY(x)
	}
	// The pipes belong to the process's user as the host knows it.
	uid, err := p.e.opts.UserNS.host(user.UID)
	if err != nil {
		return err
	}
	gid, err := p.e.opts.UserNS.host(user.GID)
	if err != nil {
		return err
	}
	user.UID, user.GID = uid, gid
	s, err := newPipes(x.Stdin, x.Stdout != nil, x.Stderr != nil, user)
	if err != nil {
		return err
	}
	p.io = s
	if s.inW != nil {
		p.stdin = s.inW
	}
	return nil
}

// setupPTY opens a host pty: runc gets the slave as its stdio, Exec keeps
// the master. The master is opened blocking so that console's calls on it
// (which take its fd) behave, and read through a nonblocking duplicate: a
// blocking read would tie a thread and ignore deadlines and Close.
func (p *process) setupPTY(x executor.ExecSpec) error {
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open pty: %w", err)
	}
	con, slavePath, err := console.NewPtyFromFile(os.NewFile(uintptr(fd), "/dev/ptmx"))
	if err != nil {
		unix.Close(fd)
		return fmt.Errorf("open pty: %w", err)
	}
	p.con = con
	// runc makes its terminal raw too, but only once the process runs:
	// output written before that would pass the line discipline twice
	// (\r\r\n). Termios is the pair's, so the master can set it.
	if err := con.SetRaw(); err != nil {
		return fmt.Errorf("pty raw mode: %w", err)
	}
	if x.Size.Rows > 0 && x.Size.Cols > 0 {
		if err := con.Resize(console.WinSize{Height: x.Size.Rows, Width: x.Size.Cols}); err != nil {
			return fmt.Errorf("pty size: %w", err)
		}
	}
	dup, err := unix.FcntlInt(con.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("dup pty master: %w", err)
	}
	if err := unix.SetNonblock(dup, true); err != nil {
		unix.Close(dup)
		return fmt.Errorf("pty master: %w", err)
	}
	p.pty = os.NewFile(uintptr(dup), "pty-master")
	sfd, err := unix.Open(slavePath, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open pty slave: %w", err)
	}
	slave := os.NewFile(uintptr(sfd), slavePath)
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		slave.Close()
		return err
	}
	p.io = &stdio{child: [3]*os.File{slave, slave, slave}, null: null}
	p.stdin = ttyInput{p.pty}
	return nil
}

func (p *process) openRuncPidfd(pid int) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return
	}
	p.mu.Lock()
	p.runcPidfd = fd
	p.mu.Unlock()
}

// signalRunc signals runc exec while it runs.
func (p *process) signalRunc(sig unix.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.runcPidfd < 0 || p.closed {
		return errors.New("no runc process")
	}
	return unix.PidfdSendSignal(p.runcPidfd, sig, nil, 0)
}

// awaitPid returns once runc has written the pid file (the process runs)
// or an error if runc exited without writing it (the process never
// started). Polling costs a stat per period; the start takes tens of
// milliseconds either way.
func (p *process) awaitPid(pidPath string) error {
	for wait := 100 * time.Microsecond; ; wait = min(2*wait, 5*time.Millisecond) {
		if pid, err := readPid(pidPath); err == nil {
			p.pid = pid
			return nil
		}
		select {
		case <-p.runcDone:
			// runc writes the file before the process can exit; a last
			// look settles the race with a process that ended at once.
			if pid, err := readPid(pidPath); err == nil {
				p.pid = pid
				return nil
			}
			if p.runcErr != nil {
				return p.runcErr
			}
			return errors.New("runc exec exited without starting the process")
		case <-time.After(wait):
		}
	}
}

func readPid(name string) (int, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("pid file %q", b)
	}
	return pid, nil
}

// ttyInput writes to the terminal; Close leaves it open (the pump still
// reads from it, and a terminal's EOF is a character, not a close).
type ttyInput struct{ f *os.File }

func (t ttyInput) Write(b []byte) (int, error) { return t.f.Write(b) }
func (t ttyInput) Close() error                { return nil }

func (p *process) startPumps(x executor.ExecSpec) {
	pump := func(dst io.Writer, src *os.File) {
		if dst == nil {
			dst = io.Discard
		}
		p.outs = append(p.outs, src)
		p.pumps.Add(1)
		go func() {
			defer p.pumps.Done()
			copyOut(dst, src)
		}()
	}
	if p.pty != nil {
		pump(x.Stdout, p.pty)
		return
	}
	if p.io.outR != nil {
		pump(x.Stdout, p.io.outR)
	}
	if p.io.errR != nil {
		pump(x.Stderr, p.io.errR)
	}
}

// copyOut forwards what the process writes as it arrives. It ends at
// end-of-file, at the drain deadline, or when the pty's last slave closes
// (EIO). A failing writer is dropped but the pipe is still drained, so the
// process never blocks on output nobody reads.
func copyOut(dst io.Writer, src *os.File) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				dst = io.Discard
			}
		}
		if err != nil {
			return
		}
	}
}

// watch kills the process tree when ctx ends before runc exec does.
func (p *process) watch(ctx context.Context) {
	defer close(p.watchDone)
	select {
	case <-p.runcDone:
		return
	case <-ctx.Done():
	}
	// ctx ended first: whatever the exit status says, the command was
	// stopped. When the kill reaches a child before the main process, a
	// shell can exit on its own with a normal status; that is still a kill.
	p.killedBy = ctx.Err()
	if p.cg != nil {
		// Everything the exec started, wherever it went.
		if err := p.cg.kill(p.e.opts.CommandTimeout); err != nil {
			p.e.opts.Logger.Warn("runc executor: kill exec cgroup", "id", p.id, "err", err)
		}
	}
	p.e.killTree(p.id, p.pid)
	select {
	case <-p.runcDone:
	case <-time.After(killGrace):
		// A daemon that escaped the tree holds the pipes open: runc's,
		// which it copies from, or ours, which an exec of the init's
		// writes to directly.
		p.signalRunc(unix.SIGKILL)
		for _, f := range p.outs {
			f.SetReadDeadline(time.Now())
		}
		// An init that does not report (stopped, or too slow to reap)
		// must not hold the exec past its deadline either: its silence
		// reads as the SIGKILL that was sent.
		p.mu.Lock()
		if p.conn != nil && !p.closed {
			p.conn.SetReadDeadline(time.Now())
		}
		p.mu.Unlock()
	}
}

// Resize implements executor.Process.
func (p *process) Resize(ws executor.WinSize) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.con == nil {
		return fmt.Errorf("resize: exec has no terminal: %w", executor.ErrFailedPrecondition)
	}
	if p.closed {
		return fmt.Errorf("resize: process ended: %w", executor.ErrFailedPrecondition)
	}
	if err := p.con.Resize(console.WinSize{Height: ws.Rows, Width: ws.Cols}); err != nil {
		return fmt.Errorf("resize: %w", err)
	}
	if p.runcPidfd >= 0 {
		// runc copies its stdio's size to the container's pty on SIGWINCH.
		if err := unix.PidfdSendSignal(p.runcPidfd, unix.SIGWINCH, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("resize: %w", err)
		}
	}
	return nil
}

// Wait implements executor.Process.
func (p *process) Wait() (int, error) {
	p.once.Do(func() {
		<-p.runcDone
		<-p.watchDone
		// runc is gone and so is every writer of our ends; the deadline
		// only guards against a reader that never sees end-of-file.
		deadline := time.Now().Add(p.drain)
		for _, f := range p.outs {
			f.SetReadDeadline(deadline)
		}
		p.pumps.Wait()
		p.code, p.err = p.result()
		if p.code == 128+int(unix.SIGKILL) && p.oomBefore >= 0 {
			p.oomKilled = oomKills(p.cgroup) > p.oomBefore
		}
		p.release()
	})
	return p.code, p.err
}

func (p *process) result() (int, error) {
	code := 0
	var ee *gorunc.ExitError
	switch {
	case p.runcErr == nil:
	case errors.As(p.runcErr, &ee):
		code = ee.Status
	default:
		return -1, fmt.Errorf("exec %s: runc: %w", p.id, p.runcErr)
	}
	if p.killedBy != nil {
		if code <= 0 {
			// runc itself was killed and could not report.
			code = 128 + int(unix.SIGKILL)
		}
		return code, fmt.Errorf("exec %s: process killed: %w", p.id, p.killedBy)
	}
	return code, nil
}

// release closes everything Exec opened; runc and the pumps are done.
func (p *process) release() {
	p.e.poolWarmed(p.id)
	if p.io != nil {
		p.io.Close()
	}
	p.mu.Lock()
	p.closed = true
	if p.pty != nil {
		p.pty.Close()
	}
	if p.con != nil {
		p.con.Close()
	}
	if p.runcPidfd >= 0 {
		unix.Close(p.runcPidfd)
		p.runcPidfd = -1
	}
	if p.conn != nil {
		p.conn.Close()
	}
	p.mu.Unlock()
	if p.dir != "" {
		os.RemoveAll(p.dir)
	}
	if p.cg != nil {
		p.cg.remove()
	}
}

// stdio is go-runc's IO for one runc exec: the three files runc gets (nil
// is /dev/null) and the ends Exec keeps. Unlike go-runc's pipe IO it
// closes every child end after start, stdin's included: a read end kept
// here would let a stdin writer fill the pipe and block after the process
// exited.
type stdio struct {
	child           [3]*os.File
	null            *os.File
	inW, outR, errR *os.File
}

var _ gorunc.IO = (*stdio)(nil)
var _ gorunc.StartCloser = (*stdio)(nil)

func newPipes(stdin, stdout, stderr bool, user specs.User) (_ *stdio, err error) {
	s := &stdio{}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	// The process may reopen its stdio through /proc/self/fd (echo >
	// /dev/stdout), and pipes are owned by their creator, mode 0600.
	chown := func(f *os.File) error { return unix.Fchown(int(f.Fd()), int(user.UID), int(user.GID)) }
	if stdin {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		s.child[0], s.inW = r, w
		if err := chown(r); err != nil {
			return nil, err
		}
	}
	if stdout {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		s.outR, s.child[1] = r, w
		if err := chown(w); err != nil {
			return nil, err
		}
	}
	if stderr {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		s.errR, s.child[2] = r, w
		if err := chown(w); err != nil {
			return nil, err
		}
	}
	// go-runc captures a command's output itself when it has neither
	// stdout nor stderr; /dev/null keeps it from doing so.
	if s.null, err = os.OpenFile(os.DevNull, os.O_RDWR, 0); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *stdio) Stdin() io.WriteCloser {
	if s.inW == nil {
		return nil
	}
	return s.inW
}

func (s *stdio) Stdout() io.ReadCloser {
	if s.outR == nil {
		return nil
	}
	return s.outR
}

func (s *stdio) Stderr() io.ReadCloser {
	if s.errR == nil {
		return nil
	}
	return s.errR
}

func (s *stdio) Set(cmd *exec.Cmd) {
	f := s.files()
	cmd.Stdin, cmd.Stdout, cmd.Stderr = f[0], f[1], f[2]
}

// files are the process's stdin, stdout and stderr: the child ends, or
// /dev/null.
func (s *stdio) files() [3]*os.File {
	var f [3]*os.File
	for i, c := range s.child {
		f[i] = c
		if c == nil {
			f[i] = s.null
		}
	}
	return f
}

// CloseAfterStart closes runc's ends: runc has its copies.
func (s *stdio) CloseAfterStart() error {
	s.closeChild()
	return nil
}

func (s *stdio) closeChild() {
	seen := map[*os.File]bool{} // a pty slave is all three
	for _, f := range s.child {
		if f != nil && !seen[f] {
			seen[f] = true
			f.Close()
		}
	}
	s.child = [3]*os.File{}
	if s.null != nil {
		s.null.Close()
		s.null = nil
	}
}

func (s *stdio) Close() error {
	s.closeChild()
	for _, f := range []**os.File{&s.inW, &s.outR, &s.errR} {
		if *f != nil {
			(*f).Close()
			*f = nil
		}
	}
	return nil
}
