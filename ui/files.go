package ui

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"mime"
	"net/http"
	"path"
	"sort"
	"strings"
	"sync"

	"github.com/esf-dev/esf/errdefs"
)

// The file browser reads a node's tree as the tar esfd exports (GET
// /v1/export/{id}.tar): esfd has no listing endpoint, and a tar is what
// every client already reads. A root id names content for ever, so a
// listing is cached by it.

// Entry is one name of a directory listing.
type Entry struct {
	Name   string `json:"name"`
	Type   string `json:"type"` // file, dir, symlink, hardlink, other
	Size   int64  `json:"size"`
	Mode   int64  `json:"mode"`
	Target string `json:"target,omitempty"`
}

// maxEntries bounds a cached listing; a larger tree lists the first ones
// and says it was cut.
const maxEntries = 200_000

type listing struct {
	dirs map[string][]Entry // directory path ("" is the root) -> entries
	cut  bool
}

type fileCache struct {
	mu    sync.Mutex
	max   int
	order []string
	m     map[string]*listing
}

func newFileCache(max int) *fileCache { return &fileCache{max: max, m: map[string]*listing{}} }

func (c *fileCache) get(id string) *listing {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[id]
}

func (c *fileCache) put(id string, l *listing) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[id]; ok {
		return
	}
	if len(c.order) >= c.max {
		delete(c.m, c.order[0])
		c.order = c.order[1:]
	}
	c.order = append(c.order, id)
	c.m[id] = l
}

// cleanPath is a tar member name or a query path as a slash path without
// leading "./" or "/" ("" for the root).
func cleanPath(p string) string {
	p = path.Clean("/" + p)
	return strings.TrimPrefix(p, "/")
}

// walkTar streams id's tar and calls fn for each member until fn returns
// errStop (not an error) or another error.
func (s *Server) walkTar(ctx context.Context, id string, fn func(h *tar.Header, r io.Reader) error) (string, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	type result struct {
		root string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		res, err := s.c.ExportTar(ctx, id, pw)
		pw.CloseWithError(err)
		var root string
		if res != nil {
			root = res.RootID
		}
		done <- result{root, err}
	}()
	tr := tar.NewReader(pr)
	var werr error
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			werr = err
			break
		}
		if err := fn(h, tr); err != nil {
			werr = err
			break
		}
	}
	if werr == nil {
		// The archive ended; the export's answer (its root, or an error
		// found after the last member) may still be on its way: read it
		// rather than cancel the export that is about to succeed.
		_, _ = io.Copy(io.Discard, pr)
	}
	cancel()
	pr.CloseWithError(errStop)
	res := <-done
	switch {
	case errors.Is(werr, errStop):
		return res.root, nil // fn found what it wanted; the export was cut on purpose
	case werr != nil && res.err == nil:
		return "", werr
	case werr != nil:
		// The tar broke because the export failed (its error says why), or
		// fn refused a member (its error).
		var fe *errdefs.Error
		if errors.As(werr, &fe) {
			return "", werr
		}
		return "", res.err
	}
	return res.root, res.err
}

var errStop = errors.New("stop")

func entryType(b byte) string {
	switch b {
	case tar.TypeReg:
		return "file"
	case tar.TypeDir:
		return "dir"
	case tar.TypeSymlink:
		return "symlink"
	case tar.TypeLink:
		return "hardlink"
	}
	return "other"
}

func (s *Server) listingOf(ctx context.Context, id string) (*listing, error) {
	if l := s.files.get(id); l != nil {
		return l, nil
	}
	l := &listing{dirs: map[string][]Entry{"": {}}}
	n := 0
	_, err := s.walkTar(ctx, id, func(h *tar.Header, _ io.Reader) error {
		p := cleanPath(h.Name)
		if p == "" {
			return nil
		}
		if n++; n > maxEntries {
			l.cut = true
			return errStop
		}
		dir, name := path.Split(p)
		dir = strings.TrimSuffix(dir, "/")
		e := Entry{Name: name, Type: entryType(h.Typeflag), Size: h.Size, Mode: h.Mode}
		if h.Typeflag == tar.TypeSymlink || h.Typeflag == tar.TypeLink {
			e.Target = h.Linkname
		}
		l.dirs[dir] = append(l.dirs[dir], e)
		if e.Type == "dir" {
			if _, ok := l.dirs[p]; !ok {
				l.dirs[p] = []Entry{}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, es := range l.dirs {
		sort.Slice(es, func(i, j int) bool { return es[i].Name < es[j].Name })
	}
	s.files.put(id, l)
	return l, nil
}

// ls answers GET /api/ls?id=ROOT_OR_NODE&path=DIR.
func (s *Server) ls(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	l, err := s.listingOf(r.Context(), q.Get("id"))
	if err != nil {
		writeErr(w, err)
		return
	}
	dir := cleanPath(q.Get("path"))
	es, ok := l.dirs[dir]
	if !ok {
		writeErr(w, &errdefs.Error{Code: errdefs.CodeNotFound, Message: "no directory " + dir})
		return
	}
	writeJSON(w, map[string]any{"path": dir, "entries": es, "truncated": l.cut})
}

// file answers GET /api/file?id=ROOT_OR_NODE&path=FILE: the file's bytes,
// as an attachment unless inline=1 (then as plain text).
func (s *Server) file(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	want := cleanPath(q.Get("path"))
	found := false
	_, err := s.walkTar(r.Context(), q.Get("id"), func(h *tar.Header, body io.Reader) error {
		if cleanPath(h.Name) != want {
			return nil
		}
		if h.Typeflag != tar.TypeReg {
			return &errdefs.Error{Code: errdefs.CodeInvalidArgument, Message: want + " is not a regular file"}
		}
		found = true
		hd := w.Header()
		if q.Get("inline") == "1" {
			hd.Set("Content-Type", "text/plain; charset=utf-8")
		} else {
			hd.Set("Content-Type", "application/octet-stream")
			hd.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": path.Base(want)}))
		}
		hd.Set("Content-Length", itoa(h.Size))
		w.WriteHeader(http.StatusOK)
		_, _ = io.Copy(w, body)
		return errStop
	})
	if found {
		return
	}
	if err == nil {
		err = &errdefs.Error{Code: errdefs.CodeNotFound, Message: "no file " + want}
	}
	writeErr(w, err)
}
