package daytonafake

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The daemon's log multiplexing prefixes (common-go log.STDOUT_PREFIX and
// STDERR_PREFIX): each line of a session command's output is stored as
// prefix + line + "\n".
var (
	stdoutPrefix = []byte{1, 1, 1}
	stderrPrefix = []byte{2, 2, 2}
)

type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// kill ends the process group; the daemon starts every shell in its own
// group so children die with it.
func (p *proc) kill() {
	if p.cmd.Process != nil {
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
}

func (sb *sandbox) environ(extra map[string]string) []string {
	path := os.Getenv("PATH")
	if path == "" {
		path = "/usr/local/bin:/usr/bin:/bin"
	}
	env := map[string]string{
		"PATH": path, "HOME": sb.home, "USER": sb.user, "SHELL": "/bin/sh",
		"TMPDIR": "/tmp", "LANG": "C.UTF-8",
	}
	for k, v := range sb.env {
		env[k] = v
	}
	for k, v := range extra {
		env[k] = v
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// nsHolder sets up a sandbox's private mount namespace - its own /home and
// /tmp mounted over the host's - reports "ready" and then only keeps the
// namespace alive. Commands enter it with nsenter, which costs one exec
// instead of a new namespace and three mounts per command.
const nsHolder = `set -e
mount --make-rprivate /
mount --bind "$DAYTONAFAKE_ROOT/home" /home
mount --bind "$DAYTONAFAKE_ROOT/tmp" /tmp
echo ready
exec sleep 2147483647`

// holder is the process owning a sandbox's mount namespace.
type holder struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func (h *holder) stop() {
	h.cmd.Process.Kill()
	<-h.done
}

// startHolder starts the namespace holder for a sandbox rooted at root.
func startHolder(root string) (*holder, error) {
	cmd := exec.Command("/bin/sh", "-c", nsHolder)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "DAYTONAFAKE_ROOT=" + root}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Cloneflags: syscall.CLONE_NEWNS}
	if uid := os.Geteuid(); uid != 0 {
		cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWUSER
		cmd.SysProcAttr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: uid, Size: 1}}
		cmd.SysProcAttr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getegid(), Size: 1}}
	}
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	h := &holder{cmd: cmd, done: make(chan struct{})}
	line, _ := bufio.NewReader(out).ReadString('\n')
	go func() {
		cmd.Wait()
		close(h.done)
	}()
	if line != "ready\n" {
		h.stop()
		stderr.mu.Lock()
		defer stderr.mu.Unlock()
		return nil, fmt.Errorf("mount namespace setup failed: %s", bytes.TrimSpace(stderr.b.Bytes()))
	}
	return h, nil
}

// namespace returns the sandbox's namespace holder, starting it on first
// use (outside Server.mu: it takes a few process starts).
func (s *Server) namespace(sb *sandbox) (*holder, error) {
	sb.nsOnce.Do(func() {
		h, err := startHolder(sb.root)
		s.mu.Lock()
		defer s.mu.Unlock()
		switch {
		case err != nil:
			sb.nsErr = err
		case s.closed || !sb.live():
			h.stop()
			sb.nsErr = errors.New("sandbox is gone")
		default:
			sb.ns = h
		}
	})
	return sb.ns, sb.nsErr
}

// command builds a sandbox shell: /bin/sh with args, entered into the
// sandbox's mount namespace, in cwd (a sandbox path), with env, in its own
// process group.
func (sb *sandbox) command(h *holder, cwd string, env []string, args ...string) *exec.Cmd {
	ns := []string{"--target", strconv.Itoa(h.cmd.Process.Pid)}
	if os.Geteuid() != 0 {
		ns = append(ns, "--user", "--preserve-credentials")
	}
	// nsenter's --wd resolves its directory before entering the namespace,
	// so a shell changes directory and becomes the command's shell.
	ns = append(ns, "--mount", "/bin/sh", "-c", `cd "$1" || exit 1; shift; exec /bin/sh "$@"`, "sh", cwd)
	cmd := exec.Command(nsenter, append(ns, args...)...)
	cmd.Dir = "/"
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

var nsenter = func() string {
	if p, err := exec.LookPath("nsenter"); err == nil {
		return p
	}
	return "/usr/bin/nsenter"
}()

// probe checks that sandbox processes can be started here.
func probe(dir string) error {
	defer os.RemoveAll(dir)
	if err := makeRoot(dir, "probe"); err != nil {
		return err
	}
	fail := func(err error, out []byte) error {
		return fmt.Errorf("daytonafake: cannot give sandboxes private /home and /tmp (needs root or unprivileged user namespaces, mount(8) and nsenter(1)): %v %s", err, bytes.TrimSpace(out))
	}
	h, err := startHolder(dir)
	if err != nil {
		return fail(err, nil)
	}
	defer h.stop()
	sb := &sandbox{root: dir, home: "/home/probe"}
	out, err := sb.command(h, "/tmp", sb.environ(nil), "-c", "pwd").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "/tmp" {
		return fail(err, out)
	}
	return nil
}

// start runs cmd in sb and tracks it until it exits. onExit runs after
// Wait, before the process is forgotten.
func (s *Server) start(sb *sandbox, cmd *exec.Cmd, onExit func(exitCode int)) (*proc, error) {
	p := &proc{cmd: cmd, done: make(chan struct{})}
	s.mu.Lock()
	if s.closed || sb.state != "started" {
		s.mu.Unlock()
		return nil, errors.New("sandbox is not running")
	}
	if err := cmd.Start(); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	sb.procs[p] = struct{}{}
	s.procs.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.procs.Done()
		cmd.Wait()
		code := exitCode(cmd.ProcessState)
		if onExit != nil {
			onExit(code)
		}
		s.mu.Lock()
		delete(sb.procs, p)
		s.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

// exitCode is what a shell would report: 128+N for a signal.
func exitCode(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

var envKey = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// execute is POST /process/execute: the command is fed to the shell on
// stdin, stdout and stderr go to one buffer, a timeout kills the group
// and answers 408.
func (s *Server) execute(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	var req struct {
		Command string            `json:"command"`
		Cwd     *string           `json:"cwd"`
		Envs    map[string]string `json:"envs"`
		Timeout *uint32           `json:"timeout"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		daemonError(w, r, http.StatusBadRequest, "BAD_REQUEST", "invalid request body: "+err.Error())
		return
	}
	if strings.TrimSpace(req.Command) == "" {
		daemonError(w, r, http.StatusBadRequest, "BAD_REQUEST", "command cannot be empty or whitespace-only")
		return
	}
	for k := range req.Envs {
		if !envKey.MatchString(k) {
			daemonError(w, r, http.StatusBadRequest, "BAD_REQUEST", "invalid environment variable name: "+k)
			return
		}
	}
	dir := sb.home
	if req.Cwd != nil {
		dir = path.Clean(path.Join(sb.home, *req.Cwd))
		h, ok := sb.hostPath(dir)
		if fi, err := os.Stat(h); !ok || err != nil || !fi.IsDir() {
			// the daemon's cmd.Start fails on a bad cmd.Dir
			writeJSON(w, http.StatusOK, map[string]any{"exitCode": -1, "result": "chdir " + *req.Cwd + ": no such file or directory"})
			return
		}
	}
	h, err := s.namespace(sb)
	if err != nil {
		writeJSON(w, http.StatusOK, map[string]any{"exitCode": -1, "result": err.Error()})
		return
	}
	var out lockedBuffer
	cmd := sb.command(h, dir, sb.environ(req.Envs))
	cmd.Stdin = strings.NewReader(req.Command)
	cmd.Stdout, cmd.Stderr = &out, &out
	var code int
	p, err := s.start(sb, cmd, func(c int) { code = c })
	if err != nil {
		writeJSON(w, http.StatusOK, map[string]any{"exitCode": -1, "result": err.Error()})
		return
	}
	var timedOut atomic.Bool
	if req.Timeout != nil && *req.Timeout > 0 {
		t := time.AfterFunc(time.Duration(*req.Timeout)*time.Second, func() {
			timedOut.Store(true)
			p.kill()
		})
		defer t.Stop()
	}
	<-p.done
	if timedOut.Load() {
		daemonError(w, r, http.StatusRequestTimeout, "REQUEST_TIMEOUT", "command execution timeout")
		return
	}
	out.mu.Lock()
	result := out.b.String()
	out.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"exitCode": code, "result": result})
}

type tsession struct {
	id   string
	cmds map[string]*tcommand
}

type tcommand struct {
	id, command string
	log         []byte // prefixed lines, guarded by Server.mu
	exitCode    *int
	proc        *proc
	done        chan struct{} // closed once exitCode is set
}

func (s *Server) createSession(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	var req struct {
		SessionID string `json:"sessionId"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.SessionID == "" {
		daemonError(w, r, http.StatusBadRequest, "INVALID_REQUEST_BODY", "Key: 'CreateSessionRequest.SessionId' Error:Field validation for 'SessionId' failed on the 'required' tag")
		return
	}
	if req.SessionID == "entrypoint" {
		daemonError(w, r, http.StatusBadRequest, "BAD_REQUEST", "provided session ID is reserved and cannot be created/overridden")
		return
	}
	s.mu.Lock()
	if _, ok := sb.sessions[req.SessionID]; ok {
		s.mu.Unlock()
		daemonError(w, r, http.StatusConflict, "CONFLICT", "session already exists")
		return
	}
	sb.sessions[req.SessionID] = &tsession{id: req.SessionID, cmds: map[string]*tcommand{}}
	s.mu.Unlock()
	w.WriteHeader(http.StatusCreated)
}

func (s *Server) sessionRoute(w http.ResponseWriter, r *http.Request, sb *sandbox, parts []string) {
	m := r.Method
	switch {
	case len(parts) == 1 && m == http.MethodDelete:
		s.deleteSession(w, r, sb, parts[0])
	case len(parts) == 1 && m == http.MethodGet:
		s.getSession(w, r, sb, parts[0])
	case len(parts) == 2 && parts[1] == "exec" && m == http.MethodPost:
		s.sessionExec(w, r, sb, parts[0])
	case len(parts) == 3 && parts[1] == "command" && m == http.MethodGet:
		s.getCommand(w, r, sb, parts[0], parts[2])
	case len(parts) == 4 && parts[1] == "command" && parts[3] == "logs" && m == http.MethodGet:
		s.commandLogs(w, r, sb, parts[0], parts[2])
	default:
		http.Error(w, "404 page not found", http.StatusNotFound)
	}
}

func (s *Server) deleteSession(w http.ResponseWriter, r *http.Request, sb *sandbox, sid string) {
	s.mu.Lock()
	ses := sb.sessions[sid]
	if ses == nil {
		s.mu.Unlock()
		daemonError(w, r, http.StatusNotFound, "NOT_FOUND", "session not found")
		return
	}
	delete(sb.sessions, sid)
	var wait []*proc
	for _, c := range ses.cmds {
		if c.proc != nil && c.exitCode == nil {
			c.proc.kill()
			wait = append(wait, c.proc)
		}
	}
	s.mu.Unlock()
	// The daemon answers after the process group is gone.
	for _, p := range wait {
		<-p.done
	}
	w.WriteHeader(http.StatusNoContent)
}

type commandDTO struct {
	ID       string `json:"id"`
	Command  string `json:"command"`
	ExitCode *int   `json:"exitCode,omitempty"`
}

func (s *Server) getSession(w http.ResponseWriter, r *http.Request, sb *sandbox, sid string) {
	s.mu.Lock()
	ses := sb.sessions[sid]
	if ses == nil {
		s.mu.Unlock()
		daemonError(w, r, http.StatusNotFound, "NOT_FOUND", "session not found")
		return
	}
	cmds := []commandDTO{}
	for _, c := range ses.cmds {
		cmds = append(cmds, commandDTO{ID: c.id, Command: c.command, ExitCode: c.exitCode})
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"sessionId": sid, "commands": cmds})
}

func (s *Server) lookupCommand(w http.ResponseWriter, r *http.Request, sb *sandbox, sid, cid string) *tcommand {
	ses := sb.sessions[sid]
	if ses == nil {
		s.mu.Unlock()
		daemonError(w, r, http.StatusNotFound, "NOT_FOUND", "session not found")
		return nil
	}
	c := ses.cmds[cid]
	if c == nil {
		s.mu.Unlock()
		daemonError(w, r, http.StatusNotFound, "NOT_FOUND", "command not found")
		return nil
	}
	return c
}

func (s *Server) getCommand(w http.ResponseWriter, r *http.Request, sb *sandbox, sid, cid string) {
	s.mu.Lock()
	c := s.lookupCommand(w, r, sb, sid, cid)
	if c == nil {
		return
	}
	dto := commandDTO{ID: c.id, Command: c.command, ExitCode: c.exitCode}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, dto)
}

// sessionExec starts a command in a session. The daemon sources the command
// into the session's long-lived shell behind a wrapper that labels every
// output line; the fake runs it with sh -c (so shell state does not carry
// over between commands of one session) and labels lines the same way.
func (s *Server) sessionExec(w http.ResponseWriter, r *http.Request, sb *sandbox, sid string) {
	s.mu.Lock()
	ses := sb.sessions[sid]
	s.mu.Unlock()
	if ses == nil {
		// The controller wraps the service's NotFoundError, so the error
		// middleware no longer recognises it: a 500 without a code.
		writeJSON(w, http.StatusInternalServerError, map[string]any{
			"statusCode": 500, "message": "failed to execute command: session not found",
			"timestamp": time.Now().UTC().Format(time.RFC3339Nano), "path": r.URL.Path, "method": r.Method,
		})
		return
	}
	var req struct {
		Command           string `json:"command"`
		RunAsync          bool   `json:"runAsync"`
		Async             bool   `json:"async"`
		SuppressInputEcho bool   `json:"suppressInputEcho"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || strings.TrimSpace(req.Command) == "" {
		abort(w, http.StatusBadRequest)
		return
	}
	async := req.RunAsync || req.Async
	c := &tcommand{id: newUUID(), command: req.Command, done: make(chan struct{})}
	h, err := s.namespace(sb)
	if err != nil {
		daemonError(w, r, http.StatusBadRequest, "BAD_REQUEST", "failed to write command: "+err.Error())
		return
	}

	outR, outW, err := os.Pipe()
	if err != nil {
		abort(w, http.StatusBadRequest)
		return
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		abort(w, http.StatusBadRequest)
		return
	}
	// Like the daemon, hand the command over as a file, not as an argument:
	// commands may exceed the kernel's limit on one argument.
	script, err := s.scriptFile(req.Command)
	if err != nil {
		outR.Close()
		outW.Close()
		errR.Close()
		errW.Close()
		abort(w, http.StatusBadRequest)
		return
	}
	defer script.Close()
	cmd := sb.command(h, sb.home, sb.environ(nil), "/dev/fd/3")
	cmd.ExtraFiles = []*os.File{script}
	cmd.Stdout, cmd.Stderr = outW, errW
	var stdinHolder *os.File
	if async {
		// Async commands keep stdin open (for SendInput) until they end.
		inR, inW, err := os.Pipe()
		if err != nil {
			outR.Close()
			outW.Close()
			errR.Close()
			errW.Close()
			abort(w, http.StatusBadRequest)
			return
		}
		cmd.Stdin, stdinHolder = inR, inW
		defer inR.Close()
	}
	var labelers sync.WaitGroup
	label := func(src *os.File, prefix []byte) {
		defer labelers.Done()
		defer src.Close()
		br := bufio.NewReader(src)
		for {
			line, err := br.ReadBytes('\n')
			if len(line) > 0 {
				// `while IFS= read -r line` drops NUL bytes and ends
				// every line, including a last unterminated one, with "\n".
				line = bytes.ReplaceAll(bytes.TrimSuffix(line, []byte("\n")), []byte{0}, nil)
				rec := append(append(append([]byte{}, prefix...), line...), '\n')
				s.mu.Lock()
				c.log = append(c.log, rec...)
				s.mu.Unlock()
			}
			if err != nil {
				return
			}
		}
	}
	var code int
	p, err := s.start(sb, cmd, func(ec int) { code = ec })
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		if stdinHolder != nil {
			stdinHolder.Close()
		}
		daemonError(w, r, http.StatusBadRequest, "BAD_REQUEST", "failed to write command: "+err.Error())
		return
	}
	labelers.Add(2)
	go label(outR, stdoutPrefix)
	go label(errR, stderrPrefix)
	s.mu.Lock()
	c.proc = p
	if cur := sb.sessions[sid]; cur == ses {
		ses.cmds[c.id] = c
	} else {
		p.kill() // the session went away while we started
	}
	s.mu.Unlock()
	s.procs.Add(1)
	go func() {
		defer s.procs.Done()
		<-p.done
		if stdinHolder != nil {
			stdinHolder.Close()
		}
		labelers.Wait() // the exit code is written only after the log is flushed
		s.mu.Lock()
		c.exitCode = &code
		s.mu.Unlock()
		close(c.done)
	}()
	if async {
		writeJSON(w, http.StatusAccepted, map[string]any{"cmdId": c.id})
		return
	}
	<-c.done
	s.mu.Lock()
	gone := sb.sessions[sid] != ses
	out := append([]byte(nil), c.log...)
	s.mu.Unlock()
	if gone {
		daemonError(w, r, http.StatusBadRequest, "BAD_REQUEST", "session cancelled")
		return
	}
	resp := map[string]any{"cmdId": c.id, "exitCode": code}
	switch logMode(r) {
	case "json":
		o, e := demux(out)
		resp["output"], resp["stdout"], resp["stderr"] = string(out), string(o), string(e)
	case "raw":
		resp["output"] = string(out)
	default:
		resp["output"] = string(stripPrefixes(out))
	}
	writeJSON(w, http.StatusOK, resp)
}

// scriptFile is an unlinked file holding command, to be passed to the
// shell as fd 3; the script closes fd 3 first so the command does not
// inherit it.
func (s *Server) scriptFile(command string) (*os.File, error) {
	f, err := os.CreateTemp(s.dir, "cmd-*.sh")
	if err != nil {
		return nil, err
	}
	os.Remove(f.Name())
	if _, err := f.WriteString("exec 3<&-\n" + command + "\n"); err != nil {
		f.Close()
		return nil, err
	}
	if _, err := f.Seek(0, 0); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// logMode is how the daemon renders a command's log for this client: SDKs
// that send their version get JSON with separated streams; clients that
// send no version but X-Daytona-Split-Output: true get the raw labelled
// log; everyone else gets the combined text with labels removed.
func logMode(r *http.Request) string {
	switch {
	case r.Header.Get("X-Daytona-SDK-Version") != "":
		return "json"
	case r.Header.Get("X-Daytona-Split-Output") == "true":
		return "raw"
	}
	return "combined"
}

func (s *Server) commandLogs(w http.ResponseWriter, r *http.Request, sb *sandbox, sid, cid string) {
	if r.Header.Get("Upgrade") == "websocket" {
		daemonError(w, r, http.StatusBadRequest, "BAD_REQUEST", "the fake does not stream logs over websocket")
		return
	}
	s.mu.Lock()
	c := s.lookupCommand(w, r, sb, sid, cid)
	if c == nil {
		return
	}
	out := append([]byte(nil), c.log...)
	s.mu.Unlock()
	switch logMode(r) {
	case "json":
		o, e := demux(out)
		writeJSON(w, http.StatusOK, map[string]string{"output": string(out), "stdout": string(o), "stderr": string(e)})
	case "raw":
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write(out)
	default:
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write(stripPrefixes(out))
	}
}

func stripPrefixes(b []byte) []byte {
	return bytes.ReplaceAll(bytes.ReplaceAll(b, stdoutPrefix, nil), stderrPrefix, nil)
}

// demux splits a labelled log at the labels, like the daemon's
// DemuxLogBytes.
func demux(b []byte) (stdout, stderr []byte) {
	var cur *[]byte
	for len(b) > 0 {
		switch {
		case bytes.HasPrefix(b, stdoutPrefix):
			cur, b = &stdout, b[len(stdoutPrefix):]
			continue
		case bytes.HasPrefix(b, stderrPrefix):
			cur, b = &stderr, b[len(stderrPrefix):]
			continue
		}
		n := len(b)
		if i := indexLabel(b); i >= 0 {
			n = i
		}
		if cur != nil {
			*cur = append(*cur, b[:n]...)
		}
		b = b[n:]
	}
	return stdout, stderr
}

func indexLabel(b []byte) int {
	i, j := bytes.Index(b, stdoutPrefix), bytes.Index(b, stderrPrefix)
	switch {
	case i < 0:
		return j
	case j < 0 || i < j:
		return i
	}
	return j
}
