package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/esf-dev/esf/executor/initproto"
)

// sysPidfdOpen is pidfd_open(2) (Linux 5.3), which syscall does not name.
const sysPidfdOpen = 434

// agent starts execs for the executor (see package initproto): it forks
// the trampoline with the caller's stdio and reports the process's pid and,
// once reaped, its status.
type agent struct {
	ln *net.UnixListener

	// mu makes fork-and-register atomic against the reaper, so a process
	// that ends at once is never reaped before its waiter is known.
	mu      sync.Mutex
	waiters map[int]chan int // pid -> its status, sent once
}

func newAgent(ln *net.UnixListener) *agent {
	return &agent{ln: ln, waiters: map[int]chan int{}}
}

// inheritedListener is the executor's listening socket at initproto.Fd,
// or nil when the init was started without one (older executors, tests).
func inheritedListener() *net.UnixListener {
	v, err := syscall.GetsockoptInt(initproto.Fd, syscall.SOL_SOCKET, syscall.SO_ACCEPTCONN)
	if err != nil || v != 1 {
		return nil
	}
	// FileListener keeps a close-on-exec duplicate; the inherited fd
	// itself must not reach the processes the agent forks.
	f := os.NewFile(initproto.Fd, "exec.sock")
	l, err := net.FileListener(f)
	f.Close()
	if err != nil {
		return nil
	}
	ul, ok := l.(*net.UnixListener)
	if !ok {
		l.Close()
		return nil
	}
	return ul
}

// serve accepts until the listener fails, which happens only when the
// init ends.
func (a *agent) serve() {
	for {
		c, err := a.ln.AcceptUnix()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.ECONNABORTED) {
				// Out of fds: wait for execs to end rather than spin.
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return
		}
		go a.handle(c)
	}
}

func (a *agent) handle(c *net.UnixConn) {
	defer c.Close()
	var req initproto.Request
	fds, err := initproto.Read(c, &req)
	closeFds := func() {
		for _, fd := range fds {
			syscall.Close(fd)
		}
		fds = nil
	}
	defer closeFds()
	if err == nil && (len(fds) != 4 || (len(req.Args) == 0) != req.Spare) {
		err = fmt.Errorf("request with %d fds and %d args: want 4 fds and a command (or a spare without one)", len(fds), len(req.Args))
	}
	if err != nil {
		initproto.Write(c, initproto.Started{Err: err.Error()})
		return
	}
	pid, pidfd, status, err := a.spawn(req, fds)
	// The child has its copies: ours would keep its pipes from ever
	// reaching end of file.
	closeFds()
	if err != nil {
		var de dirError
		denied := errors.As(err, &de) && errors.Is(de.err, syscall.EACCES)
		initproto.Write(c, initproto.Started{Err: err.Error(), DirDenied: denied})
		return
	}
	err = initproto.Write(c, initproto.Started{Pid: pid}, pidfd)
	syscall.Close(pidfd)
	code := <-status
	if err == nil {
		initproto.Write(c, initproto.Exited{Status: code})
	}
}

// spawn forks the trampoline, a session leader, with fds as its stdin,
// stdout, stderr and handshake, in req.Dir with req.Env.
func (a *agent) spawn(req initproto.Request, fds []int) (pid, pidfd int, status chan int, err error) {
	files := make([]uintptr, len(fds))
	for i, fd := range fds {
		files[i] = uintptr(fd)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	argv := append([]string{initproto.Trampoline}, req.Args...)
	if req.Spare {
		argv = []string{initproto.Spare}
	}
	pid, err = syscall.ForkExec("/proc/self/exe", argv, &syscall.ProcAttr{
		Dir:   req.Dir,
		Env:   req.Env,
		Files: files,
		Sys:   &syscall.SysProcAttr{Setsid: true},
	})
	if err != nil {
		if req.Dir != "" && (errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENOTDIR) || errors.Is(err, syscall.EACCES)) {
			return 0, -1, nil, dirError{req.Dir, err}
		}
		return 0, -1, nil, fmt.Errorf("fork: %w", err)
	}
	// The reaper cannot take pid before the lock is released, so the
	// pidfd names this process.
	r, _, errno := syscall.RawSyscall(sysPidfdOpen, uintptr(pid), 0, 0)
	if errno != 0 {
		// The trampoline waits for a go that will never come.
		syscall.Kill(pid, syscall.SIGKILL)
		a.waiters[pid] = make(chan int, 1) // reaped quietly
		return 0, -1, nil, fmt.Errorf("pidfd_open: %w", errno)
	}
	syscall.CloseOnExec(int(r))
	status = make(chan int, 1)
	a.waiters[pid] = status
	return pid, int(r), status, nil
}

// reap reaps every exited child and reports the agent's to their waiters;
// a nil agent (no executor socket) only reaps.
func (a *agent) reap() {
	if a == nil {
		reapAll(nil)
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	reapAll(func(pid int, ws syscall.WaitStatus) {
		if w, ok := a.waiters[pid]; ok {
			delete(a.waiters, pid)
			w <- exitCode(ws)
		}
	})
}

// exitCode is a shell's view of a status: the exit code, or 128+N for
// signal N.
func exitCode(ws syscall.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// dirError is a working directory the child could not enter.
type dirError struct {
	dir string
	err error
}

func (e dirError) Error() string { return fmt.Sprintf("workdir %s: %v", e.dir, e.err) }
func (e dirError) Unwrap() error { return e.err }
