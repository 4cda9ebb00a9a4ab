// Package atomicfile replaces a file so that a crash leaves either its old
// content or the whole new one, never a torn or empty file.
//
// The protocol, in one place for every writer outside the content store
// (which has its own, per object): write a temporary file in the target's
// directory, set its mode, fsync it, close it, rename it over the target,
// then fsync the directory so the rename itself survives a crash. Until
// the rename, the target is untouched; a failure before it removes the
// temporary file.
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
)

// File is a new content for a path, written to a temporary file beside it
// until Commit. Use one from a single goroutine.
type File struct {
	f    *os.File
	path string
	perm os.FileMode
	done bool // committed or aborted: the temporary file is gone or renamed
}

// Create starts a new content for path, which will have mode perm (not
// reduced by the umask: callers that want it apply it themselves). The
// temporary file is path's directory's ".BASE.tmp-*", so the rename stays
// within one filesystem.
func Create(path string, perm os.FileMode) (*File, error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return nil, err
	}
	return &File{f: f, path: path, perm: perm}, nil
}

// Write appends p to the new content.
func (f *File) Write(p []byte) (int, error) { return f.f.Write(p) }

// Name is the temporary file's path (for messages).
func (f *File) Name() string { return f.f.Name() }

// Commit makes the new content path's: mode, fsync, close, rename over
// path, fsync of the directory. An error before the rename leaves path as
// it was and removes the temporary file. An error of the directory's
// fsync comes after the rename: path holds the whole new content, only
// its durability across a crash is in doubt.
func (f *File) Commit() error {
	if f.done {
		return fmt.Errorf("atomicfile %s: already committed or aborted", f.path)
	}
	err := f.f.Chmod(f.perm)
	if err == nil {
		err = f.f.Sync()
	}
	if cerr := f.f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.f.Name(), f.path)
	}
	f.done = true
	if err != nil {
		os.Remove(f.f.Name())
		return err
	}
	if err := SyncDir(filepath.Dir(f.path)); err != nil {
		return fmt.Errorf("%s is written; sync of its directory: %w", f.path, err)
	}
	return nil
}

// Abort drops the new content and removes the temporary file; path stays
// as it was. It does nothing after Commit, so `defer f.Abort()` is the
// way to clean up on every early return.
func (f *File) Abort() {
	if f.done {
		return
	}
	f.done = true
	f.f.Close()
	os.Remove(f.f.Name())
}

// WriteFile replaces path's content with data, mode perm, atomically and
// durably (see File.Commit).
func WriteFile(path string, data []byte, perm os.FileMode) error {
	f, err := Create(path, perm)
	if err != nil {
		return err
	}
	defer f.Abort()
	if _, err := f.Write(data); err != nil {
		return err
	}
	return f.Commit()
}

// SyncDir fsyncs a directory, making the creations, renames and removals
// in it durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
