package opensandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/esf-dev/esf/sandbox"
	"github.com/esf-dev/esf/workspace"
)

// runCommandRequest is execd's RunCommandRequest.
type runCommandRequest struct {
	Command string            `json:"command"`
	Cwd     string            `json:"cwd,omitempty"`
	Timeout int64             `json:"timeout,omitempty"` // milliseconds
	Envs    map[string]string `json:"envs,omitempty"`
}

const (
	// serverTimeoutGrace is added to the command's deadline for execd's
	// own timeout: the adapter interrupts on time itself, and execd's
	// SIGKILL is the backstop for a client that vanished.
	serverTimeoutGrace = 2 * time.Second
	// initGrace is how long a cancelled Run still waits for the command's
	// id, without which it cannot be interrupted.
	initGrace = 5 * time.Second
)

// wrapCommand is what execd is asked to run: command under sh (execd
// itself prefers bash), then the end marker on both streams (see
// outStream), then command's exit status, which the outer shell reports as
// 128+N when a signal killed the command. The marker is a whole line
// written with the line end before it in one write, so execd's tailer
// emits the two back to back however slowly the command ends.
func wrapCommand(command, sentinel string) string {
	return "sh -c " + shQuote(command) + "; __esf_rc=$?; printf '\\n%s\\n' " + sentinel +
		"; printf '\\n%s\\n' " + sentinel + " >&2; exit $__esf_rc"
}

// shQuote quotes s for a POSIX shell.
func shQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// Run runs command with "sh -c" through execd's POST /command and streams
// its events. execd itself runs bash when it finds one, so the command is
// handed to sh explicitly, inside a wrapper that marks the end of its
// output (see outStream). Stdin is unsupported: execd cannot feed a
// command.
//
// execd does not stop a command when its client goes away, so ending ctx
// (or Spec.Timeout) interrupts it (DELETE /command: SIGTERM to the process
// group, SIGKILL after 3s) before Run returns.
func (s *session) Run(ctx context.Context, spec sandbox.Spec, command string) (sandbox.Result, error) {
	const op = "run"
	if err := s.begin(op); err != nil {
		return sandbox.Result{}, err
	}
	if err := ctx.Err(); err != nil {
		// Checked up front: once sent, the request outlives ctx on purpose.
		return sandbox.Result{}, ctxError(ctx, "run")
	}
	if spec.Stdin != nil {
		return sandbox.Result{}, fmt.Errorf("opensandbox run: execd cannot feed stdin: %w", workspace.ErrUnsupported)
	}
	wd := spec.WorkDir
	if wd == "" {
		wd = "."
	}
	cwd, err := s.resolve(ctx, wd)
	if err != nil {
		return sandbox.Result{}, s.classify(ctx, op, err)
	}

	runCtx, cancelRun := ctx, context.CancelFunc(func() {})
	if spec.Timeout > 0 {
		runCtx, cancelRun = context.WithTimeout(ctx, spec.Timeout)
	}
	defer cancelRun()
	sentinel, err := randomHex(8)
	if err != nil {
		return sandbox.Result{}, err
	}
	sentinel = "esf-end-" + sentinel
	req := runCommandRequest{Command: wrapCommand(command, sentinel), Cwd: cwd, Envs: spec.Env}
	if dl, ok := runCtx.Deadline(); ok {
		req.Timeout = max(1, (time.Until(dl) + serverTimeoutGrace).Milliseconds())
	}

	x := &execution{s: s, stdout: spec.Stdout, stderr: spec.Stderr, sentinel: sentinel,
		idKnown: make(chan struct{}), finished: make(chan struct{})}
	// The request lives on its own context: ending runCtx must not drop
	// the stream before the command is known and interrupted.
	reqCtx, cancelReq := context.WithCancel(detach(runCtx))
	defer cancelReq()
	watchDone := make(chan struct{})
	stopWatch := context.AfterFunc(runCtx, func() {
		defer close(watchDone)
		x.stopRemote(runCtx)
		cancelReq()
	})

	res, runErr := x.run(reqCtx, req)
	close(x.finished)
	if !stopWatch() {
		<-watchDone
	}
	if runCtx.Err() != nil {
		switch {
		case ctx.Err() != nil:
			return sandbox.Result{}, ctxError(ctx, "run")
		default:
			return sandbox.Result{}, fmt.Errorf("opensandbox run: timed out after %s: %w", spec.Timeout, context.DeadlineExceeded)
		}
	}
	if runErr != nil {
		return sandbox.Result{}, s.classify(ctx, op, runErr)
	}
	return res, nil
}

// execution is one command's stream and what is known about it.
type execution struct {
	s              *session
	stdout, stderr io.Writer
	sentinel       string

	mu       sync.Mutex
	id       string
	done     bool // a terminal event arrived
	idKnown  chan struct{}
	finished chan struct{} // run returned
}

func (x *execution) setID(id string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.id == "" && id != "" {
		x.id = id
		close(x.idKnown)
	}
}

// stopRemote interrupts the command once its id is known, waiting a little
// for the id if the stream has not delivered it yet. It runs when runCtx
// ends, so it works on a fresh context.
func (x *execution) stopRemote(runCtx context.Context) {
	t := time.NewTimer(initGrace)
	defer t.Stop()
	select {
	case <-x.idKnown:
	case <-x.finished:
	case <-t.C:
	}
	x.mu.Lock()
	id, done := x.id, x.done
	x.mu.Unlock()
	if id == "" || done {
		return
	}
	cctx, cancel := x.s.p.cleanupCtx(runCtx)
	defer cancel()
	x.s.interrupt(cctx, id)
}

// streamItem is one read from the event stream.
type streamItem struct {
	ev  streamEvent
	err error
}

func (x *execution) run(ctx context.Context, req runCommandRequest) (sandbox.Result, error) {
	resp, err := x.s.execd(ctx, call{op: "run", method: http.MethodPost, json: req, accept: "text/event-stream"}, "/command")
	if err != nil {
		return sandbox.Result{}, err
	}
	// A reader goroutine feeds the loop below, so the loop (the only writer
	// of Stdout and Stderr) can also act on time: releasing a held line end.
	items := make(chan streamItem)
	quit := make(chan struct{})
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		rd := newEventReader(resp.Body)
		for {
			ev, err := rd.next()
			select {
			case items <- streamItem{ev, err}:
			case <-quit:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	defer func() {
		close(quit)
		resp.Body.Close()
		<-readerDone
	}()

	var outBuf, errBuf bytes.Buffer
	out := &outStream{w: &outBuf, sentinel: x.sentinel}
	errs := &outStream{w: &errBuf, sentinel: x.sentinel}
	if x.stdout != nil {
		out.w = x.stdout
	}
	if x.stderr != nil {
		errs.w = x.stderr
	}
	hold := time.NewTimer(time.Hour)
	hold.Stop()
	defer hold.Stop()
	for {
		var it streamItem
		select {
		case it = <-items:
		case <-hold.C:
			if err := errors.Join(out.release(), errs.release()); err != nil {
				x.abandon(ctx)
				return sandbox.Result{}, fmt.Errorf("opensandbox run: write output: %w", err)
			}
			continue
		}
		if it.err != nil {
			err := it.err
			if errors.Is(err, io.EOF) {
				err = &workspace.ProviderError{Provider: providerName, Op: "run", Status: resp.StatusCode,
					Message: "command stream ended without a result", Class: workspace.ErrProvider}
			}
			return sandbox.Result{}, transportError(ctx, "run", err)
		}
		ev := it.ev
		switch ev.Type {
		case "init":
			x.setID(ev.Text)
		case "stdout", "stderr":
			o := out
			if ev.Type == "stderr" {
				o = errs
			}
			if err := o.line(ev.Text); err != nil {
				x.abandon(ctx)
				return sandbox.Result{}, fmt.Errorf("opensandbox run: write %s: %w", ev.Type, err)
			}
			if out.held || errs.held {
				hold.Reset(lineHold)
			}
		case "execution_complete", "error":
			x.finish()
			code := 0
			if ev.Type == "error" {
				e := ev.err()
				c, ok := exitCode(e)
				if !ok {
					return sandbox.Result{}, &workspace.ProviderError{Provider: providerName, Op: "run", Code: e.EName,
						Message: e.EValue, Class: workspace.ErrProvider}
				}
				code = c
			}
			if err := errors.Join(out.end(), errs.end()); err != nil {
				return sandbox.Result{}, fmt.Errorf("opensandbox run: write output: %w", err)
			}
			return x.result(&outBuf, &errBuf, code), nil
		}
		// ping, status and the code-interpreter events carry nothing here.
	}
}

// lineHold is how long a line's "\n" is held back waiting for the next
// event (see outStream). The sentinel's event follows the held line end's
// at once, so this only delays line ends of a command that goes quiet.
const lineHold = 250 * time.Millisecond

// outStream rebuilds one output stream from execd's line events. execd
// strips every line end and sends an empty line as a lone "\n", so a
// trailing line without "\n" cannot be told from one with it. Run therefore
// has the command's shell print "\n<sentinel>\n" on both streams after the
// command: every line end is real except the last one before the sentinel.
// A line's "\n" is written when the next event comes (and dropped if that
// is the sentinel) or after lineHold, so a streaming reader sees a line
// ended at most lineHold late.
type outStream struct {
	w        io.Writer
	sentinel string
	held     bool // a "\n" is owed unless the sentinel comes next
	done     bool // the sentinel came
}

func (o *outStream) line(text string) error {
	if o.done {
		return nil
	}
	if text == o.sentinel {
		o.held, o.done = false, true
		return nil
	}
	if err := o.release(); err != nil {
		return err
	}
	if text != "\n" {
		if _, err := io.WriteString(o.w, text); err != nil {
			return err
		}
	}
	o.held = true
	return nil
}

func (o *outStream) release() error {
	if !o.held {
		return nil
	}
	o.held = false
	_, err := io.WriteString(o.w, "\n")
	return err
}

// end settles the stream when the command is over. Without a sentinel (the
// shell was killed with the command) the held line end is written.
func (o *outStream) end() error {
	if o.done {
		return nil
	}
	return o.release()
}

func (x *execution) finish() {
	x.mu.Lock()
	x.done = true
	x.mu.Unlock()
}

// abandon stops a command whose output can no longer be delivered.
func (x *execution) abandon(ctx context.Context) {
	x.mu.Lock()
	id, done := x.id, x.done
	x.mu.Unlock()
	if id != "" && !done {
		cctx, cancel := x.s.p.cleanupCtx(ctx)
		defer cancel()
		x.s.interrupt(cctx, id)
	}
}

func (x *execution) result(out, errb *bytes.Buffer, code int) sandbox.Result {
	r := sandbox.Result{ExitCode: code}
	if x.stdout == nil {
		r.Stdout = out.Bytes()
	}
	if x.stderr == nil {
		r.Stderr = errb.Bytes()
	}
	return r
}

// interrupt is DELETE /command?id=. Best effort: a command that finished in
// the meantime answers 500 "not running", which is what we wanted anyway.
func (s *session) interrupt(ctx context.Context, id string) {
	resp, err := s.execd(ctx, call{op: "interrupt", method: http.MethodDelete, query: url.Values{"id": {id}}, idempotent: true}, "/command")
	if err == nil {
		resp.Body.Close()
	}
}
