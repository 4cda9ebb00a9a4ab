package api

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"

	"github.com/esf-dev/esf/api/internal/wire"
	"github.com/esf-dev/esf/errdefs"
)

// The network API's bearer tokens. A token file holds one token per line;
// blank lines and lines starting with # are ignored. esfd reads it again
// whenever it changes (size, modification time or inode: an edit in place
// or a rename over it), so tokens are added and revoked without a restart.
// A file that cannot be read any more accepts no token until it can (fail
// closed).

// MinTokenLen is the shortest token accepted: a token is a secret, not a
// password, and should be 32 or more random characters.
const MinTokenLen = wire.MinTokenLen

// ParseTokens reads a token file's content.
func ParseTokens(b []byte) ([]string, error) { return wire.ParseTokens(b) }

// ReadTokenFile reads the first token of a token file (a client's).
func ReadTokenFile(path string) (string, error) { return wire.ReadTokenFile(path) }

// Tokens is the set of bearer tokens a network listener accepts, kept in
// step with its file.
type Tokens struct {
	path string
	log  *slog.Logger

	mu    sync.Mutex
	stamp fileStamp
	sums  [][sha256.Size]byte // SHA-256 of each token
	err   error               // the file could not be read at the last change
}

type fileStamp struct {
	size, mtime int64
	ino, dev    uint64
}

func stampOf(fi fs.FileInfo) fileStamp {
	st := fileStamp{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.ino, st.dev = sys.Ino, uint64(sys.Dev)
	}
	return st
}

// LoadTokens reads path. It must hold at least one token now; later it may
// be emptied (every request is refused then).
func LoadTokens(path string, log *slog.Logger) (*Tokens, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := &Tokens{path: path, log: log}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("tokens: %w", err)
	}
	if fi.Mode().Perm()&0o004 != 0 {
		log.Warn("the token file is readable by every user", "path", path, "mode", fi.Mode().Perm().String())
	}
	t.reload(fi)
	if t.err != nil {
		return nil, t.err
	}
	if len(t.sums) == 0 {
		return nil, fmt.Errorf("tokens: %s holds no token: %w", path, errdefs.ErrInvalidArgument)
	}
	return t, nil
}

// reload reads the file if its stamp changed. Caller holds mu (or owns t).
func (t *Tokens) reload(fi fs.FileInfo) {
	st := stampOf(fi)
	if st == t.stamp && t.sums != nil {
		return
	}
	b, err := os.ReadFile(t.path)
	var toks []string
	if err == nil {
		toks, err = ParseTokens(b)
	}
	if err != nil {
		t.err = fmt.Errorf("tokens %s: %w", t.path, err)
		t.sums = [][sha256.Size]byte{} // fail closed
		t.log.Error("token file unreadable: refusing every network request until it is fixed", "path", t.path, "err", err)
		return
	}
	t.stamp, t.err = st, nil
	t.sums = make([][sha256.Size]byte, len(toks))
	for i, tok := range toks {
		t.sums[i] = sha256.Sum256([]byte(tok))
	}
	t.log.Info("tokens loaded", "path", t.path, "tokens", len(toks))
}

// current returns the token digests, re-reading the file if it changed.
func (t *Tokens) current() [][sha256.Size]byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	fi, err := os.Stat(t.path)
	if err != nil {
		if t.err == nil {
			t.log.Error("token file gone: refusing every network request", "path", t.path, "err", err)
		}
		t.err, t.sums, t.stamp = err, [][sha256.Size]byte{}, fileStamp{}
		return nil
	}
	t.reload(fi)
	return t.sums
}

// errUnauthenticated is what every refused request is told: nothing about
// why a token failed, so a prober learns nothing.
var errUnauthenticated = fmt.Errorf("a valid bearer token is required (Authorization: Bearer <token>): %w", errdefs.ErrUnauthenticated)

// Check authenticates r: one Authorization header with the Bearer scheme
// and a token of the file. Tokens are compared as SHA-256 digests in
// constant time, against every token, so the time taken says nothing
// about how close a guess came or which token matched.
func (t *Tokens) Check(r *http.Request) error {
	vals := r.Header.Values("Authorization")
	if len(vals) != 1 {
		return errUnauthenticated
	}
	scheme, tok, ok := strings.Cut(vals[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return errUnauthenticated
	}
	if !t.Valid(strings.TrimSpace(tok)) {
		return errUnauthenticated
	}
	return nil
}

// Valid reports whether tok is a token of the file, comparing SHA-256
// digests in constant time against every token (as Check does).
func (t *Tokens) Valid(tok string) bool {
	sum := sha256.Sum256([]byte(tok))
	match := 0
	for _, s := range t.current() {
		match |= subtle.ConstantTimeCompare(sum[:], s[:])
	}
	return match == 1
}

// authenticate refuses a request of a connection that needs a token and
// does not carry a valid one: 401, the API's error body, and a
// WWW-Authenticate challenge. It reports whether the request may go on.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request) bool {
	rc, ok := r.Context().Value(remoteKey{}).(*remoteConn)
	if !ok || rc.tokens == nil {
		return true // the unix socket, or a listener the operator left open
	}
	err := rc.tokens.Check(r)
	if err == nil {
		return true
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="esfd"`)
	writeError(w, err)
	s.log.Info("request refused", "code", errdefs.CodeUnauthenticated, "method", r.Method, "path", r.URL.Path,
		"remote", r.RemoteAddr)
	if s.observe != nil {
		s.observe("unauthenticated", string(errdefs.CodeUnauthenticated), 0)
	}
	return false
}
