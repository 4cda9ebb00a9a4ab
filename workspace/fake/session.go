package fake

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"sync/atomic"

	"github.com/esf-dev/esf/sandbox"
	"github.com/esf-dev/esf/vfs"
	"github.com/esf-dev/esf/workspace"
)

// Session is one handle to a fake session.
type Session struct {
	p      *Provider
	st     *state
	closed atomic.Bool
}

var (
	_ workspace.Session = (*Session)(nil)
	_ workspace.Pauser  = (*Session)(nil)
)

// ID implements workspace.Session.
func (s *Session) ID() string { return s.st.id }

// begin runs the checks every Run and file operation starts with, in the
// order a remote provider would fail them: the handle, the caller's ctx,
// the fault hook (the "network"), then the session's state.
func (s *Session) begin(ctx context.Context, op Op) error {
	if s.closed.Load() {
		return errClosed(op, s.st.id)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("fake %s %s: %w", op, s.st.id, err)
	}
	if err := s.p.callFault(ctx, op, s.st.id); err != nil {
		return fmt.Errorf("fake %s %s: %w", op, s.st.id, err)
	}
	return s.p.usable(s.st, op)
}

// resolve applies the path rule of vfs.Resolve for this session.
func (s *Session) resolve(p string) (string, error) {
	return vfs.Resolve(s.st.home, s.st.cwd, p)
}

// Read implements vfs.Backend.
func (s *Session) Read(ctx context.Context, p string) ([]byte, error) {
	if err := s.begin(ctx, OpRead); err != nil {
		return nil, err
	}
	abs, err := s.resolve(p)
	if err != nil {
		return nil, err
	}
	n, err := s.st.tree.file("read", abs)
	if err != nil {
		return nil, err
	}
	return n.data.bytes(), nil
}

// Write implements vfs.Backend.
func (s *Session) Write(ctx context.Context, p string, data []byte) error {
	if err := s.begin(ctx, OpWrite); err != nil {
		return err
	}
	abs, err := s.resolve(p)
	if err != nil {
		return err
	}
	return s.st.tree.put("write", abs, contentOf(slices.Clone(data)), s.p.now(), true)
}

// List implements vfs.Backend.
func (s *Session) List(ctx context.Context, p string) ([]vfs.FileInfo, error) {
	if err := s.begin(ctx, OpList); err != nil {
		return nil, err
	}
	abs, err := s.resolve(p)
	if err != nil {
		return nil, err
	}
	return s.st.tree.list("list", abs)
}

// Glob implements vfs.Backend with vfs.GlobWalk.
func (s *Session) Glob(ctx context.Context, pattern string) ([]string, error) {
	if err := s.begin(ctx, OpGlob); err != nil {
		return nil, err
	}
	abs, err := s.resolve(pattern)
	if err != nil {
		return nil, err
	}
	return vfs.GlobWalk(ctx, view{s.st.tree}, abs)
}

// Grep implements vfs.Backend with vfs.GrepWalk.
func (s *Session) Grep(ctx context.Context, pattern string, opts vfs.GrepOptions) ([]vfs.Match, error) {
	if err := s.begin(ctx, OpGrep); err != nil {
		return nil, err
	}
	if opts.Path == "" {
		opts.Path = s.st.cwd
	} else {
		abs, err := s.resolve(opts.Path)
		if err != nil {
			return nil, err
		}
		opts.Path = abs
	}
	return vfs.GrepWalk(ctx, view{s.st.tree}, pattern, opts)
}

// Delete implements vfs.Backend.
func (s *Session) Delete(ctx context.Context, p string) error {
	if err := s.begin(ctx, OpDelete); err != nil {
		return err
	}
	abs, err := s.resolve(p)
	if err != nil {
		return err
	}
	return s.st.tree.remove("delete", abs)
}

// Upload implements workspace.Session: the stream is collected apart and
// installed only after io.EOF, with ctx still live and the session still
// usable.
func (s *Session) Upload(ctx context.Context, p string, r io.Reader) error {
	if err := s.begin(ctx, OpUpload); err != nil {
		return err
	}
	abs, err := s.resolve(p)
	if err != nil {
		return err
	}
	// Fail before reading a byte when the target can never be written.
	if n, ok := s.st.tree.get(abs); ok && n.mode.IsDir() {
		return &fs.PathError{Op: "upload", Path: abs, Err: fmt.Errorf("is a directory: %w", fs.ErrInvalid)}
	}
	c, err := readContent(ctx, r)
	if err != nil {
		return fmt.Errorf("fake upload %s: %w", abs, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("fake upload %s: %w", abs, err)
	}
	if err := s.p.usable(s.st, OpUpload); err != nil {
		return err
	}
	return s.st.tree.put("upload", abs, c, s.p.now(), true)
}

// Download implements workspace.Session. The reader streams the file as it
// was when Download was called, whatever replaces it later; cancelling ctx
// fails the reader's next Read.
func (s *Session) Download(ctx context.Context, p string) (io.ReadCloser, error) {
	if err := s.begin(ctx, OpDownload); err != nil {
		return nil, err
	}
	abs, err := s.resolve(p)
	if err != nil {
		return nil, err
	}
	n, err := s.st.tree.file("download", abs)
	if err != nil {
		return nil, err
	}
	return &contentReader{ctx: ctx, chunks: n.data.chunks}, nil
}

// Run implements sandbox.Sandbox with the fake shell (see sh.go for what it
// understands). Stdin is supported.
func (s *Session) Run(ctx context.Context, spec sandbox.Spec, command string) (sandbox.Result, error) {
	if err := s.begin(ctx, OpRun); err != nil {
		return sandbox.Result{}, err
	}
	cwd := s.st.cwd
	if spec.WorkDir != "" {
		abs, err := s.resolve(spec.WorkDir)
		if err != nil {
			return sandbox.Result{}, err
		}
		n, ok := s.st.tree.get(abs)
		if !ok {
			return sandbox.Result{}, &fs.PathError{Op: "run", Path: abs, Err: fs.ErrNotExist}
		}
		if !n.mode.IsDir() {
			return sandbox.Result{}, &fs.PathError{Op: "run", Path: abs, Err: fmt.Errorf("not a directory: %w", fs.ErrInvalid)}
		}
		cwd = abs
	}
	if spec.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, spec.Timeout)
		defer cancel()
	}
	var res sandbox.Result
	var outBuf, errBuf bytes.Buffer
	stdout, stderr := spec.Stdout, spec.Stderr
	if stdout == nil {
		stdout = &outBuf
	}
	if stderr == nil {
		stderr = &errBuf
	}
	env := make(map[string]string, len(s.st.env)+len(spec.Env)+1)
	for k, v := range s.st.env {
		env[k] = v
	}
	for k, v := range spec.Env {
		env[k] = v
	}
	env["PWD"] = cwd
	sh := &shell{
		ctx:   ctx,
		tree:  s.st.tree,
		now:   s.p.now,
		home:  s.st.home,
		cwd:   cwd,
		env:   env,
		stdin: spec.Stdin,
		pid:   2, // sh's own pid in a fresh sandbox, give or take init
	}
	res.ExitCode = sh.run(command, stdout, stderr)
	// A command stopped by ctx (cancelled or its Timeout) is an error, not
	// a Result: ctx.Err() is context.Canceled when the caller cancelled
	// and context.DeadlineExceeded when either deadline passed.
	if err := ctx.Err(); err != nil {
		return sandbox.Result{}, fmt.Errorf("fake run %s: %w", s.st.id, err)
	}
	if spec.Stdout == nil {
		res.Stdout = outBuf.Bytes()
	}
	if spec.Stderr == nil {
		res.Stderr = errBuf.Bytes()
	}
	return res, nil
}

// Pause implements workspace.Pauser.
func (s *Session) Pause(ctx context.Context) error {
	return s.setPaused(ctx, OpPause, true)
}

// Resume implements workspace.Pauser. Spec.Timeout starts again from now.
func (s *Session) Resume(ctx context.Context) error {
	return s.setPaused(ctx, OpResume, false)
}

func (s *Session) setPaused(ctx context.Context, op Op, paused bool) error {
	if s.closed.Load() {
		return errClosed(op, s.st.id)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("fake %s %s: %w", op, s.st.id, err)
	}
	if err := s.p.callFault(ctx, op, s.st.id); err != nil {
		return fmt.Errorf("fake %s %s: %w", op, s.st.id, err)
	}
	p := s.p
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sweepLocked()
	if s.st.gone {
		return notFound(op, s.st.id)
	}
	if s.st.paused && !paused && s.st.timeout > 0 {
		s.st.deadline = p.now().Add(s.st.timeout)
	}
	s.st.paused = paused
	return nil
}

// Close implements workspace.Session. A Close that fails before acting
// (ctx already ended, a fault) leaves the handle open so it can be retried.
func (s *Session) Close(ctx context.Context) error {
	if s.closed.Load() {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("fake close %s: %w", s.st.id, err)
	}
	if err := s.p.callFault(ctx, OpClose, s.st.id); err != nil {
		return fmt.Errorf("fake close %s: %w", s.st.id, err)
	}
	if !s.closed.CompareAndSwap(false, true) {
		return nil
	}
	if !s.p.remove(s.st.id) {
		return notFound(OpClose, s.st.id)
	}
	return nil
}
