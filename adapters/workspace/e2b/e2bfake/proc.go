package e2bfake

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/esf-dev/esf/adapters/workspace/e2b/envd"
)

// proc is one started process. Its output goes to out while a stream is
// attached; once the stream leaves (detached), output is dropped and the
// process runs on, as envd's does, until it ends or is signalled.
type proc struct {
	pid      uint32
	tag      string
	cmd      *exec.Cmd
	stdin    io.WriteCloser // nil when started without stdin
	out      chan *envd.DataEvent
	detached chan struct{}
	detach   sync.Once
	done     chan struct{} // closed after Wait; state and waitErr set
	state    *os.ProcessState
	waitErr  error
	timedOut atomic.Bool
	inMu     sync.Mutex
}

func (p *proc) signal(sig syscall.Signal) {
	// The process leads its own group, so children die with it.
	_ = syscall.Kill(-int(p.pid), sig)
}

type procWriter struct {
	p      *proc
	stderr bool
}

func (w procWriter) Write(b []byte) (int, error) {
	ev := &envd.DataEvent{}
	if w.stderr {
		ev.Stderr = bytes.Clone(b)
	} else {
		ev.Stdout = bytes.Clone(b)
	}
	select {
	case w.p.out <- ev:
	case <-w.p.detached:
	}
	return len(b), nil
}

// spawn starts cfg in the jail, or on the host with its cwd mapped.
func (e *Envd) spawn(cfg *envd.ProcessConfig, cwd, hostCwd, tag string, stdin bool, timeout time.Duration) (*proc, error) {
	var cmd *exec.Cmd
	home, pathEnv := e.opts.Home, "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	if e.jail != nil {
		cmd = e.jail.command(cwd, cfg.Cmd, cfg.Args)
	} else {
		cmd = exec.Command(cfg.Cmd, cfg.Args...)
		cmd.Dir = hostCwd
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		_, home, _ = e.resolve(e.opts.Home)
		pathEnv = os.Getenv("PATH")
	}
	env := []string{
		"PATH=" + pathEnv,
		"HOME=" + home,
		"USER=" + e.opts.User,
		"LOGNAME=" + e.opts.User,
	}
	for k, v := range e.opts.Env {
		env = append(env, k+"="+v)
	}
	for k, v := range cfg.Envs {
		env = append(env, k+"="+v)
	}
	cmd.Env = env
	cmd.WaitDelay = 2 * time.Second
	p := &proc{tag: tag, cmd: cmd, out: make(chan *envd.DataEvent, 64), detached: make(chan struct{}), done: make(chan struct{})}
	cmd.Stdout = procWriter{p: p}
	cmd.Stderr = procWriter{p: p, stderr: true}
	if stdin {
		w, err := cmd.StdinPipe()
		if err != nil {
			return nil, err
		}
		p.stdin = w
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p.pid = uint32(cmd.Process.Pid)
	var timer *time.Timer
	if timeout > 0 {
		timer = time.AfterFunc(timeout, func() {
			p.timedOut.Store(true)
			p.signal(syscall.SIGKILL)
		})
	}
	e.mu.Lock()
	e.procs[p.pid] = p
	e.wg.Add(1)
	e.mu.Unlock()
	go func() {
		defer e.wg.Done()
		err := cmd.Wait()
		if timer != nil {
			timer.Stop()
		}
		p.state, p.waitErr = cmd.ProcessState, err
		e.mu.Lock()
		delete(e.procs, p.pid)
		e.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

// start serves process.Process/Start the way envd does: a start event,
// data events as output appears (keepalives while quiet), the end event,
// then the end-of-stream frame. Connect-Timeout-Ms kills the process; a
// client that goes away does not.
func (e *Envd) start(ctx context.Context, req *connect.Request[envd.StartRequest], stream *connect.ServerStream[envd.StartResponse]) error {
	if err := e.user(req.Header()); err != nil {
		return err
	}
	cfg := req.Msg.Process
	if cfg == nil || cfg.Cmd == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("process config is required"))
	}
	timeout := time.Duration(0)
	if v := req.Header().Get(envd.HeaderTimeoutMs); v != "" {
		ms, err := strconv.Atoi(v)
		if err != nil {
			return connect.NewError(connect.CodeInvalidArgument, err)
		}
		timeout = time.Duration(ms) * time.Millisecond
	}
	cwd := e.opts.Home
	if cfg.Cwd != nil && *cfg.Cwd != "" {
		cwd = *cfg.Cwd
	}
	sp, hp, err := e.resolve(cwd)
	if err != nil {
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	if fi, err := os.Stat(hp); err != nil || !fi.IsDir() {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("cwd '%s' does not exist", sp))
	}
	withStdin := req.Msg.Stdin == nil || *req.Msg.Stdin
	tag := ""
	if req.Msg.Tag != nil {
		tag = *req.Msg.Tag
	}
	p, err := e.spawn(cfg, sp, hp, tag, withStdin, timeout)
	if err != nil {
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	defer p.detach.Do(func() { close(p.detached) })

	if err := stream.Send(&envd.StartResponse{Event: &envd.ProcessEvent{Start: &envd.StartEvent{Pid: p.pid}}}); err != nil {
		return err
	}
	interval := e.opts.Keepalive
	if v := req.Header().Get(envd.HeaderKeepalive); v != "" {
		if s, err := strconv.Atoi(v); err == nil && s > 0 {
			interval = time.Duration(s) * time.Second
		}
	}
	keepalive := time.NewTicker(interval)
	defer keepalive.Stop()
	for {
		select {
		case ev := <-p.out:
			if err := stream.Send(&envd.StartResponse{Event: &envd.ProcessEvent{Data: ev}}); err != nil {
				return err
			}
			keepalive.Reset(interval)
		case <-keepalive.C:
			if err := stream.Send(&envd.StartResponse{Event: &envd.ProcessEvent{Keepalive: &struct{}{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		case <-p.done:
			// Wait returned, so every write has happened; flush what is
			// queued, then report the end.
			for {
				select {
				case ev := <-p.out:
					if err := stream.Send(&envd.StartResponse{Event: &envd.ProcessEvent{Data: ev}}); err != nil {
						return err
					}
					continue
				default:
				}
				break
			}
			if p.timedOut.Load() {
				return connect.NewError(connect.CodeDeadlineExceeded, errors.New("process timed out"))
			}
			return stream.Send(&envd.StartResponse{Event: &envd.ProcessEvent{End: endEvent(p)}})
		}
	}
}

func endEvent(p *proc) *envd.EndEvent {
	st := p.state
	end := &envd.EndEvent{ExitCode: int32(st.ExitCode()), Exited: st.Exited(), Status: st.String()}
	if p.waitErr != nil {
		s := p.waitErr.Error()
		end.Error = &s
	}
	return end
}

// lookup finds a process by pid or by tag.
func (e *Envd) lookup(sel *envd.ProcessSelector) (*proc, error) {
	switch {
	case sel == nil || sel.Pid == 0 && (sel.Tag == nil || *sel.Tag == ""):
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process selector is required"))
	case sel.Pid != 0:
		e.mu.Lock()
		defer e.mu.Unlock()
		if p, ok := e.procs[sel.Pid]; ok {
			return p, nil
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", sel.Pid))
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, p := range e.procs {
		if p.tag == *sel.Tag {
			return p, nil
		}
	}
	return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with tag %s not found", *sel.Tag))
}

func (e *Envd) sendInput(_ context.Context, req *connect.Request[envd.SendInputRequest]) (*connect.Response[envd.Empty], error) {
	if err := e.user(req.Header()); err != nil {
		return nil, err
	}
	p, err := e.lookup(req.Msg.Process)
	if err != nil {
		return nil, err
	}
	if p.stdin == nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("stdin not enabled or closed"))
	}
	if req.Msg.Input == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("input is required"))
	}
	p.inMu.Lock()
	defer p.inMu.Unlock()
	if _, err := p.stdin.Write(req.Msg.Input.Stdin); err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("error writing to stdin: %v", err))
	}
	return connect.NewResponse(&envd.Empty{}), nil
}

func (e *Envd) closeStdin(_ context.Context, req *connect.Request[envd.CloseStdinRequest]) (*connect.Response[envd.Empty], error) {
	if err := e.user(req.Header()); err != nil {
		return nil, err
	}
	p, err := e.lookup(req.Msg.Process)
	if err != nil {
		return nil, err
	}
	if p.stdin == nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("stdin not enabled"))
	}
	p.inMu.Lock()
	defer p.inMu.Unlock()
	_ = p.stdin.Close()
	return connect.NewResponse(&envd.Empty{}), nil
}

func (e *Envd) sendSignal(_ context.Context, req *connect.Request[envd.SendSignalRequest]) (*connect.Response[envd.Empty], error) {
	if err := e.user(req.Header()); err != nil {
		return nil, err
	}
	p, err := e.lookup(req.Msg.Process)
	if err != nil {
		return nil, err
	}
	switch req.Msg.Signal {
	case envd.SignalKill:
		p.signal(syscall.SIGKILL)
	case envd.SignalTerm:
		p.signal(syscall.SIGTERM)
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("invalid signal: %s", req.Msg.Signal))
	}
	return connect.NewResponse(&envd.Empty{}), nil
}
