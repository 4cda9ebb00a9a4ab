package opensandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"

	"github.com/esf-dev/esf/sandbox"
	"github.com/esf-dev/esf/vfs"
	"github.com/esf-dev/esf/workspace"
)

// openFile resolves p and checks it is something a transfer can read: a
// directory is fs.ErrInvalid here, because execd's download of one fails
// half-way (headers sent, then EISDIR) rather than with a clean status.
func (s *session) openFile(ctx context.Context, op, p string) (string, error) {
	if err := s.begin(op); err != nil {
		return "", err
	}
	abs, err := s.resolve(ctx, p)
	if err != nil {
		return "", fileError(op, p, err)
	}
	fi, err := s.stat(ctx, abs)
	if err != nil {
		return "", fileError(op, abs, unwrapPath(err))
	}
	if fi.Type == "directory" {
		return "", &fs.PathError{Op: op, Path: abs, Err: fmt.Errorf("is a directory: %w", fs.ErrInvalid)}
	}
	return abs, nil
}

// unwrapPath drops an inner *fs.PathError so the outer one names the
// operation the caller asked for.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// Read returns a file's contents.
func (s *session) Read(ctx context.Context, p string) ([]byte, error) {
	abs, err := s.openFile(ctx, "read", p)
	if err != nil {
		return nil, err
	}
	return s.readAll(ctx, abs)
}

func (s *session) readAll(ctx context.Context, abs string) ([]byte, error) {
	resp, err := s.download(ctx, abs)
	if err != nil {
		return nil, fileError("read", abs, unwrapPath(err))
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fileError("read", abs, transportError(ctx, "read", err))
	}
	return data, nil
}

// Download opens a file for streaming; ending ctx aborts the transfer.
func (s *session) Download(ctx context.Context, p string) (io.ReadCloser, error) {
	abs, err := s.openFile(ctx, "download", p)
	if err != nil {
		return nil, err
	}
	resp, err := s.download(ctx, abs)
	if err != nil {
		return nil, err
	}
	return &downloadBody{ctx: ctx, path: abs, rc: resp.Body}, nil
}

// downloadBody makes a read cut short by ctx match ctx's error.
type downloadBody struct {
	ctx  context.Context
	path string
	rc   io.ReadCloser
}

func (b *downloadBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		err = fileError("download", b.path, transportError(b.ctx, "download", err))
	}
	return n, err
}

func (b *downloadBody) Close() error { return b.rc.Close() }

// Write replaces p with data atomically (see Upload).
func (s *session) Write(ctx context.Context, p string, data []byte) error {
	return s.put(ctx, "write", p, bytes.NewReader(data))
}

// Upload streams r into p and replaces p atomically once r is exhausted.
// execd writes uploads in place (truncate, copy), so the data goes to a
// temporary sibling first and is then renamed over p. execd's own rename
// refuses an existing destination; replacing one is a "mv -f" run through
// execd, which is rename(2) and so atomic. A new file gets 0644, an
// existing one keeps its permission bits (not its owner: execd chowns
// uploads to its own user).
func (s *session) Upload(ctx context.Context, p string, r io.Reader) error {
	return s.put(ctx, "upload", p, r)
}

func (s *session) put(ctx context.Context, op, p string, r io.Reader) error {
	if err := s.begin(op); err != nil {
		return err
	}
	abs, err := s.resolve(ctx, p)
	if err != nil {
		return fileError(op, p, err)
	}
	if abs == "/" {
		return &fs.PathError{Op: op, Path: abs, Err: fs.ErrInvalid}
	}
	mode, exists := fs.FileMode(0o644), false
	switch fi, err := s.stat(ctx, abs); {
	case err == nil && fi.Type == "directory":
		return &fs.PathError{Op: op, Path: abs, Err: fmt.Errorf("is a directory: %w", fs.ErrInvalid)}
	case err == nil:
		exists = true
		if fi.Type == "file" {
			mode = fi.perm()
		}
	case !errors.Is(err, fs.ErrNotExist):
		return fileError(op, abs, unwrapPath(err))
	}
	suffix, err := randomHex(6)
	if err != nil {
		return err
	}
	// A hidden sibling, on the same filesystem so the rename is atomic;
	// the base is cut so the name stays within NAME_MAX.
	base := path.Base(abs)
	tmp := path.Join(path.Dir(abs), "."+base[:min(len(base), 200)]+".esf-"+suffix)
	if err := s.upload(ctx, tmp, mode, r); err != nil {
		s.dropTemp(ctx, tmp)
		return fileError(op, abs, unwrapPath(err))
	}
	if !exists {
		err = s.move(ctx, tmp, abs)
		if err == nil {
			return nil
		}
		// Someone created p meanwhile (execd refuses to overwrite), or the
		// move failed for good; mv -f settles the first and reports the
		// second.
	}
	if err := s.replace(ctx, tmp, abs); err != nil {
		s.dropTemp(ctx, tmp)
		return fileError(op, abs, err)
	}
	return nil
}

// replace renames tmp over dst with mv -f, run from "/" with relative
// paths: the same command then also works where commands see the sandbox
// root as a directory of the host (the offline fake's Unisolated mode).
func (s *session) replace(ctx context.Context, tmp, dst string) error {
	cmd := "mv -f -- " + shQuote(tmp[1:]) + " " + shQuote(dst[1:])
	var stderr bytes.Buffer
	res, err := s.Run(ctx, sandbox.Spec{WorkDir: "/", Stderr: &stderr}, cmd)
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return &workspace.ProviderError{Provider: providerName, Op: "rename", Code: fmt.Sprint(res.ExitCode),
			Message: string(bytes.TrimSpace(stderr.Bytes())), Class: workspace.ErrProvider}
	}
	return nil
}

// dropTemp removes a half-written temporary, on a fresh context when ctx
// ended (that is usually why it is half-written).
func (s *session) dropTemp(ctx context.Context, tmp string) {
	cctx, cancel := s.p.cleanupCtx(ctx)
	defer cancel()
	_ = s.removeAll(cctx, tmp)
}

// List returns a directory's children sorted by path, or a file alone.
// execd lists with depth 1 and refuses a symlink as the directory, so a
// symlink is listed as itself.
func (s *session) List(ctx context.Context, p string) ([]vfs.FileInfo, error) {
	if err := s.begin("list"); err != nil {
		return nil, err
	}
	abs, err := s.resolve(ctx, p)
	if err != nil {
		return nil, fileError("list", p, err)
	}
	return s.list(ctx, abs)
}

func (s *session) list(ctx context.Context, abs string) ([]vfs.FileInfo, error) {
	fis, err := s.listDir(ctx, abs)
	if errors.Is(err, errNotDir) {
		fi, err := s.stat(ctx, abs)
		if err != nil {
			return nil, fileError("list", abs, unwrapPath(err))
		}
		return []vfs.FileInfo{fi.vfs()}, nil
	}
	if err != nil {
		return nil, err
	}
	out := make([]vfs.FileInfo, 0, len(fis))
	for _, fi := range fis {
		v := fi.vfs()
		v.Path = path.Clean(v.Path)
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

// Glob walks with vfs.GlobWalk: execd's /files/search matches a pattern
// against base names only and skips directories, which is not Glob.
func (s *session) Glob(ctx context.Context, pattern string) ([]string, error) {
	if err := s.begin("glob"); err != nil {
		return nil, err
	}
	abs, err := s.resolve(ctx, pattern)
	if err != nil {
		return nil, fileError("glob", pattern, err)
	}
	return vfs.GlobWalk(ctx, walker{s}, abs)
}

// Grep walks with vfs.GrepWalk; there is no server-side grep.
func (s *session) Grep(ctx context.Context, pattern string, opts vfs.GrepOptions) ([]vfs.Match, error) {
	if err := s.begin("grep"); err != nil {
		return nil, err
	}
	p := opts.Path
	if p == "" {
		p = "."
	}
	abs, err := s.resolve(ctx, p)
	if err != nil {
		return nil, fileError("grep", p, err)
	}
	opts.Path = abs
	return vfs.GrepWalk(ctx, walker{s}, pattern, opts)
}

// walker feeds the vfs walks. Its paths are absolute already, and Read
// skips the stat Read would make: the walk only reads what List called a
// regular file.
type walker struct{ s *session }

func (w walker) List(ctx context.Context, p string) ([]vfs.FileInfo, error) {
	if err := w.s.begin("list"); err != nil {
		return nil, err
	}
	return w.s.list(ctx, p)
}

func (w walker) Read(ctx context.Context, p string) ([]byte, error) {
	if err := w.s.begin("read"); err != nil {
		return nil, err
	}
	return w.s.readAll(ctx, p)
}

// Delete removes a file, a symlink or a directory tree. execd's file delete
// succeeds on missing paths and refuses directories, so the entry is looked
// at first; everything but a regular file goes through rm -rf, which does
// not follow symlinks.
func (s *session) Delete(ctx context.Context, p string) error {
	if err := s.begin("delete"); err != nil {
		return err
	}
	abs, err := s.resolve(ctx, p)
	if err != nil {
		return fileError("delete", p, err)
	}
	if abs == "/" {
		return &fs.PathError{Op: "delete", Path: abs, Err: fs.ErrInvalid}
	}
	fi, err := s.stat(ctx, abs)
	if err != nil {
		return fileError("delete", abs, unwrapPath(err))
	}
	if fi.Type == "file" {
		err = s.removeFile(ctx, abs)
	} else {
		err = s.removeAll(ctx, abs)
	}
	if err != nil {
		return fileError("delete", abs, unwrapPath(err))
	}
	return nil
}
