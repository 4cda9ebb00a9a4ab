package esf

import (
	"bytes"
	"context"
	"io"
	"io/fs"
	"os"
	"sync"

	"github.com/esf-dev/esf/vfs"
)

// The file operations work on the attempt's writable root directly on
// this host (the daemon mounts it here), confined to it by rootFS: the
// same tree the container sees, at disk speed, without a round trip per
// call. Paths resolve with vfs.Resolve against the session's home and
// working directory.

// resolve is THE path rule of the contract.
func (s *Session) resolve(p string) (string, error) {
	return vfs.Resolve(s.rec.Home, s.rec.WorkDir, p)
}

// withRoot runs fn on the live attempt's root as one call of the session;
// fn's context is the call's.
func (s *Session) withRoot(ctx context.Context, name string, fn func(o *op, r *rootFS) error) error {
	o, err := s.begin(ctx, name)
	if err != nil {
		return err
	}
	defer o.end()
	r, err := openRoot(o.att.root)
	if err != nil {
		return o.fail(err)
	}
	defer r.Close()
	return o.fail(fn(o, r))
}

// Read returns the regular file at p; a directory or any other kind of
// file is fs.ErrInvalid.
func (s *Session) Read(ctx context.Context, p string) ([]byte, error) {
	abs, err := s.resolve(p)
	if err != nil {
		return nil, err
	}
	var out []byte
	err = s.withRoot(ctx, "read", func(o *op, r *rootFS) error {
		f, size, err := r.OpenRegular(abs)
		if err != nil {
			return fsError("read", abs, err)
		}
		defer f.Close()
		var b bytes.Buffer
		b.Grow(int(min(size, 1<<30)) + 1)
		if _, err := b.ReadFrom(&ctxReader{ctx: o.ctx, r: f}); err != nil {
			return fsError("read", abs, err)
		}
		out = b.Bytes()
		return nil
	})
	return out, err
}

// Write replaces p with data atomically (see Upload).
func (s *Session) Write(ctx context.Context, p string, data []byte) error {
	return s.upload(ctx, "write", p, bytes.NewReader(data))
}

// Upload streams r into p: a temporary file in p's directory (created with
// its missing parents), fsync, rename over p. Readers see the old file or
// the new one; a failed or cancelled upload leaves the old one. A replaced
// regular file keeps its mode and owner; a new file (also one replacing a
// symlink: the link is replaced, never written through) is 0644, owned by
// root.
func (s *Session) Upload(ctx context.Context, p string, r io.Reader) error {
	return s.upload(ctx, "upload", p, r)
}

func (s *Session) upload(ctx context.Context, name, p string, src io.Reader) error {
	abs, err := s.resolve(p)
	if err != nil {
		return err
	}
	return s.withRoot(ctx, name, func(o *op, r *rootFS) error {
		if name == "upload" {
			// A stream may outlast the lease (a slow source).
			stop := o.keepAlive()
			defer stop()
		}
		if err := r.writeFile(o.ctx, abs, src); err != nil {
			return fsError(name, abs, err)
		}
		return nil
	})
}

// Download opens the regular file at p for streaming. The reader holds the
// session's root open until it is closed, ctx ends, or the handle is
// paused or closed (which end the transfer).
func (s *Session) Download(ctx context.Context, p string) (io.ReadCloser, error) {
	abs, err := s.resolve(p)
	if err != nil {
		return nil, err
	}
	o, err := s.begin(ctx, "download")
	if err != nil {
		return nil, err
	}
	r, err := openRoot(o.att.root)
	if err != nil {
		err = o.fail(err)
		o.end()
		return nil, err
	}
	f, _, err := r.OpenRegular(abs)
	r.Close()
	if err != nil {
		err = o.fail(fsError("download", abs, err))
		o.end()
		return nil, err
	}
	d := &download{o: o, f: f, path: abs}
	d.stop = context.AfterFunc(o.ctx, d.release)
	return d, nil
}

// download is a Download's reader: one call of the session until closed.
type download struct {
	o    *op
	f    *os.File
	path string
	stop func() bool
	once sync.Once
}

func (d *download) Read(p []byte) (int, error) {
	if err := d.o.ctx.Err(); err != nil {
		return 0, d.o.fail(err)
	}
	if d.o.s.claimRenewal(d.o.att.id) {
		d.o.s.renew(d.o.ctx, d.o.att) // a failure shows in the reads that follow, if it matters
	}
	n, err := d.f.Read(p)
	if err != nil && err != io.EOF {
		if d.o.ctx.Err() != nil {
			err = d.o.ctx.Err() // the file was closed under the read
		}
		return n, d.o.fail(fsError("download", d.path, err))
	}
	return n, err
}

// release closes the file and ends the call, once.
func (d *download) release() {
	d.once.Do(func() {
		d.f.Close()
		d.o.end()
	})
}

func (d *download) Close() error {
	d.stop()
	d.release()
	return nil
}

// List returns the entries of the directory p sorted by path, or p's own
// entry when it is not a directory.
func (s *Session) List(ctx context.Context, p string) ([]vfs.FileInfo, error) {
	abs, err := s.resolve(p)
	if err != nil {
		return nil, err
	}
	var out []vfs.FileInfo
	err = s.withRoot(ctx, "list", func(o *op, r *rootFS) error {
		out, err = rootLister{r}.List(o.ctx, abs)
		return err
	})
	return out, err
}

// Glob walks the root with vfs.GlobWalk (esf has no server-side search).
func (s *Session) Glob(ctx context.Context, pattern string) ([]string, error) {
	abs, err := s.resolve(pattern)
	if err != nil {
		return nil, err
	}
	var out []string
	err = s.withRoot(ctx, "glob", func(o *op, r *rootFS) error {
		out, err = vfs.GlobWalk(o.ctx, rootLister{r}, abs)
		return err
	})
	return out, err
}

// Grep walks the root with vfs.GrepWalk.
func (s *Session) Grep(ctx context.Context, pattern string, opts vfs.GrepOptions) ([]vfs.Match, error) {
	p := opts.Path
	if p == "" {
		p = s.rec.WorkDir
	}
	abs, err := s.resolve(p)
	if err != nil {
		return nil, err
	}
	opts.Path = abs
	var out []vfs.Match
	err = s.withRoot(ctx, "grep", func(o *op, r *rootFS) error {
		out, err = vfs.GrepWalk(o.ctx, rootLister{r}, pattern, opts)
		return err
	})
	return out, err
}

// Delete removes a file, a symlink (not its target) or a directory tree.
func (s *Session) Delete(ctx context.Context, p string) error {
	abs, err := s.resolve(p)
	if err != nil {
		return err
	}
	if abs == "/" {
		return &fs.PathError{Op: "delete", Path: abs, Err: fs.ErrInvalid}
	}
	return s.withRoot(ctx, "delete", func(o *op, r *rootFS) error {
		if err := r.RemoveAll(o.ctx, abs); err != nil {
			return fsError("delete", abs, err)
		}
		return nil
	})
}

// rootLister is one open root as the walkers of vfs see it.
type rootLister struct{ r *rootFS }

func (l rootLister) List(ctx context.Context, p string) ([]vfs.FileInfo, error) {
	out, err := l.r.list(ctx, p)
	if err != nil {
		return nil, fsError("list", p, err)
	}
	return out, nil
}

func (l rootLister) Read(ctx context.Context, p string) ([]byte, error) {
	f, _, err := l.r.OpenRegular(p)
	if err != nil {
		return nil, fsError("read", p, err)
	}
	defer f.Close()
	b, err := io.ReadAll(&ctxReader{ctx: ctx, r: f})
	if err != nil {
		return nil, fsError("read", p, err)
	}
	return b, nil
}
