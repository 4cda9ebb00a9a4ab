package e2b

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/esf-dev/esf/e2b/envdwire"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/fabric"
)

// envd's process service over fabric.Exec: every command is an exec in
// the sandbox's container, run by the front door (not by the request that
// started it), so it outlives its client's disconnect and ends by itself,
// at its timeout (Connect-Timeout-Ms), by a signal, or when the sandbox
// goes. Its output goes to the streams attached to it at the time (Start's
// and Connect's); output nobody is attached to is dropped, as in envd.
// Pids are the front door's own numbers, unique per sandbox: commands run
// in their container's pid namespace, whose numbers mean nothing outside.

// procTable is a sandbox's commands.
type procTable struct {
	mu    sync.Mutex
	next  uint32
	procs map[uint32]*proc
	ctx   context.Context // ends when the sandbox goes
	stop  context.CancelFunc
	wg    sync.WaitGroup
}

func newProcTable(parent context.Context) *procTable {
	t := &procTable{next: 1, procs: map[uint32]*proc{}}
	t.ctx, t.stop = context.WithCancel(parent)
	return t
}

// killAll kills every command and waits for them to end.
func (t *procTable) killAll() {
	t.stop()
	t.wg.Wait()
}

// proc is one command.
type proc struct {
	pid    uint32
	tag    *string
	cfg    envdwire.ProcessConfig
	tty    bool
	cancel context.CancelFunc

	started chan struct{} // closed once the command runs
	done    chan struct{} // closed once it ended; end is set then

	mu     sync.Mutex
	subs   map[*sub]struct{}
	stdin  io.WriteCloser
	resize func(rows, cols uint16) error
	killed bool
	end    *envdwire.EndEvent
	err    error // the command could not run
}

// sub is one stream attached to a command.
type sub struct {
	ch   chan *envdwire.ProcessEvent
	gone chan struct{}
}

func (p *proc) attach() *sub {
	s := &sub{ch: make(chan *envdwire.ProcessEvent), gone: make(chan struct{})}
	p.mu.Lock()
	p.subs[s] = struct{}{}
	p.mu.Unlock()
	return s
}

func (p *proc) detach(s *sub) {
	p.mu.Lock()
	delete(p.subs, s)
	p.mu.Unlock()
	close(s.gone)
}

// output returns the writer of one of the command's streams: each write
// goes to every attached stream, waiting for each to take it (or leave).
func (p *proc) output(kind byte) io.Writer {
	return writerFunc(func(b []byte) (int, error) {
		data := &envdwire.DataEvent{}
		c := append([]byte(nil), b...)
		switch kind {
		case 1:
			data.Stdout = c
		case 2:
			data.Stderr = c
		default:
			data.Pty = c
		}
		ev := &envdwire.ProcessEvent{Data: data}
		p.mu.Lock()
		subs := make([]*sub, 0, len(p.subs))
		for s := range p.subs {
			subs = append(subs, s)
		}
		p.mu.Unlock()
		for _, s := range subs {
			select {
			case s.ch <- ev:
			case <-s.gone:
			}
		}
		return len(b), nil
	})
}

type writerFunc func([]byte) (int, error)

func (w writerFunc) Write(p []byte) (int, error) { return w(p) }

func (t *procTable) get(sel *envdwire.ProcessSelector) (*proc, error) {
	if sel == nil {
		return nil, rpcErr(codeInvalidArgument, "no process selector")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if sel.Tag != nil {
		for _, p := range t.procs {
			if p.tag != nil && *p.tag == *sel.Tag {
				return p, nil
			}
		}
		return nil, rpcErr(codeNotFound, "process with tag %s not found", *sel.Tag)
	}
	p, ok := t.procs[sel.Pid]
	if !ok {
		return nil, rpcErr(codeNotFound, "process with pid %d not found", sel.Pid)
	}
	return p, nil
}

// keepaliveOf reads the interval a stream's client asks for.
func keepaliveOf(h http.Header) time.Duration {
	if n, err := strconv.Atoi(h.Get(envdwire.HeaderKeepalive)); err == nil && n > 0 {
		return time.Duration(n) * time.Second
	}
	return 90 * time.Second
}

func (s *Server) processStart(r *http.Request, req *envdwire.StartRequest, st *stream) error {
	sb, user, err := s.envdCall(r)
	if err != nil {
		return err
	}
	if req.Process == nil || req.Process.Cmd == "" {
		return rpcErr(codeInvalidArgument, "no command")
	}
	s.mu.Lock()
	a, procs := sb.attempt, sb.procs
	s.mu.Unlock()
	if procs == nil {
		return rpcErr(codeUnavailable, "sandbox %s is paused", sb.id)
	}
	home := Home
	if user == "root" {
		home = RootHome
	}
	cwd := home
	if req.Process.Cwd != nil && *req.Process.Cwd != "" {
		cwd = *req.Process.Cwd
	}
	env := []string{"HOME=" + home, "USER=" + user, "LOGNAME=" + user}
	keys := make([]string, 0, len(req.Process.Envs))
	for k := range req.Process.Envs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+req.Process.Envs[k])
	}
	xr := fabric.ExecRequest{AttemptID: a.AttemptID, Args: append([]string{req.Process.Cmd}, req.Process.Args...),
		Env: env, Workdir: cwd}
	if ms, err := strconv.ParseInt(r.Header.Get(envdwire.HeaderTimeoutMs), 10, 64); err == nil && ms > 0 {
		xr.TimeoutMillis = ms
	}
	tty := req.Pty != nil
	if tty {
		xr.TTY, xr.Stdin = true, true
		if req.Pty.Size != nil {
			xr.Rows, xr.Cols = uint16(req.Pty.Size.Rows), uint16(req.Pty.Size.Cols)
		}
	}
	if req.Stdin == nil || *req.Stdin {
		xr.Stdin = true
	}

	procs.mu.Lock()
	if procs.ctx.Err() != nil {
		procs.mu.Unlock()
		return rpcErr(codeUnavailable, "sandbox %s is gone", sb.id)
	}
	p := &proc{pid: procs.next, tag: req.Tag, cfg: *req.Process, tty: tty, subs: map[*sub]struct{}{},
		started: make(chan struct{}), done: make(chan struct{})}
	procs.next++
	procs.procs[p.pid] = p
	ctx, cancel := context.WithCancel(procs.ctx)
	p.cancel = cancel
	procs.wg.Add(1)
	procs.mu.Unlock()
	sub := p.attach()
	defer p.detach(sub)

	go func() {
		defer procs.wg.Done()
		defer cancel()
		var once sync.Once
		streams := fabric.ExecStreams{
			Started: func(stdin io.WriteCloser, resize func(rows, cols uint16) error) {
				p.mu.Lock()
				p.stdin, p.resize = stdin, resize
				p.mu.Unlock()
				once.Do(func() { close(p.started) })
			},
		}
		if tty {
			streams.Stdout = p.output(3)
			streams.Stderr = p.output(3)
		} else {
			streams.Stdout = p.output(1)
			streams.Stderr = p.output(2)
		}
		res, err := s.f.Exec(ctx, xr, streams)
		p.mu.Lock()
		if p.stdin != nil {
			p.stdin.Close()
		}
		killed := p.killed
		p.mu.Unlock()
		end := &envdwire.EndEvent{ExitCode: int32(res.ExitCode), Exited: true,
			Status: "exit status " + strconv.Itoa(res.ExitCode)}
		runErr := error(nil)
		select {
		case <-p.started:
			switch {
			case killed || (err != nil && errors.Is(err, context.Canceled)):
				end = &envdwire.EndEvent{ExitCode: -1, Status: "signal: killed"}
			case err != nil && errdefs.CodeOf(err) == errdefs.CodeDeadlineExceeded:
				msg := "the command ran past its timeout"
				end = &envdwire.EndEvent{ExitCode: -1, Status: "signal: killed", Error: &msg}
			case err != nil:
				msg := err.Error()
				end = &envdwire.EndEvent{ExitCode: -1, Status: "error", Error: &msg}
			}
		default:
			if err == nil {
				err = fmt.Errorf("the command did not start")
			}
			runErr = err
		}
		p.mu.Lock()
		p.end, p.err = end, runErr
		p.mu.Unlock()
		procs.mu.Lock()
		delete(procs.procs, p.pid)
		procs.mu.Unlock()
		close(p.done)
	}()

	select {
	case <-p.started:
	case <-p.done:
		if p.err != nil {
			return startError(p.err)
		}
	}
	if err := st.send(&envdwire.StartResponse{Event: &envdwire.ProcessEvent{Start: &envdwire.StartEvent{Pid: p.pid}}}); err != nil {
		return err
	}
	return s.follow(r, p, sub, st)
}

// startError is the stream error of a command that could not run.
func startError(err error) error {
	code := codeInternal
	switch errdefs.CodeOf(err) {
	case errdefs.CodeInvalidArgument:
		code = codeInvalidArgument
	case errdefs.CodeNotFound:
		code = codeNotFound
	case errdefs.CodeFailedPrecondition, errdefs.CodeUnavailable:
		code = codeUnavailable
	}
	return rpcErr(code, "start the command: %v", err)
}

// follow streams a command's events to st until it ends (its end event)
// or the client leaves (the command goes on).
func (s *Server) follow(r *http.Request, p *proc, sb *sub, st *stream) error {
	tick := time.NewTicker(keepaliveOf(r.Header))
	defer tick.Stop()
	for {
		select {
		case ev := <-sb.ch:
			if err := st.send(&envdwire.StartResponse{Event: ev}); err != nil {
				return err
			}
		case <-tick.C:
			if err := st.send(&envdwire.StartResponse{Event: &envdwire.ProcessEvent{Keepalive: &struct{}{}}}); err != nil {
				return err
			}
		case <-p.done:
			p.mu.Lock()
			end := p.end
			p.mu.Unlock()
			return st.send(&envdwire.StartResponse{Event: &envdwire.ProcessEvent{End: end}})
		case <-r.Context().Done():
			return r.Context().Err()
		}
	}
}

func (s *Server) processConnect(r *http.Request, req *envdwire.ConnectRequest, st *stream) error {
	sb, _, err := s.envdCall(r)
	if err != nil {
		return err
	}
	t, err := s.procsOf(sb)
	if err != nil {
		return err
	}
	p, err := t.get(req.Process)
	if err != nil {
		return err
	}
	sub := p.attach()
	defer p.detach(sub)
	if err := st.send(&envdwire.StartResponse{Event: &envdwire.ProcessEvent{Start: &envdwire.StartEvent{Pid: p.pid}}}); err != nil {
		return err
	}
	return s.follow(r, p, sub, st)
}

func (s *Server) procsOf(sb *sandbox) (*procTable, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sb.procs == nil {
		return nil, rpcErr(codeUnavailable, "sandbox %s is paused", sb.id)
	}
	return sb.procs, nil
}

func (s *Server) processList(r *http.Request, _ *envdwire.Empty) (*envdwire.ListResponse, error) {
	sb, _, err := s.envdCall(r)
	if err != nil {
		return nil, err
	}
	t, err := s.procsOf(sb)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	out := &envdwire.ListResponse{}
	for _, p := range t.procs {
		cfg := p.cfg
		out.Processes = append(out.Processes, &envdwire.ProcessInfo{Config: &cfg, Pid: p.pid, Tag: p.tag})
	}
	sort.Slice(out.Processes, func(i, j int) bool { return out.Processes[i].Pid < out.Processes[j].Pid })
	return out, nil
}

func (s *Server) procOf(r *http.Request, sel *envdwire.ProcessSelector) (*proc, error) {
	sb, _, err := s.envdCall(r)
	if err != nil {
		return nil, err
	}
	t, err := s.procsOf(sb)
	if err != nil {
		return nil, err
	}
	return t.get(sel)
}

func (s *Server) processSendInput(r *http.Request, req *envdwire.SendInputRequest) (*envdwire.Empty, error) {
	p, err := s.procOf(r, req.Process)
	if err != nil {
		return nil, err
	}
	if req.Input == nil {
		return &envdwire.Empty{}, nil
	}
	data := req.Input.Stdin
	if req.Input.Pty != nil {
		data = req.Input.Pty
	}
	<-p.startedOrDone()
	p.mu.Lock()
	in := p.stdin
	p.mu.Unlock()
	if in == nil {
		return nil, rpcErr(codeFailedPrecondition, "process %d has no stdin (started with stdin: false)", p.pid)
	}
	if _, err := in.Write(data); err != nil {
		return nil, rpcErr(codeFailedPrecondition, "write stdin of process %d: %v", p.pid, err)
	}
	return &envdwire.Empty{}, nil
}

// startedOrDone is closed once the command runs or ended.
func (p *proc) startedOrDone() <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		select {
		case <-p.started:
		case <-p.done:
		}
		close(ch)
	}()
	return ch
}

func (s *Server) processCloseStdin(r *http.Request, req *envdwire.CloseStdinRequest) (*envdwire.Empty, error) {
	p, err := s.procOf(r, req.Process)
	if err != nil {
		return nil, err
	}
	<-p.startedOrDone()
	p.mu.Lock()
	in := p.stdin
	p.mu.Unlock()
	if in != nil {
		if p.tty {
			in.Write([]byte{4}) // ^D: a terminal has no end of input
		} else {
			in.Close()
		}
	}
	return &envdwire.Empty{}, nil
}

func (s *Server) processSendSignal(r *http.Request, req *envdwire.SendSignalRequest) (*envdwire.Empty, error) {
	p, err := s.procOf(r, req.Process)
	if err != nil {
		return nil, err
	}
	switch req.Signal {
	case envdwire.SignalKill, envdwire.SignalTerm:
	default:
		return nil, rpcErr(codeInvalidArgument, "signal %q: want %s or %s", req.Signal, envdwire.SignalKill, envdwire.SignalTerm)
	}
	// Both kill: fabric ends a command with its descendants (SIGKILL).
	p.mu.Lock()
	p.killed = true
	p.mu.Unlock()
	p.cancel()
	return &envdwire.Empty{}, nil
}

func (s *Server) processUpdate(r *http.Request, req *envdwire.UpdateRequest) (*envdwire.Empty, error) {
	p, err := s.procOf(r, req.Process)
	if err != nil {
		return nil, err
	}
	if req.Pty == nil || req.Pty.Size == nil {
		return &envdwire.Empty{}, nil
	}
	<-p.startedOrDone()
	p.mu.Lock()
	resize := p.resize
	p.mu.Unlock()
	if resize == nil {
		return nil, rpcErr(codeFailedPrecondition, "process %d has no terminal", p.pid)
	}
	if err := resize(uint16(req.Pty.Size.Rows), uint16(req.Pty.Size.Cols)); err != nil {
		return nil, rpcErr(codeInternal, "resize: %v", err)
	}
	return &envdwire.Empty{}, nil
}
