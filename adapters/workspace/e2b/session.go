package e2b

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/esf-dev/esf/adapters/workspace/e2b/envd"
	"github.com/esf-dev/esf/sandbox"
	"github.com/esf-dev/esf/vfs"
	"github.com/esf-dev/esf/workspace"
)

// Session is one sandbox. Its methods are safe for concurrent use.
type Session struct {
	p       *Provider
	id      string
	home    string
	cwd     string
	timeout time.Duration // lifetime asked for on Resume

	closeMu sync.Mutex // serialises Close, so a second Close sees the first's outcome

	mu          sync.Mutex
	closed      bool
	paused      bool
	env         *envd.Client // nil while paused
	envdVersion string
}

var (
	_ workspace.Session = (*Session)(nil)
	_ workspace.Pauser  = (*Session)(nil)
)

// ID is the sandbox id.
func (s *Session) ID() string { return s.id }

// setSandbox adopts what the control plane said about the sandbox: its
// state, and the tokens and domain that reach its envd.
func (s *Session) setSandbox(sb *sandboxInfo) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sb.EnvdVersion != "" {
		s.envdVersion = sb.EnvdVersion
	}
	if sb.State == "paused" || sb.State == "pausing" {
		s.paused, s.env = true, nil
		return
	}
	s.paused = false
	s.env = envd.NewClient(s.p.cfg.HTTPClient, s.p.target(sb))
}

// client returns the envd client, or ErrClosed / ErrPaused. A handle
// that last saw the sandbox paused asks the control plane again first:
// another handle may have resumed it.
func (s *Session) client(ctx context.Context) (*envd.Client, error) {
	s.mu.Lock()
	closed, paused, env := s.closed, s.paused, s.env
	s.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("%s session %s: %w", s.p.cfg.Name, s.id, workspace.ErrClosed)
	}
	if !paused && env != nil {
		return env, nil
	}
	sb, err := s.p.lookup(ctx, s.id)
	if err != nil {
		return nil, err
	}
	s.setSandbox(sb)
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return nil, fmt.Errorf("%s session %s: %w", s.p.cfg.Name, s.id, workspace.ErrClosed)
	case s.paused || s.env == nil:
		return nil, fmt.Errorf("%s session %s: %w", s.p.cfg.Name, s.id, workspace.ErrPaused)
	}
	return s.env, nil
}

func (s *Session) version() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.envdVersion
}

func (s *Session) resolve(p string) (string, error) {
	return vfs.Resolve(s.home, s.cwd, p)
}

// Run runs command with /bin/sh -c through envd's process service.
func (s *Session) Run(ctx context.Context, spec sandbox.Spec, command string) (sandbox.Result, error) {
	c, err := s.client(ctx)
	if err != nil {
		return sandbox.Result{}, err
	}
	cwd := s.cwd
	if spec.WorkDir != "" {
		if cwd, err = s.resolve(spec.WorkDir); err != nil {
			return sandbox.Result{}, err
		}
	}
	ver := s.version()
	if spec.Stdin != nil && !envd.VersionAtLeast(ver, envd.MinVersionStdinEOF) {
		return sandbox.Result{}, fmt.Errorf("%s run: stdin needs envd >= %s, sandbox has %s: %w",
			s.p.cfg.Name, envd.MinVersionStdinEOF, ver, workspace.ErrUnsupported)
	}
	runCtx := ctx
	if spec.Timeout > 0 {
		var cancel context.CancelFunc
		runCtx, cancel = context.WithTimeout(ctx, spec.Timeout)
		defer cancel()
	}
	// The tag names the process before its pid is known, so a Run cut
	// before the start event can still kill it.
	tag := "esf-" + randomToken()
	req := &envd.StartRequest{Process: &envd.ProcessConfig{
		Cmd:  "/bin/sh",
		Args: []string{"-c", command},
		Envs: spec.Env,
		Cwd:  &cwd,
	}, Tag: &tag}
	if envd.VersionAtLeast(ver, envd.MinVersionStdinFlag) {
		withStdin := spec.Stdin != nil
		req.Stdin = &withStdin
	}
	stream, err := c.Start(runCtx, req, max(0, s.p.cfg.Keepalive))
	if err != nil {
		if runCtx.Err() != nil {
			s.killProcess(c, &envd.ProcessSelector{Tag: &tag})
		}
		return sandbox.Result{}, s.runErr(ctx, runCtx, cwd, err)
	}
	defer stream.Close()

	var (
		res            sandbox.Result
		outBuf, errBuf bytes.Buffer
		stdout, stderr io.Writer = &outBuf, &errBuf
		pid            uint32
		started        bool
		end            *envd.EndEvent
		werr           error // from Spec.Stdout/Stderr
		stdinDone      chan error
		stopStdin      context.CancelFunc = func() {}
	)
	if spec.Stdout != nil {
		stdout = spec.Stdout
	}
	if spec.Stderr != nil {
		stderr = spec.Stderr
	}
recv:
	for stream.Receive() {
		ev := stream.Msg().Event
		switch {
		case ev == nil:
		case ev.Start != nil:
			pid, started = ev.Start.Pid, true
			if spec.Stdin != nil && stdinDone == nil {
				var stdinCtx context.Context
				stdinCtx, stopStdin = context.WithCancel(runCtx)
				stdinDone = make(chan error, 1)
				go func() { stdinDone <- feedStdin(stdinCtx, c, pid, spec.Stdin) }()
			}
		case ev.Data != nil:
			if len(ev.Data.Stdout) > 0 {
				_, werr = stdout.Write(ev.Data.Stdout)
			}
			if werr == nil && len(ev.Data.Stderr) > 0 {
				_, werr = stderr.Write(ev.Data.Stderr)
			}
			if werr != nil {
				break recv
			}
		case ev.End != nil:
			end = ev.End
		}
	}
	serr := stream.Err()
	stopStdin()
	var inErr error
	if stdinDone != nil {
		inErr = <-stdinDone
	}
	if end == nil || serr != nil || werr != nil || runCtx.Err() != nil {
		// envd keeps a process whose stream went away; kill it so nothing
		// is left running once Run returns.
		sel := &envd.ProcessSelector{Tag: &tag}
		if started {
			sel = &envd.ProcessSelector{Pid: pid}
		}
		s.killProcess(c, sel)
	}
	switch {
	case runCtx.Err() != nil:
		return sandbox.Result{}, s.runErr(ctx, runCtx, cwd, context.Cause(runCtx))
	case werr != nil:
		return sandbox.Result{}, fmt.Errorf("%s run: write output: %w", s.p.cfg.Name, werr)
	case serr != nil:
		return sandbox.Result{}, s.runErr(ctx, runCtx, cwd, serr)
	case end == nil:
		return sandbox.Result{}, &workspace.ProviderError{Provider: s.p.cfg.Name, Op: "run",
			Message: "process stream ended without an end event"}
	case inErr != nil:
		return sandbox.Result{}, s.mapErr(ctx, "run stdin", "", inErr)
	}
	if spec.Stdout == nil {
		res.Stdout = outBuf.Bytes()
	}
	if spec.Stderr == nil {
		res.Stderr = errBuf.Bytes()
	}
	res.ExitCode = exitCode(end)
	return res, nil
}

// runErr maps a failed Run: the run's own deadline or the caller's
// cancellation first, then a missing cwd, then the general mapping.
func (s *Session) runErr(ctx, runCtx context.Context, cwd string, err error) error {
	if runCtx.Err() != nil && ctx.Err() == nil {
		return fmt.Errorf("%s run: timeout: %w", s.p.cfg.Name, context.DeadlineExceeded)
	}
	if ctx.Err() != nil {
		return workspace.ContextError(ctx, s.p.cfg.Name+" run", fmt.Errorf("%s run: %w", s.p.cfg.Name, err))
	}
	mapped := s.mapErr(ctx, "run", "", err)
	var pe *workspace.ProviderError
	if errors.As(mapped, &pe) && pe.Class == fs.ErrInvalid && strings.Contains(pe.Message, "cwd") {
		return &fs.PathError{Op: "run", Path: cwd, Err: &workspace.ProviderError{
			Provider: pe.Provider, Op: pe.Op, Code: pe.Code, Message: pe.Message, Class: fs.ErrNotExist}}
	}
	return mapped
}

// killProcess sends SIGKILL; not_found (already gone) is fine.
func (s *Session) killProcess(c *envd.Client, sel *envd.ProcessSelector) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = c.SendSignal(ctx, sel, envd.SignalKill)
}

// feedStdin copies r to the process's stdin and closes it at EOF. A
// process that already ended (not_found) is not an error: it did not want
// the rest. Like os/exec, it returns only when r.Read does.
func feedStdin(ctx context.Context, c *envd.Client, pid uint32, r io.Reader) error {
	buf := make([]byte, 64<<10)
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			if err := c.SendInput(ctx, pid, buf[:n]); err != nil {
				if isCode(err, codeNotFound) || ctx.Err() != nil {
					return nil
				}
				return err
			}
		}
		if rerr == io.EOF {
			err := c.CloseStdin(ctx, pid)
			if err != nil && (isCode(err, codeNotFound) || ctx.Err() != nil) {
				return nil
			}
			return err
		}
		if rerr != nil {
			return fmt.Errorf("read stdin: %w", rerr)
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

// linuxSignals maps Go's names for Linux signals (os.ProcessState's
// "signal: killed") to their numbers.
var linuxSignals = map[string]int{
	"hangup": 1, "interrupt": 2, "quit": 3, "illegal instruction": 4,
	"trace/breakpoint trap": 5, "aborted": 6, "bus error": 7,
	"floating point exception": 8, "killed": 9, "user defined signal 1": 10,
	"segmentation fault": 11, "user defined signal 2": 12, "broken pipe": 13,
	"alarm clock": 14, "terminated": 15,
}

// exitCode reads an EndEvent: exitCode is omitted when 0 and is -1 when a
// signal ended the process, which the contract reports as 128+N.
func exitCode(e *envd.EndEvent) int {
	if sig, ok := strings.CutPrefix(e.Status, "signal: "); ok {
		sig = strings.TrimSuffix(sig, " (core dumped)")
		if n, ok := linuxSignals[sig]; ok {
			return 128 + n
		}
	}
	if e.ExitCode != 0 {
		return int(e.ExitCode)
	}
	if n, ok := strings.CutPrefix(e.Status, "exit status "); ok {
		if v, err := strconv.Atoi(n); err == nil {
			return v
		}
	}
	return 0
}

// Read returns a file's contents.
func (s *Session) Read(ctx context.Context, p string) ([]byte, error) {
	rc, err := s.Download(ctx, p)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// Write replaces a file atomically (see Upload).
func (s *Session) Write(ctx context.Context, p string, data []byte) error {
	return s.Upload(ctx, p, bytes.NewReader(data))
}

// Upload streams r to a temporary file beside p and renames it over p, so
// readers never see a partial file and a failed upload leaves the old one.
// envd's own upload writes in place, hence the detour. A replaced file
// keeps its permission bits; a new one gets 0644. Changing bits needs a
// chmod process, since envd's filesystem service has no chmod.
func (s *Session) Upload(ctx context.Context, p string, r io.Reader) error {
	c, err := s.client(ctx)
	if err != nil {
		return err
	}
	abs, err := s.resolve(p)
	if err != nil {
		return err
	}
	if abs == "/" {
		return &fs.PathError{Op: "upload", Path: abs, Err: fs.ErrInvalid}
	}
	want := uint32(0o644)
	if old, err := c.Stat(ctx, abs); err == nil {
		if old.Type == envd.FileTypeDir {
			return &fs.PathError{Op: "upload", Path: abs, Err: fs.ErrInvalid}
		}
		if old.Type == envd.FileTypeFile && old.Mode != 0 {
			want = old.Mode & 0o7777
		}
	} else if !isCode(err, codeNotFound) {
		return s.mapErr(ctx, "upload", abs, err)
	}
	dir, base := path.Split(abs)
	tmp := path.Join(dir, "."+base+".esf-"+randomToken()[:12]+".tmp")
	fail := func(err error) error {
		ctx, cancel := context.WithTimeout(context.Background(), s.p.cfg.CleanupTimeout)
		defer cancel()
		_ = c.Remove(ctx, tmp)
		return err
	}
	if err := s.send(ctx, c, tmp, r); err != nil {
		return fail(s.mapErr(ctx, "upload", abs, err))
	}
	st, err := c.Stat(ctx, tmp)
	if err != nil {
		return fail(s.mapErr(ctx, "upload", abs, err))
	}
	if st.Mode != 0 && st.Mode&0o7777 != want {
		if err := s.chmod(ctx, c, tmp, want); err != nil {
			return fail(err)
		}
	}
	if _, err := c.Move(ctx, tmp, abs); err != nil {
		return fail(s.mapErr(ctx, "upload", abs, err))
	}
	return nil
}

// uploadGrace is how long an upload whose context ended may take to end
// its body cleanly before the request is cut.
const uploadGrace = 5 * time.Second

// send uploads r to tmp. Its request outlives ctx briefly: when ctx ends,
// the source stops and the body ends cleanly (see envd.Client.Upload), so
// envd is done with tmp by the time send returns and the caller's cleanup
// cannot race envd's writes. A server that does not answer within
// uploadGrace is cut off.
func (s *Session) send(ctx context.Context, c *envd.Client, tmp string, r io.Reader) error {
	reqCtx, release := outlive(ctx, uploadGrace)
	err := c.Upload(reqCtx, tmp, &ctxReader{ctx: ctx, r: r})
	release()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// ctxReader stops reading once ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// chmod runs chmod in the file's directory with a relative name, so the
// command means the same on any envd, whatever the path mapping.
func (s *Session) chmod(ctx context.Context, c *envd.Client, file string, mode uint32) error {
	dir, base := path.Split(file)
	no := false
	stream, err := c.Start(ctx, &envd.StartRequest{
		Process: &envd.ProcessConfig{Cmd: "chmod", Args: []string{strconv.FormatUint(uint64(mode), 8), "--", base}, Cwd: &dir},
		Stdin:   &no,
	}, 0)
	if err != nil {
		return s.mapErr(ctx, "chmod", file, err)
	}
	defer stream.Close()
	var end *envd.EndEvent
	for stream.Receive() {
		if ev := stream.Msg().Event; ev != nil && ev.End != nil {
			end = ev.End
		}
	}
	if err := stream.Err(); err != nil {
		return s.mapErr(ctx, "chmod", file, err)
	}
	if end == nil || exitCode(end) != 0 {
		return &workspace.ProviderError{Provider: s.p.cfg.Name, Op: "chmod", Message: "chmod " + file + " failed"}
	}
	return nil
}

// Download streams a file. A directory is fs.ErrInvalid.
func (s *Session) Download(ctx context.Context, p string) (io.ReadCloser, error) {
	c, err := s.client(ctx)
	if err != nil {
		return nil, err
	}
	abs, err := s.resolve(p)
	if err != nil {
		return nil, err
	}
	rc, err := c.Download(ctx, abs)
	if err != nil {
		return nil, s.mapErr(ctx, "download", abs, err)
	}
	return &download{rc: rc, ctx: ctx, op: s.p.cfg.Name + " download"}, nil
}

// download makes a transfer cut short by its context report that context.
type download struct {
	rc  io.ReadCloser
	ctx context.Context
	op  string
}

func (d *download) Read(p []byte) (int, error) {
	n, err := d.rc.Read(p)
	if err != nil && err != io.EOF {
		err = workspace.ContextError(d.ctx, d.op, err)
	}
	return n, err
}

func (d *download) Close() error { return d.rc.Close() }

// List returns a directory's children sorted by path, or a file alone.
func (s *Session) List(ctx context.Context, p string) ([]vfs.FileInfo, error) {
	c, err := s.client(ctx)
	if err != nil {
		return nil, err
	}
	abs, err := s.resolve(p)
	if err != nil {
		return nil, err
	}
	entries, err := c.ListDir(ctx, abs, 1)
	if isCode(err, codeInvalidArgument) {
		// Not a directory: list the file itself.
		e, serr := c.Stat(ctx, abs)
		if serr != nil {
			return nil, s.mapErr(ctx, "list", abs, serr)
		}
		fi := fileInfo(abs, e)
		fi.Path = abs
		return []vfs.FileInfo{fi}, nil
	}
	if err != nil {
		return nil, s.mapErr(ctx, "list", abs, err)
	}
	out := make([]vfs.FileInfo, 0, len(entries))
	for _, e := range entries {
		if e == nil {
			continue
		}
		out = append(out, fileInfo(abs, e))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

func fileInfo(dir string, e *envd.EntryInfo) vfs.FileInfo {
	p := e.Path
	if p == "" {
		p = path.Join(dir, e.Name)
	}
	fi := vfs.FileInfo{Path: path.Clean(p), Size: int64(e.Size), Mode: fs.FileMode(e.Mode) & fs.ModePerm}
	switch e.Type {
	case envd.FileTypeDir:
		fi.Mode |= fs.ModeDir
	case envd.FileTypeSymlink:
		fi.Mode |= fs.ModeSymlink
		if e.SymlinkTarget != nil {
			fi.Target = *e.SymlinkTarget
		}
	}
	if e.ModifiedTime != nil {
		fi.ModTime = *e.ModifiedTime
	}
	return fi
}

// Glob walks the tree with List; envd has no server-side glob.
func (s *Session) Glob(ctx context.Context, pattern string) ([]string, error) {
	if _, err := s.client(ctx); err != nil {
		return nil, err
	}
	abs, err := s.resolve(pattern)
	if err != nil {
		return nil, err
	}
	return vfs.GlobWalk(ctx, s, abs)
}

// Grep walks the tree with List and Read; envd has no server-side search.
func (s *Session) Grep(ctx context.Context, pattern string, opts vfs.GrepOptions) ([]vfs.Match, error) {
	if _, err := s.client(ctx); err != nil {
		return nil, err
	}
	p := opts.Path
	if p == "" {
		p = s.cwd
	}
	abs, err := s.resolve(p)
	if err != nil {
		return nil, err
	}
	opts.Path = abs
	return vfs.GrepWalk(ctx, s, pattern, opts)
}

// Delete removes a file or a whole tree. envd's Remove succeeds on a
// missing path, so a Stat first tells the contract's fs.ErrNotExist.
func (s *Session) Delete(ctx context.Context, p string) error {
	c, err := s.client(ctx)
	if err != nil {
		return err
	}
	abs, err := s.resolve(p)
	if err != nil {
		return err
	}
	if abs == "/" {
		return &fs.PathError{Op: "delete", Path: abs, Err: fs.ErrInvalid}
	}
	if _, err := c.Stat(ctx, abs); err != nil {
		return s.mapErr(ctx, "delete", abs, err)
	}
	if err := c.Remove(ctx, abs); err != nil {
		return s.mapErr(ctx, "delete", abs, err)
	}
	return nil
}

// Close kills the sandbox. Closing twice through this handle is a no-op;
// a sandbox already gone is ErrNotFound.
func (s *Session) Close(ctx context.Context) error {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return nil
	}
	err := s.p.api.kill(ctx, s.id)
	if err != nil && !errors.Is(err, workspace.ErrNotFound) {
		return err
	}
	s.mu.Lock()
	s.closed, s.env = true, nil
	s.mu.Unlock()
	return err
}

func (s *Session) open() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("%s session %s: %w", s.p.cfg.Name, s.id, workspace.ErrClosed)
	}
	return nil
}

// Pause snapshots the sandbox. The service answers 409 while the sandbox
// changes state and when it is already paused; both end, after polling,
// in "paused". Some services (CubeSandbox) answer 204 before the pause
// completes, so Pause also waits for the state to read "paused".
func (s *Session) Pause(ctx context.Context) error {
	if err := s.open(); err != nil {
		return err
	}
	for {
		st, err := s.p.api.pause(ctx, s.id)
		if err == nil {
			break
		}
		if st != http.StatusConflict {
			return err
		}
		sb, gerr := s.p.api.get(ctx, s.id)
		if gerr != nil {
			return gerr
		}
		if sb.State == "paused" {
			break
		}
		if err := sleep(ctx, s.p.cfg.PollInterval); err != nil {
			return workspace.ContextError(ctx, s.p.cfg.Name+" pause", err)
		}
	}
	for {
		sb, err := s.p.api.get(ctx, s.id)
		if err != nil {
			return err
		}
		if sb.State == "paused" {
			s.setSandbox(sb)
			return nil
		}
		if err := sleep(ctx, s.p.cfg.PollInterval); err != nil {
			return workspace.ContextError(ctx, s.p.cfg.Name+" pause", err)
		}
	}
}

// Resume connects to the sandbox, which resumes it when paused, and
// adopts the fresh tokens. A 409 (still pausing) is waited out.
func (s *Session) Resume(ctx context.Context) error {
	if err := s.open(); err != nil {
		return err
	}
	for {
		sb, st, err := s.p.api.connect(ctx, s.id, s.timeout)
		if err == nil {
			if sb.SandboxID == "" {
				sb.SandboxID = s.id
			}
			sb.State = "running"
			s.setSandbox(sb)
			return nil
		}
		if st != http.StatusConflict {
			return err
		}
		if err := sleep(ctx, s.p.cfg.PollInterval); err != nil {
			return workspace.ContextError(ctx, s.p.cfg.Name+" resume", err)
		}
	}
}

// Refresh extends the sandbox's lifetime to at least d from now, d at most
// an hour (E2B-specific; not part of the workspace contract).
func (s *Session) Refresh(ctx context.Context, d time.Duration) error {
	if err := s.open(); err != nil {
		return err
	}
	return s.p.api.refresh(ctx, s.id, d)
}

// SetTimeout makes the sandbox expire d from now (E2B-specific; not part
// of the workspace contract).
func (s *Session) SetTimeout(ctx context.Context, d time.Duration) error {
	if err := s.open(); err != nil {
		return err
	}
	return s.p.api.setTimeout(ctx, s.id, d)
}
