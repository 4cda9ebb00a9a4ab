// Package fake is an executor.Executor without containers: every exec is a
// host process whose working directory is in the container's rootfs. It
// passes the conformance suite (executor/executortest), so fabric's logic
// tests run on it without root, runc or an image.
//
// What it does not do: isolate (an exec sees the host's file system, its
// absolute paths are the host's, PATH is the host's), switch users, limit
// resources, or give a terminal (ExecSpec.TTY is unsupported). Freeze
// stops the execs' process groups with SIGSTOP. Nothing survives the
// process: a new Executor knows no container (List is empty).
package fake

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/esf-dev/esf/executor"
)

// Executor is the fake executor; the zero value is not usable, call New.
type Executor struct {
	mu         sync.Mutex
	containers map[string]*container
	live       sync.WaitGroup // every exec's process and goroutines
	nlive      int            // under mu
}

type container struct {
	info   executor.Info
	spec   executor.Spec
	frozen bool
	procs  map[*process]struct{}
}

// New returns an executor with no containers.
func New() *Executor {
	return &Executor{containers: map[string]*container{}}
}

var _ executor.Executor = (*Executor)(nil)

// validID is runc's rule for container ids, kept the same so a test that
// passes on the fake does not use ids runc refuses.
var validID = regexp.MustCompile(`^[\w+\-.]+$`)

func checkID(id string) error {
	if len(id) > 128 || !validID.MatchString(id) || id == "." || id == ".." {
		return fmt.Errorf("container id %q: want 1..128 of [A-Za-z0-9_+.-]: %w", id, executor.ErrInvalidArgument)
	}
	return nil
}

// Start records container id on spec.Rootfs, which must be a directory.
func (e *Executor) Start(ctx context.Context, id string, spec executor.Spec) error {
	if err := checkID(id); err != nil {
		return err
	}
	if err := spec.Validate(); err != nil {
		return err
	}
	if fi, err := os.Stat(spec.Rootfs); err != nil || !fi.IsDir() {
		return fmt.Errorf("start %s: rootfs %s is not a directory: %w", id, spec.Rootfs, executor.ErrInvalidArgument)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.containers[id]; ok {
		return fmt.Errorf("start %s: %w", id, executor.ErrExists)
	}
	e.containers[id] = &container{
		info:  executor.Info{ID: id, Status: executor.StatusRunning, Rootfs: spec.Rootfs, Created: time.Now()},
		spec:  spec,
		procs: map[*process]struct{}{},
	}
	return nil
}

func (e *Executor) get(id string) (*container, error) {
	c, ok := e.containers[id]
	if !ok {
		return nil, fmt.Errorf("container %s: %w", id, executor.ErrNotFound)
	}
	return c, nil
}

// Exec runs spec as a host process in the rootfs.
func (e *Executor) Exec(ctx context.Context, id string, spec executor.ExecSpec) (executor.Process, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if spec.TTY {
		return nil, fmt.Errorf("exec: the fake executor has no terminals: %w", executor.ErrUnsupported)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	c, err := e.get(id)
	if err != nil {
		return nil, fmt.Errorf("exec: %w", err)
	}
	if c.frozen {
		return nil, fmt.Errorf("exec: container %s is frozen: %w", id, executor.ErrFailedPrecondition)
	}
	wd := firstNonEmpty(spec.Workdir, c.spec.Workdir, "/")
	dir := filepath.Join(c.spec.Rootfs, wd)
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("exec: workdir %s: not a directory in the rootfs: %w", wd, executor.ErrInvalidArgument)
	}
	path, err := exec.LookPath(spec.Args[0])
	if err != nil {
		return nil, fmt.Errorf("exec: %s: executable file not found: %w", spec.Args[0], executor.ErrInvalidArgument)
	}
	cmd := exec.Command(path, spec.Args[1:]...)
	cmd.Dir = dir
	cmd.Env = env(c.spec.Env, spec.Env)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // its own session and process group
	if spec.Stdout != nil {
		cmd.Stdout = &forgiving{w: spec.Stdout}
	}
	if spec.Stderr != nil {
		cmd.Stderr = &forgiving{w: spec.Stderr}
	}
	p := &process{c: c, done: make(chan struct{})}
	if spec.Stdin {
		if p.stdin, err = cmd.StdinPipe(); err != nil {
			return nil, fmt.Errorf("exec: %w", err)
		}
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("exec: %v: %w", err, executor.ErrInvalidArgument)
	}
	p.cmd = cmd
	c.procs[p] = struct{}{}
	e.nlive++
	e.live.Add(1)
	go func() {
		defer e.live.Done()
		stop := make(chan struct{})
		var ctxErr error
		var mu sync.Mutex
		go func() {
			select {
			case <-ctx.Done():
				mu.Lock()
				ctxErr = ctx.Err()
				mu.Unlock()
				p.kill()
			case <-stop:
			}
		}()
		werr := cmd.Wait()
		close(stop)
		code := 0
		var ee *exec.ExitError
		if errors.As(werr, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				code = 128 + int(ws.Signal())
			} else {
				code = ee.ExitCode()
			}
			werr = nil
		}
		mu.Lock()
		if ctxErr != nil {
			werr = fmt.Errorf("exec: %w", ctxErr)
		}
		mu.Unlock()
		p.code, p.err = code, werr
		e.mu.Lock()
		delete(c.procs, p)
		e.nlive--
		e.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// env is the host's PATH, then the container's env, then the exec's (KEY
// alone removes KEY).
func env(container, x []string) []string {
	out := []string{"PATH=" + os.Getenv("PATH")}
	set := func(kv string) {
		k, _, hasValue := strings.Cut(kv, "=")
		out = slices.DeleteFunc(out, func(o string) bool { return strings.HasPrefix(o, k+"=") })
		if hasValue {
			out = append(out, kv)
		}
	}
	for _, kv := range container {
		set(kv)
	}
	for _, kv := range x {
		set(kv)
	}
	return out
}

// forgiving passes writes on until the first failure, then swallows them:
// a writer that fails gets nothing more and the process goes on.
type forgiving struct {
	w      io.Writer
	failed bool
}

func (f *forgiving) Write(p []byte) (int, error) {
	if !f.failed {
		if _, err := f.w.Write(p); err != nil {
			f.failed = true
		}
	}
	return len(p), nil
}

type process struct {
	c     *container
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{}
	code  int
	err   error
}

func (p *process) Pid() int { return p.cmd.Process.Pid }

func (p *process) Stdin() io.WriteCloser {
	if p.stdin == nil {
		return nil
	}
	return p.stdin
}

func (p *process) Resize(executor.WinSize) error {
	return fmt.Errorf("resize: exec has no terminal: %w", executor.ErrFailedPrecondition)
}

func (p *process) Wait() (int, error) {
	<-p.done
	return p.code, p.err
}

// signal sends sig to the process's group (it and what it started).
func (p *process) signal(sig syscall.Signal) {
	syscall.Kill(-p.cmd.Process.Pid, sig)
}

func (p *process) kill() {
	p.signal(syscall.SIGKILL)
}

// Freeze stops every exec of the container (SIGSTOP to its group).
func (e *Executor) Freeze(ctx context.Context, id string) error {
	return e.setFrozen(id, true)
}

// Thaw continues them (SIGCONT).
func (e *Executor) Thaw(ctx context.Context, id string) error {
	return e.setFrozen(id, false)
}

func (e *Executor) setFrozen(id string, frozen bool) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	c, err := e.get(id)
	if err != nil {
		return err
	}
	sig := syscall.SIGCONT
	if frozen {
		sig = syscall.SIGSTOP
	}
	for p := range c.procs {
		p.signal(sig)
	}
	c.frozen = frozen
	c.info.Status = executor.StatusRunning
	if frozen {
		c.info.Status = executor.StatusPaused
	}
	return nil
}

// Stop kills every exec of the container and forgets it; it returns once
// they have ended.
func (e *Executor) Stop(ctx context.Context, id string) error {
	e.mu.Lock()
	c, ok := e.containers[id]
	delete(e.containers, id)
	var procs []*process
	if ok {
		for p := range c.procs {
			procs = append(procs, p)
			p.kill()
		}
	}
	e.mu.Unlock()
	for _, p := range procs {
		<-p.done
	}
	return nil
}

// State describes container id.
func (e *Executor) State(ctx context.Context, id string) (executor.Info, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	c, err := e.get(id)
	if err != nil {
		return executor.Info{}, err
	}
	return c.info, nil
}

// List describes the containers whose id starts with prefix, by id.
func (e *Executor) List(ctx context.Context, prefix string) ([]executor.Info, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []executor.Info
	for id, c := range e.containers {
		if strings.HasPrefix(id, prefix) {
			out = append(out, c.info)
		}
	}
	slices.SortFunc(out, func(a, b executor.Info) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// Live is how many execs have not ended yet (a leak check for tests).
func (e *Executor) Live() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.nlive
}
