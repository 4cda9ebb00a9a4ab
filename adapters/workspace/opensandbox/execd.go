package opensandbox

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/esf-dev/esf/vfs"
	"github.com/esf-dev/esf/workspace"
)

const execdTokenHeader = "X-EXECD-ACCESS-TOKEN"

// execdEndpoint is a resolved execd: its base URL and the headers every
// call must carry (routing and access tokens from the endpoint lookup).
type execdEndpoint struct {
	base   string
	header http.Header
}

// endpointFor resolves (once) the execd endpoint of s's sandbox.
func (s *session) endpointFor(ctx context.Context) (*execdEndpoint, error) {
	s.r.mu.Lock()
	ep := s.r.ep
	s.r.mu.Unlock()
	if ep != nil {
		return ep, nil
	}
	ep, err := s.p.endpoint(ctx, s.r.id)
	if err != nil {
		return nil, err
	}
	s.r.mu.Lock()
	s.r.ep = ep
	s.r.mu.Unlock()
	return ep, nil
}

// execd sends c to execd at path. A transport failure forgets the endpoint
// so the next call looks it up again (a runtime may move a resumed sandbox).
func (s *session) execd(ctx context.Context, c call, path string) (*http.Response, error) {
	ep, err := s.endpointFor(ctx)
	if err != nil {
		return nil, err
	}
	c.url = ep.base + path
	c.surface = execdAPI
	h := ep.header.Clone()
	for k, vs := range c.header {
		h[k] = vs
	}
	c.header = h
	resp, err := s.p.send(ctx, c)
	var pe *workspace.ProviderError
	if err != nil && (!errors.As(err, &pe) || pe.Status == 0 || pe.Status == http.StatusBadGateway) {
		s.r.mu.Lock()
		if s.r.ep == ep {
			s.r.ep = nil
		}
		s.r.mu.Unlock()
	}
	return resp, err
}

// fileInfo is execd's FileInfo. mode is the permission bits written as
// octal digits in a decimal number (0755 arrives as 755).
type fileInfo struct {
	Path       string    `json:"path"`
	Type       string    `json:"type"`
	Size       int64     `json:"size"`
	ModifiedAt time.Time `json:"modified_at"`
	Mode       int       `json:"mode"`
}

func (fi fileInfo) perm() fs.FileMode {
	m, err := strconv.ParseUint(strconv.Itoa(fi.Mode), 8, 32)
	if err != nil {
		return 0
	}
	return fs.FileMode(m) & fs.ModePerm
}

func (fi fileInfo) vfs() vfs.FileInfo {
	mode := fi.perm()
	switch fi.Type {
	case "directory":
		mode |= fs.ModeDir
	case "symlink":
		mode |= fs.ModeSymlink
	case "file":
	default:
		mode |= fs.ModeIrregular
	}
	return vfs.FileInfo{Path: fi.Path, Size: fi.Size, Mode: mode, ModTime: fi.ModifiedAt}
}

// octal writes m the way execd reads modes: its octal digits as a decimal.
func octal(m fs.FileMode) int {
	n, _ := strconv.Atoi(strconv.FormatUint(uint64(m.Perm()), 8))
	return n
}

// stat is GET /files/info for one path (not following a final symlink).
func (s *session) stat(ctx context.Context, p string) (fileInfo, error) {
	resp, err := s.execd(ctx, call{op: "stat", method: http.MethodGet, query: url.Values{"path": {p}}, idempotent: true}, "/files/info")
	if err != nil {
		return fileInfo{}, fileError("stat", p, s.classify(ctx, "stat", err))
	}
	var m map[string]fileInfo
	if err := s.p.decode("stat", resp, &m); err != nil {
		return fileInfo{}, fileError("stat", p, err)
	}
	fi, ok := m[p]
	if !ok {
		return fileInfo{}, fileError("stat", p, &workspace.ProviderError{Provider: providerName, Op: "stat", Status: resp.StatusCode,
			Message: "answer does not name the path asked for", Class: workspace.ErrProvider})
	}
	return fi, nil
}

// listDir is GET /directories/list with depth 1. execd refuses files and
// symlinks with 400; errNotDir says so.
func (s *session) listDir(ctx context.Context, p string) ([]fileInfo, error) {
	var resp *http.Response
	var err error
	for attempt := 0; ; attempt++ {
		resp, err = s.execd(ctx, call{op: "list", method: http.MethodGet,
			query: url.Values{"path": {p}, "depth": {"1"}}, idempotent: true}, "/directories/list")
		// execd lists with readdir then lstat per entry, and fails the
		// whole listing when an entry vanishes in between (a concurrent
		// rename or delete). Ask again.
		if attempt < 5 && vanishedEntry(err) {
			continue
		}
		break
	}
	if err != nil {
		if isStatus(err, http.StatusBadRequest) {
			return nil, errNotDir
		}
		return nil, fileError("list", p, s.classify(ctx, "list", err))
	}
	var fis []fileInfo
	if err := s.p.decode("list", resp, &fis); err != nil {
		return nil, fileError("list", p, err)
	}
	return fis, nil
}

var errNotDir = errors.New("not a directory")

func vanishedEntry(err error) bool {
	var pe *workspace.ProviderError
	return errors.As(err, &pe) && pe.Status == http.StatusInternalServerError &&
		pe.Code == "RUNTIME_ERROR" && strings.Contains(pe.Message, "no such file or directory")
}

// download is GET /files/download; the caller closes the body.
func (s *session) download(ctx context.Context, p string) (*http.Response, error) {
	resp, err := s.execd(ctx, call{op: "download", method: http.MethodGet, query: url.Values{"path": {p}}, idempotent: true}, "/files/download")
	if err != nil {
		return nil, fileError("download", p, s.classify(ctx, "download", err))
	}
	return resp, nil
}

// uploadMeta is the FileMetadata part that precedes each file part.
type uploadMeta struct {
	Path string `json:"path"`
	Mode int    `json:"mode,omitempty"`
}

// upload streams r to p through POST /files/upload: a metadata part, then
// the file part, written by a goroutine into a pipe that feeds the request.
// execd creates missing parents and applies mode (mode 0 is "leave as is").
func (s *session) upload(ctx context.Context, p string, mode fs.FileMode, r io.Reader) error {
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	done := make(chan struct{})
	var werr error
	go func() {
		defer close(done)
		werr = writeUpload(mw, p, mode, r)
		pw.CloseWithError(werr)
	}()
	resp, err := s.execd(ctx, call{op: "upload", method: http.MethodPost, stream: pr,
		ctype: mw.FormDataContentType()}, "/files/upload")
	// Unblock and collect the writer whatever happened to the request.
	pr.CloseWithError(errors.New("opensandbox upload: request ended"))
	<-done
	var se *sourceError
	if err != nil && ctx.Err() == nil && errors.As(werr, &se) {
		// The caller's reader failed, not the provider.
		return fileError("upload", p, se)
	}
	if err != nil {
		return fileError("upload", p, s.classify(ctx, "upload", err))
	}
	resp.Body.Close()
	return nil
}

func writeUpload(mw *multipart.Writer, p string, mode fs.FileMode, r io.Reader) error {
	// The metadata part needs a filename: execd reads parts from the form's
	// file section, where parts without one never land.
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", `form-data; name="metadata"; filename="metadata"`)
	h.Set("Content-Type", "application/json")
	w, err := mw.CreatePart(h)
	if err != nil {
		return err
	}
	if err := json.NewEncoder(w).Encode(uploadMeta{Path: p, Mode: octal(mode)}); err != nil {
		return err
	}
	fw, err := mw.CreateFormFile("file", "file")
	if err != nil {
		return err
	}
	src := &trackedReader{r: r}
	if _, err := io.CopyBuffer(fw, src, make([]byte, 1<<20)); err != nil {
		if src.err != nil {
			return &sourceError{src.err}
		}
		return err
	}
	return mw.Close()
}

// trackedReader remembers the source's own failure, to tell it from the
// pipe's (the request ended) in io.Copy's error.
type trackedReader struct {
	r   io.Reader
	err error
}

func (t *trackedReader) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		t.err = err
	}
	return n, err
}

// sourceError is a failure of the reader handed to Upload.
type sourceError struct{ err error }

func (e *sourceError) Error() string { return "read upload source: " + e.err.Error() }
func (e *sourceError) Unwrap() error { return e.err }

// removeFiles is DELETE /files: regular files only; missing paths are
// success.
func (s *session) removeFile(ctx context.Context, p string) error {
	resp, err := s.execd(ctx, call{op: "delete", method: http.MethodDelete, query: url.Values{"path": {p}}, idempotent: true}, "/files")
	if err != nil {
		return fileError("delete", p, s.classify(ctx, "delete", err))
	}
	resp.Body.Close()
	return nil
}

// removeAll is DELETE /directories, execd's rm -rf: also right for a
// symlink, which it removes without following.
func (s *session) removeAll(ctx context.Context, p string) error {
	resp, err := s.execd(ctx, call{op: "delete", method: http.MethodDelete, query: url.Values{"path": {p}}, idempotent: true}, "/directories")
	if err != nil {
		return fileError("delete", p, s.classify(ctx, "delete", err))
	}
	resp.Body.Close()
	return nil
}

type permission struct {
	Mode int `json:"mode"`
}

// mkdirAll is POST /directories (mkdir -p, then chmod).
func (s *session) mkdirAll(ctx context.Context, p string) error {
	resp, err := s.execd(ctx, call{op: "mkdir", method: http.MethodPost,
		json: map[string]permission{p: {Mode: 755}}, idempotent: true}, "/directories")
	if err != nil {
		return fileError("mkdir", p, s.classify(ctx, "mkdir", err))
	}
	resp.Body.Close()
	return nil
}

type moveItem struct {
	Src  string `json:"src"`
	Dest string `json:"dest"`
}

// move is POST /files/mv: a rename that refuses an existing destination.
func (s *session) move(ctx context.Context, src, dst string) error {
	resp, err := s.execd(ctx, call{op: "move", method: http.MethodPost, json: []moveItem{{Src: src, Dest: dst}}}, "/files/mv")
	if err != nil {
		return fileError("move", dst, s.classify(ctx, "move", err))
	}
	resp.Body.Close()
	return nil
}
