package daytona

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime/multipart"
	"net/http"
	"net/url"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/esf-dev/esf/vfs"
	"github.com/esf-dev/esf/workspace"
)

// resolve applies the contract's path rule against the session's home and
// working directory.
func (s *Session) resolve(ctx context.Context, op, p string) (string, error) {
	home, cwd, err := s.ready(ctx, op)
	if err != nil {
		return "", err
	}
	return vfs.Resolve(home, cwd, p)
}

// fileInfo is the toolbox's FileInfo. The daemon stats with os.Stat, so a
// symlink is reported as what it points to and never as a link.
type fileInfo struct {
	Name        string `json:"name"`
	Size        int64  `json:"size"`
	Mode        string `json:"mode"`        // Go fs.FileMode.String(), e.g. "drwxr-xr-x"
	Permissions string `json:"permissions"` // "0644"
	IsDir       bool   `json:"isDir"`
	ModifiedAt  string `json:"modifiedAt"` // RFC 3339
}

func (fi *fileInfo) vfs(p string) vfs.FileInfo {
	out := vfs.FileInfo{Path: p, Size: fi.Size, Mode: fi.mode()}
	if t, err := time.Parse(time.RFC3339Nano, fi.ModifiedAt); err == nil {
		out.ModTime = t
	}
	return out
}

// mode reads Go's FileMode string back ("dalTLDpSugct?" type letters, then
// nine rwx characters), falling back to the octal permissions.
func (fi *fileInfo) mode() fs.FileMode {
	const letters = "dalTLDpSugct?"
	if s := fi.Mode; len(s) >= 10 {
		typ, rwx := s[:len(s)-9], s[len(s)-9:]
		var m fs.FileMode
		ok := true
		if typ != "-" {
			for _, c := range typ {
				i := strings.IndexRune(letters, c)
				if i < 0 {
					ok = false
					break
				}
				m |= 1 << uint(31-i)
			}
		}
		for i, c := range rwx {
			if c != '-' {
				m |= 1 << uint(8-i)
			}
		}
		if ok && m.IsDir() == fi.IsDir {
			return m
		}
	}
	perm, _ := strconv.ParseUint(fi.Permissions, 8, 32)
	m := fs.FileMode(perm) & fs.ModePerm
	if fi.IsDir {
		m |= fs.ModeDir
	}
	return m
}

func (s *Session) stat(ctx context.Context, op, abs string) (*fileInfo, error) {
	var fi fileInfo
	if err := s.tbJSON(ctx, op, request{method: http.MethodGet, url: "/files/info", query: url.Values{"path": {abs}}}, &fi); err != nil {
		return nil, fsError(op, abs, err)
	}
	return &fi, nil
}

// isDir answers the daemon's bare 400s, which mean "wrong kind of file"
// as often as anything else.
func (s *Session) isDir(ctx context.Context, op, abs string) (bool, error) {
	fi, err := s.stat(ctx, op, abs)
	if err != nil {
		return false, err
	}
	return fi.IsDir, nil
}

// Read returns a regular file's contents.
func (s *Session) Read(ctx context.Context, p string) ([]byte, error) {
	rc, err := s.open(ctx, "read", p)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// Download streams a regular file; the caller closes the reader.
func (s *Session) Download(ctx context.Context, p string) (io.ReadCloser, error) {
	return s.open(ctx, "download", p)
}

func (s *Session) open(ctx context.Context, op, p string) (io.ReadCloser, error) {
	abs, err := s.resolve(ctx, op, p)
	if err != nil {
		return nil, err
	}
	resp, err := s.tb(ctx, op, request{method: http.MethodGet, url: "/files/download", query: url.Values{"path": {abs}}})
	if err != nil {
		if statusOf(err) == http.StatusBadRequest {
			if dir, serr := s.isDir(ctx, op, abs); serr == nil && dir {
				return nil, &fs.PathError{Op: op, Path: abs, Err: fmt.Errorf("is a directory: %w", fs.ErrInvalid)}
			}
		}
		return nil, fsError(op, abs, err)
	}
	return &download{rc: resp.Body, ctx: ctx, op: op}, nil
}

// download makes a transfer cut short by ctx report ctx's error.
type download struct {
	rc  io.ReadCloser
	ctx context.Context
	op  string
}

func (d *download) Read(p []byte) (int, error) {
	n, err := d.rc.Read(p)
	if err != nil && err != io.EOF {
		err = workspace.ContextError(d.ctx, "daytona "+d.op, err)
	}
	return n, err
}

func (d *download) Close() error { return d.rc.Close() }

// Write replaces path with data; see Upload.
func (s *Session) Write(ctx context.Context, p string, data []byte) error {
	return s.upload(ctx, "write", p, bytes.NewReader(data))
}

// Upload streams r to a temporary sibling of path (upload-v2 creates the
// parent directories), gives it 0644 or the replaced file's permissions,
// and renames it into place: Daytona's upload writes in place and its move
// refuses an existing destination, so an existing file is replaced with
// `mv -f` (rename(2)) through /process/execute. A failed upload removes the
// temporary file and leaves path as it was. Upload returns only once a
// pending r.Read has returned: a reader that blocks forever blocks it.
func (s *Session) Upload(ctx context.Context, p string, r io.Reader) error {
	return s.upload(ctx, "upload", p, r)
}

func (s *Session) upload(ctx context.Context, op, p string, r io.Reader) error {
	abs, err := s.resolve(ctx, op, p)
	if err != nil {
		return err
	}
	if abs == "/" {
		return &fs.PathError{Op: op, Path: abs, Err: fs.ErrInvalid}
	}
	mode, existed := "0644", false
	switch fi, err := s.stat(ctx, op, abs); {
	case err == nil && fi.IsDir:
		return &fs.PathError{Op: op, Path: abs, Err: fmt.Errorf("is a directory: %w", fs.ErrInvalid)}
	case err == nil:
		existed = true
		mode = fmt.Sprintf("%04o", fi.mode().Perm())
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}
	dir, base := path.Split(abs)
	if len(base) > 100 {
		base = base[:100]
	}
	tmp := path.Join(dir, ".esf-"+randHex(6)+"-"+base+".upload")
	placed := false
	defer func() {
		if !placed {
			s.removeQuietly(ctx, tmp)
		}
	}()
	if err := s.send(ctx, op, tmp, r); err != nil {
		return err
	}
	q := url.Values{"path": {tmp}, "mode": {mode}}
	if err := s.tbJSON(ctx, op, request{method: http.MethodPost, url: "/files/permissions", query: q}, nil); err != nil {
		return fsError(op, abs, err)
	}
	if !existed {
		q := url.Values{"source": {tmp}, "destination": {abs}}
		err := s.tbJSON(ctx, op, request{method: http.MethodPost, url: "/files/move", query: q}, nil)
		if err == nil {
			placed = true
			return nil
		}
		if statusOf(err) != http.StatusConflict { // 409: it appeared meanwhile
			return fsError(op, abs, err)
		}
	}
	if err := s.execute(ctx, op, "mv -f -- "+shellQuote(tmp)+" "+shellQuote(abs)); err != nil {
		return &fs.PathError{Op: op, Path: abs, Err: err}
	}
	placed = true
	return nil
}

// send streams r as the multipart field "file" of upload-v2 through a pipe:
// the body is produced while it is sent, never held whole.
//
// A failed source or a cancelled ctx does not tear the connection down: the
// body just ends, without multipart's closing boundary, so the toolbox
// rejects the upload and answers. When send returns, the toolbox has
// stopped writing the temporary file and the caller can delete it without
// racing the server. Should the toolbox not answer within uploadGrace of
// the cancellation, the request is aborted.
func (s *Session) send(ctx context.Context, op, dst string, r io.Reader) error {
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	ctype := mw.FormDataContentType()
	src := &sourceReader{r: r}
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		part, err := mw.CreateFormFile("file", path.Base(dst))
		if err == nil {
			_, err = io.Copy(part, src)
		}
		if err == nil {
			mw.Close()
		}
		pw.Close() // after an error: a truncated body
	}()
	reqCtx, abort := context.WithCancel(context.WithoutCancel(ctx))
	defer abort()
	answered := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-ctx.Done():
			pw.Close()
			t := time.NewTimer(uploadGrace)
			defer t.Stop()
			select {
			case <-t.C:
				abort()
			case <-answered:
			}
		case <-answered:
		}
	}()
	rq := request{method: http.MethodPost, url: "/files/upload-v2", query: url.Values{"path": {dst}}, stream: pr, ctype: ctype}
	resp, err := s.tb(reqCtx, op, rq)
	close(answered)
	<-watched
	pr.CloseWithError(errUploadEnded)
	<-copied
	if resp != nil {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
	}
	switch {
	case ctx.Err() != nil:
		return workspace.ContextError(ctx, "daytona "+op, ctx.Err())
	case src.err != nil:
		return fmt.Errorf("daytona %s %s: read source: %w", op, dst, src.err)
	case err != nil:
		return fsError(op, dst, err)
	}
	return nil
}

// uploadGrace is how long a cancelled upload waits for the toolbox to
// reject its truncated body before dropping the connection.
const uploadGrace = 5 * time.Second

var errUploadEnded = errors.New("upload request ended")

// sourceReader remembers the caller's read error, to tell it apart from a
// failed request.
type sourceReader struct {
	r   io.Reader
	err error
}

func (s *sourceReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && err != io.EOF {
		s.err = err
	}
	return n, err
}

// execute runs a short helper command with /process/execute (one request;
// its output is combined and it cannot be cancelled, fine for mv).
func (s *Session) execute(ctx context.Context, op, command string) error {
	var out struct {
		ExitCode int    `json:"exitCode"`
		Result   string `json:"result"`
	}
	rq := request{method: http.MethodPost, url: "/process/execute", json: map[string]any{"command": command, "timeout": 300}}
	if err := s.tbJSON(ctx, op, rq, &out); err != nil {
		return toolboxError(op, err)
	}
	if out.ExitCode != 0 {
		return &workspace.ProviderError{Provider: providerName, Op: op,
			Message: fmt.Sprintf("%s: exit %d: %s", command, out.ExitCode, strings.TrimSpace(out.Result))}
	}
	return nil
}

func (s *Session) removeQuietly(ctx context.Context, p string) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.p.cfg.CleanupTimeout)
	defer cancel()
	q := url.Values{"path": {p}, "recursive": {"true"}}
	if resp, err := s.tb(cctx, "cleanup", request{method: http.MethodDelete, url: "/files", query: q}); err == nil {
		resp.Body.Close()
	}
}

// List returns the entries directly inside a directory, or a file alone.
func (s *Session) List(ctx context.Context, p string) ([]vfs.FileInfo, error) {
	abs, err := s.resolve(ctx, "list", p)
	if err != nil {
		return nil, err
	}
	var infos []fileInfo
	err = s.tbJSON(ctx, "list", request{method: http.MethodGet, url: "/files", query: url.Values{"path": {abs}}}, &infos)
	if err != nil {
		if statusOf(err) == http.StatusBadRequest { // the daemon cannot ReadDir a file
			if fi, serr := s.stat(ctx, "list", abs); serr == nil && !fi.IsDir {
				return []vfs.FileInfo{fi.vfs(abs)}, nil
			}
		}
		return nil, fsError("list", abs, err)
	}
	out := make([]vfs.FileInfo, 0, len(infos))
	for i := range infos {
		if infos[i].Name == "" || strings.Contains(infos[i].Name, "/") {
			continue
		}
		out = append(out, infos[i].vfs(path.Join(abs, infos[i].Name)))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

// Glob walks the tree with List: the toolbox's /files/search matches base
// names only, without "**".
func (s *Session) Glob(ctx context.Context, pattern string) ([]string, error) {
	abs, err := s.resolve(ctx, "glob", pattern)
	if err != nil {
		return nil, err
	}
	return vfs.GlobWalk(ctx, s, abs)
}

// Grep walks the tree with List and Read: the toolbox's /files/find has no
// case folding, base-name filter, limit or binary-file rule.
func (s *Session) Grep(ctx context.Context, pattern string, opts vfs.GrepOptions) ([]vfs.Match, error) {
	home, cwd, err := s.ready(ctx, "grep")
	if err != nil {
		return nil, err
	}
	root := cwd
	if opts.Path != "" {
		if root, err = vfs.Resolve(home, cwd, opts.Path); err != nil {
			return nil, err
		}
	}
	opts.Path = root
	return vfs.GrepWalk(ctx, s, pattern, opts)
}

// Delete removes a file or a directory tree.
func (s *Session) Delete(ctx context.Context, p string) error {
	abs, err := s.resolve(ctx, "delete", p)
	if err != nil {
		return err
	}
	if abs == "/" {
		return &fs.PathError{Op: "delete", Path: abs, Err: fs.ErrInvalid}
	}
	q := url.Values{"path": {abs}, "recursive": {"true"}}
	resp, err := s.tb(ctx, "delete", request{method: http.MethodDelete, url: "/files", query: q})
	if err != nil {
		return fsError("delete", abs, err)
	}
	resp.Body.Close()
	return nil
}
