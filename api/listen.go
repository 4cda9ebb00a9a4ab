package api

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
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

// NetworkOptions secure a TCP listener (ListenTCP).
type NetworkOptions struct {
	// TLS, if set, serves TLS (HTTP/1.1: the exec stream is a full-duplex
	// HTTP/1.1 exchange).
	TLS *tls.Config
	// Tokens, if set, are the bearer tokens every request must carry.
	Tokens *Tokens
	// Insecure allows what is refused otherwise: a listener without
	// tokens, or a non-loopback one without TLS.
	Insecure bool
}

// ListenTCP listens on addr ("tcp://HOST:PORT") for the network API.
//
// The API can read and write any path of the daemon's host (import,
// export, mount) and runs commands as root in sandboxes: whoever reaches
// the port without a token drives esfd. So tokens are required on every
// TCP listener, and TLS on every listener that is not loopback (a token
// sent in clear can be read on the way), unless opts.Insecure says the
// operator accepts that.
func ListenTCP(addr string, opts NetworkOptions) (net.Listener, error) {
	hostport, ok := strings.CutPrefix(addr, "tcp://")
	if !ok {
		return nil, fmt.Errorf("listen %q: want tcp://HOST:PORT: %w", addr, errdefs.ErrInvalidArgument)
	}
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return nil, fmt.Errorf("listen %q: %v: %w", addr, err, errdefs.ErrInvalidArgument)
	}
	if !opts.Insecure {
		if opts.Tokens == nil {
			return nil, fmt.Errorf("listen %s: no --tokens: anyone who reaches the port would drive esfd (--insecure-listen to allow it): %w",
				addr, errdefs.ErrInvalidArgument)
		}
		if opts.TLS == nil && !loopback(host) {
			return nil, fmt.Errorf("listen %s: not loopback and no TLS (--tls-cert, --tls-key): tokens would cross the network in clear (--insecure-listen to allow it): %w",
				addr, errdefs.ErrInvalidArgument)
		}
	}
	ln, err := net.Listen("tcp", hostport)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	var out net.Listener = &remoteListener{Listener: ln, tokens: opts.Tokens}
	if opts.TLS != nil {
		cfg := opts.TLS.Clone()
		cfg.NextProtos = []string{"http/1.1"}
		if cfg.MinVersion == 0 {
			cfg.MinVersion = tls.VersionTLS12
		}
		out = tls.NewListener(out, cfg)
	}
	return out, nil
}

// loopback reports whether host names only this machine: a loopback IP
// or "localhost". An empty host (all interfaces) is not.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// remoteListener marks the connections it accepts: their requests need a
// token (if it has tokens).
type remoteListener struct {
	net.Listener
	tokens *Tokens
}

func (l *remoteListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &remoteConn{Conn: c, tokens: l.tokens}, nil
}

type remoteConn struct {
	net.Conn
	tokens *Tokens
}

// remoteKey is the context key of a request's *remoteConn.
type remoteKey struct{}

// connContext records in a connection's context whether it came through a
// network listener (under TLS or not).
func connContext(ctx context.Context, c net.Conn) context.Context {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if rc, ok := c.(*remoteConn); ok {
		return context.WithValue(ctx, remoteKey{}, rc)
	}
	return ctx
}

// ServerTLS is the TLS configuration of a network listener: the
// certificate and key files are read again when they change, so a renewed
// certificate is served without a restart.
func ServerTLS(certFile, keyFile string) (*tls.Config, error) {
	kp := &keyPair{cert: certFile, key: keyFile}
	if _, err := kp.get(nil); err != nil {
		return nil, err
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: kp.get}, nil
}

type keyPair struct {
	cert, key string
	mu        sync.Mutex
	stamp     [2]fileStamp
	loaded    *tls.Certificate
}

func (k *keyPair) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	var st [2]fileStamp
	for i, p := range []string{k.cert, k.key} {
		fi, err := os.Stat(p)
		if err != nil {
			if k.loaded != nil {
				return k.loaded, nil // mid-rotation: keep serving the last good pair
			}
			return nil, fmt.Errorf("TLS: %w", err)
		}
		st[i] = stampOf(fi)
	}
	if k.loaded != nil && st == k.stamp {
		return k.loaded, nil
	}
	c, err := tls.LoadX509KeyPair(k.cert, k.key)
	if err != nil {
		if k.loaded != nil {
			return k.loaded, nil
		}
		return nil, fmt.Errorf("TLS: %w", err)
	}
	k.loaded, k.stamp = &c, st
	return k.loaded, nil
}
