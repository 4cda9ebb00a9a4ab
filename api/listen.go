package api

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/esf-dev/esf/errdefs"
)

// maxSocketPath is the room sockaddr_un has for a path (108 bytes with the
// terminating NUL).
const maxSocketPath = 107

// Listen creates the daemon's unix socket at path with mode 0600.
//
// The socket is never reachable with a looser mode: it is bound inside a
// fresh 0700 directory next to path, chmod'ed to 0600 there, then renamed
// onto path. (Binding at path directly would create it with the process
// umask, and changing the umask is process-wide.) A stale socket left by a
// dead daemon is replaced; a live one (something accepts connections on
// it) or a non-socket file at path is failed_precondition.
//
// Closing the listener removes the socket file, if it is still the one
// Listen created.
func Listen(path string) (net.Listener, error) {
	path, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	if len(path) > maxSocketPath {
		return nil, fmt.Errorf("listen %s: socket path longer than %d bytes: %w", path, maxSocketPath, errdefs.ErrInvalidArgument)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	if err := removeStaleSocket(path); err != nil {
		return nil, err
	}
	tmpDir, err := os.MkdirTemp(dir, ".s") // 0700
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	defer os.RemoveAll(tmpDir)
	tmp := filepath.Join(tmpDir, "s")
	if len(tmp) > maxSocketPath {
		return nil, fmt.Errorf("listen %s: socket path too long to create safely (keep it under %d bytes): %w",
			path, maxSocketPath-(len(tmp)-len(path)), errdefs.ErrInvalidArgument)
	}
	ln, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	ul := ln.(*net.UnixListener)
	ul.SetUnlinkOnClose(false) // the name it knows is the temp one
	fail := func(err error) (net.Listener, error) {
		ul.Close()
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fail(err)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return fail(err)
	}
	return &socketListener{UnixListener: ul, path: path, fi: fi}, nil
}

// removeStaleSocket clears path for a new socket, or says why it cannot.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("listen %s: %w", path, err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("listen %s: exists and is not a socket: %w", path, errdefs.ErrFailedPrecondition)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("listen %s: another daemon is listening there: %w", path, errdefs.ErrFailedPrecondition)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("listen %s: probing the existing socket: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("listen %s: remove stale socket: %w", path, err)
	}
	return nil
}

// socketListener removes its socket file on Close.
type socketListener struct {
	*net.UnixListener
	path string
	fi   fs.FileInfo
	once sync.Once
	err  error
}

func (l *socketListener) Close() error {
	l.once.Do(func() {
		l.err = l.UnixListener.Close()
		// Remove the name only if it is still our socket: a successor that
		// took over the path keeps its own.
		if fi, err := os.Lstat(l.path); err == nil && os.SameFile(fi, l.fi) {
			if err := os.Remove(l.path); err != nil && l.err == nil {
				l.err = err
			}
		}
	})
	return l.err
}
