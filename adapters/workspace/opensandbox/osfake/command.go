package osfake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// command is one process execd started, foreground or background.
type command struct {
	id         string
	content    string
	background bool
	pid        int
	running    bool
	exitCode   *int
	errMsg     string
	startedAt  time.Time
	finishedAt *time.Time
	output     string        // background: combined output file
	exited     chan struct{} // closed once the process is reaped
}

type runRequest struct {
	Command    string            `json:"command"`
	Cwd        string            `json:"cwd"`
	Background bool              `json:"background"`
	Timeout    int64             `json:"timeout"`
	UID        *uint32           `json:"uid"`
	GID        *uint32           `json:"gid"`
	Envs       map[string]string `json:"envs"`
}

// streamEvent is execd's ServerStreamEvent.
type streamEvent struct {
	Type          string       `json:"type,omitempty"`
	Text          string       `json:"text,omitempty"`
	ExecutionTime int64        `json:"execution_time,omitempty"`
	Timestamp     int64        `json:"timestamp,omitempty"`
	Error         *errorOutput `json:"error,omitempty"`
}

type errorOutput struct {
	EName     string   `json:"ename,omitempty"`
	EValue    string   `json:"evalue,omitempty"`
	Traceback []string `json:"traceback,omitempty"`
}

// eventWriter writes execd's stream: each event a bare JSON object and a
// blank line, flushed at once; the SSE headers go out with the first event
// so errors found before it can still be plain JSON responses. Writes to a
// client that has gone are skipped, as execd skips them.
type eventWriter struct {
	mu      sync.Mutex
	w       http.ResponseWriter
	r       *http.Request
	started bool
}

func (e *eventWriter) send(ev streamEvent) {
	ev.Timestamp = time.Now().UnixMilli()
	b, _ := json.Marshal(ev)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.r.Context().Err() != nil {
		return
	}
	if !e.started {
		h := e.w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		h.Set("Connection", "keep-alive")
		h.Set("X-Accel-Buffering", "no")
		e.w.WriteHeader(http.StatusOK)
		e.started = true
	}
	_, _ = e.w.Write(append(b, '\n', '\n'))
	if f, ok := e.w.(http.Flusher); ok {
		f.Flush()
	}
}

func invalid(w http.ResponseWriter, err string) {
	execdError(w, http.StatusBadRequest, codeInvalidRequest, "invalid request, validation error "+err)
}

// runCommand is POST /command. As in execd, the process's life is bound to
// its own timeout, not to the request: a client that disconnects leaves it
// running until DELETE /command interrupts it, its timeout kills it, or the
// sandbox goes.
func (s *Server) runCommand(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r)
	var req runRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		execdError(w, http.StatusBadRequest, codeInvalidRequest, "error parsing request, MAYBE invalid body format. "+err.Error())
		return
	}
	switch {
	case req.Command == "":
		invalid(w, "Key: 'RunCommandRequest.Command' Error:Field validation for 'Command' failed on the 'required' tag")
		return
	case req.Timeout < 0:
		invalid(w, "Key: 'RunCommandRequest.TimeoutMs' Error:Field validation for 'TimeoutMs' failed on the 'gte' tag")
		return
	case req.GID != nil && req.UID == nil:
		invalid(w, "uid is required when gid is provided")
		return
	}
	cwd := "/"
	if req.Cwd != "" {
		abs, err := s.expand(sb, req.Cwd, nil)
		if err != nil {
			invalid(w, fmt.Sprintf("cannot resolve working directory %q: %v", req.Cwd, err))
			return
		}
		fi, err := os.Stat(sb.host(abs))
		switch {
		case errors.Is(err, os.ErrNotExist):
			invalid(w, fmt.Sprintf("working directory does not exist: %s: %v", req.Cwd, err))
			return
		case err != nil:
			invalid(w, fmt.Sprintf("cannot access working directory %q: %v", req.Cwd, err))
			return
		case !fi.IsDir():
			invalid(w, "working directory path is not a directory: "+req.Cwd)
			return
		}
		cwd = abs
	}

	ew := &eventWriter{w: w, r: r}
	c := &command{id: newID(), content: req.Command, background: req.Background, startedAt: time.Now().UTC(), exited: make(chan struct{})}
	// Output goes to files that are tailed, as execd does.
	var stdoutPath, stderrPath string
	if req.Background {
		c.output = filepath.Join(sb.logs, c.id+".output")
		stdoutPath, stderrPath = c.output, c.output
	} else {
		stdoutPath, stderrPath = filepath.Join(sb.logs, c.id+".stdout"), filepath.Join(sb.logs, c.id+".stderr")
	}
	for _, p := range []string{stdoutPath, stderrPath} {
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			execdError(w, http.StatusInternalServerError, codeRuntimeError, err.Error())
			return
		}
	}
	proc, err := s.start(sb, cwd, req, stdoutPath, stderrPath)
	if err != nil {
		ew.send(streamEvent{Type: "init", Text: c.id})
		ew.send(streamEvent{Type: "error", Error: &errorOutput{EName: "CommandExecError", EValue: err.Error(), Traceback: []string{err.Error()}}})
		s.graceful(r)
		return
	}
	s.started.Add(1)
	s.running.Add(1)
	c.pid, c.running = proc.pid, true
	s.register(sb, c)

	// The command's own deadline, not the request, bounds it.
	procCtx, procCancel := context.Background(), context.CancelFunc(func() {})
	if req.Timeout > 0 {
		procCtx, procCancel = context.WithTimeout(procCtx, time.Duration(req.Timeout)*time.Millisecond)
	}
	done := make(chan struct{})
	var exit procExit
	reap := func() {
		exit = proc.wait()
		s.finish(sb, c, exit)
		s.running.Add(-1)
		close(c.exited)
		close(done)
	}
	// The command's own deadline kills its whole process group.
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		select {
		case <-done:
		case <-procCtx.Done():
			_ = syscall.Kill(-c.pid, syscall.SIGKILL)
		}
	}()

	ew.send(streamEvent{Type: "init", Text: c.id})
	if req.Background {
		s.bg.Add(1)
		go func() {
			defer s.bg.Done()
			defer procCancel()
			reap()
		}()
		ew.send(streamEvent{Type: "execution_complete", ExecutionTime: time.Since(c.startedAt).Milliseconds()})
		s.graceful(r)
		return
	}

	tailersDone := make(chan struct{})
	var tw sync.WaitGroup
	for _, t := range []struct{ path, kind string }{{stdoutPath, "stdout"}, {stderrPath, "stderr"}} {
		tw.Add(1)
		go func() {
			defer tw.Done()
			s.tail(t.path, tailersDone, func(text string) { ew.send(streamEvent{Type: t.kind, Text: text}) })
		}()
	}
	tw.Add(1)
	go func() {
		defer tw.Done()
		tick := time.NewTicker(3 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-tailersDone:
				return
			case <-tick.C:
				ew.send(streamEvent{Type: "ping", Text: "pong"})
			}
		}
	}()
	reap()
	procCancel()
	close(tailersDone)
	tw.Wait()

	if exit.code == 0 {
		ew.send(streamEvent{Type: "execution_complete", ExecutionTime: time.Since(c.startedAt).Milliseconds()})
	} else {
		ew.send(streamEvent{Type: "error", Error: &errorOutput{EName: "CommandExecError",
			EValue: strconv.Itoa(exit.code), Traceback: []string{exit.text}}})
	}
	s.graceful(r)
}

// graceful holds the stream open after its last event, as execd does.
func (s *Server) graceful(r *http.Request) {
	t := time.NewTimer(s.opts.GracefulDelay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done():
	case <-s.closing:
	}
}

// start starts req's process: through the zygote, chrooted into the
// sandbox (see isolate_linux.go), or, Unisolated, on the host with the
// working directory, HOME and TMPDIR mapped into the root.
func (s *Server) start(sb *sandbox, cwd string, req runRequest, stdout, stderr string) (*process, error) {
	env := s.execdEnv(sb)
	env["LANG"] = "C.UTF-8"
	if s.opts.Unisolated {
		env["PATH"] = os.Getenv("PATH")
		env["HOME"] = sb.host(env["HOME"])
		env["TMPDIR"] = sb.host("/tmp")
	}
	for k, v := range req.Envs {
		env[k] = v
	}
	vars := make([]string, 0, len(env))
	for k, v := range env {
		vars = append(vars, k+"="+v)
	}
	sort.Strings(vars)
	if s.zygote != nil {
		return s.zygote.spawn(sb.root, cwd, req.Command, vars, stdout, stderr, req.UID, req.GID)
	}
	var files []*os.File
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for _, p := range []string{stdout, stderr} {
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	cmd := exec.Command("sh", "-c", req.Command)
	cmd.Dir = sb.host(cwd)
	cmd.Env = vars
	cmd.Stdout, cmd.Stderr = files[0], files[1]
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if req.UID != nil {
		cred := &syscall.Credential{Uid: *req.UID, Gid: *req.UID}
		if req.GID != nil {
			cred.Gid = *req.GID
		}
		cmd.SysProcAttr.Credential = cred
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &process{pid: cmd.Process.Pid, wait: func() procExit {
		_ = cmd.Wait()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok {
			return exitOf(ws)
		}
		return procExit{code: cmd.ProcessState.ExitCode(), text: cmd.ProcessState.String()}
	}}, nil
}

// register records a started command, freezing it if the sandbox froze (or
// killing it if the sandbox went) while it was starting.
func (s *Server) register(sb *sandbox, c *command) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb.cmds[c.id] = c
	switch {
	case s.sandboxes[sb.id] != sb:
		_ = syscall.Kill(-c.pid, syscall.SIGKILL)
	case sb.state == "Pausing" || sb.state == "Paused":
		_ = syscall.Kill(-c.pid, syscall.SIGSTOP)
	}
}

func (s *Server) finish(sb *sandbox, c *command, exit procExit) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now().UTC()
	code := exit.code
	if code != 0 {
		c.errMsg = exit.text
	}
	c.running, c.exitCode, c.finishedAt = false, &code, &now
}

// tail streams a growing output file as execd does: polled, one event per
// line with the terminator dropped, a lone "\n" for an empty line, "\r\n"
// counted once, and a final unterminated line flushed when the process is
// done.
func (s *Server) tail(file string, done <-chan struct{}, emit func(string)) {
	var pos int64
	var pending []byte
	cr := false
	read := func(final bool) {
		f, err := os.Open(file)
		if err != nil {
			return
		}
		defer f.Close()
		if _, err := f.Seek(pos, io.SeekStart); err != nil {
			return
		}
		data, _ := io.ReadAll(f)
		pos += int64(len(data))
		for _, b := range data {
			if b == '\n' || b == '\r' {
				switch {
				case len(pending) > 0:
					emit(string(pending))
					pending = pending[:0]
				case b == '\n' && cr:
				default:
					emit("\n")
				}
				cr = b == '\r'
				continue
			}
			cr = false
			pending = append(pending, b)
		}
		if final && len(pending) > 0 {
			emit(string(pending))
			pending = nil
		}
	}
	t := time.NewTicker(s.opts.TailInterval)
	defer t.Stop()
	for {
		select {
		case <-done:
			read(true)
			return
		case <-t.C:
			read(false)
		}
	}
}

// interruptCommand is DELETE /command?id=: SIGTERM to the process group,
// SIGKILL if it is still there 3s later.
func (s *Server) interruptCommand(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r)
	id := r.URL.Query().Get("id")
	if id == "" {
		execdError(w, http.StatusBadRequest, codeMissingQuery, "missing query parameter 'id'")
		return
	}
	s.mu.Lock()
	c := sb.cmds[id]
	var pid int
	var running bool
	var exited chan struct{}
	if c != nil {
		pid, running, exited = c.pid, c.running, c.exited
	}
	s.mu.Unlock()
	switch {
	case c == nil:
		execdError(w, http.StatusInternalServerError, codeRuntimeError, "error interruptting code context. no such session")
		return
	case !running || pid <= 0:
		execdError(w, http.StatusInternalServerError, codeRuntimeError, fmt.Sprintf("error interruptting code context. command session %s is not running", id))
		return
	}
	if err := syscall.Kill(-pid, syscall.SIGTERM); err == nil {
		select {
		case <-exited:
		case <-time.After(3 * time.Second):
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			select {
			case <-exited:
			case <-time.After(time.Second):
			}
		}
	}
	w.WriteHeader(http.StatusOK)
}

type commandStatusJSON struct {
	ID         string     `json:"id"`
	Content    string     `json:"content,omitempty"`
	Running    bool       `json:"running"`
	ExitCode   *int       `json:"exit_code,omitempty"`
	Error      string     `json:"error,omitempty"`
	StartedAt  time.Time  `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
}

func (s *Server) commandStatus(w http.ResponseWriter, r *http.Request, id string) {
	sb := sandboxOf(r)
	s.mu.Lock()
	c := sb.cmds[id]
	var st commandStatusJSON
	if c != nil {
		st = commandStatusJSON{ID: c.id, Content: c.content, Running: c.running, ExitCode: c.exitCode,
			Error: c.errMsg, StartedAt: c.startedAt, FinishedAt: c.finishedAt}
	}
	s.mu.Unlock()
	if c == nil {
		execdError(w, http.StatusNotFound, codeInvalidRequest, "command not found: "+id)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// commandLogs is GET /command/{id}/logs?cursor=: a background command's
// combined output after line cursor, the last line index in
// EXECD-COMMANDS-TAIL-CURSOR.
func (s *Server) commandLogs(w http.ResponseWriter, r *http.Request, id string) {
	sb := sandboxOf(r)
	s.mu.Lock()
	c := sb.cmds[id]
	s.mu.Unlock()
	if c == nil || !c.background {
		execdError(w, http.StatusBadRequest, codeInvalidRequest, "no background command "+id)
		return
	}
	data, err := os.ReadFile(c.output)
	if err != nil {
		execdError(w, http.StatusBadRequest, codeInvalidRequest, err.Error())
		return
	}
	lines := strings.SplitAfter(string(data), "\n")
	if n := len(lines); n > 0 && lines[n-1] == "" {
		lines = lines[:n-1]
	}
	from := 0
	if v := r.URL.Query().Get("cursor"); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n >= 0 {
			from = min(n+1, len(lines))
		}
	}
	w.Header().Set("EXECD-COMMANDS-TAIL-CURSOR", strconv.Itoa(max(len(lines)-1, 0)))
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, strings.Join(lines[from:], ""))
}
