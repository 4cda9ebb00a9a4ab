package workspacetest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/esf-dev/esf/sandbox"
	"github.com/esf-dev/esf/workspace"
)

// SeedEnv names the environment variable that replays the suite's random
// content: every run logs its seed.
const SeedEnv = "ESF_WORKSPACETEST_SEED"

// MetadataKey is the Spec.Metadata key the suite sets on every session it
// creates (value: the subtest's name, reduced to [A-Za-z0-9-], at most 63
// bytes so label-backed providers accept it), so sessions a crashed run
// leaves can be found with an Enumerator. EnvKey is set to "1" in every
// session's Spec.Env.
const (
	MetadataKey = "workspacetest"
	EnvKey      = "WORKSPACETEST"
)

// Run runs the conformance suite against h.Provider. Subtests run one after
// another, each creating the sessions it needs and closing them in its
// cleanup, so any one can be run alone with -run. A final subtest checks
// that the provider holds no more sessions than before the suite started.
func Run(t *testing.T, h Harness) {
	if h.Provider == nil {
		t.Fatal("workspacetest: Harness.Provider is nil")
	}
	if h.LargeFile <= 0 {
		h.LargeFile = 1 << 30
	}
	if h.OpTimeout <= 0 {
		h.OpTimeout = 2 * time.Minute
	}
	s := &suite{h: h, seed: seed(t)}
	switch en, ok := h.Provider.(workspace.Enumerator); {
	case h.Sessions != nil:
		s.count = h.Sessions
	case ok:
		s.count = func(ctx context.Context) (int, error) {
			infos, err := en.Sessions(ctx)
			return len(infos), err
		}
	default:
		t.Fatalf("workspacetest: %T implements no workspace.Enumerator and Harness.Sessions is nil: the suite cannot check for leaked sessions", h.Provider)
	}
	n0 := s.mustCount(t)
	t.Logf("provider %T: %d live sessions before the suite; large file %d bytes; op timeout %v", h.Provider, n0, h.LargeFile, h.OpTimeout)
	for _, tc := range []struct {
		name string
		fn   func(*testing.T)
	}{
		{"Lifecycle", s.testLifecycle},
		{"Exec", s.testExec},
		{"Files", s.testFiles},
		{"Paths", s.testPaths},
		{"Transfer", s.testTransfer},
		{"Pause", s.testPause},
		{"Cancellation", s.testCancellation},
		{"Concurrency", s.testConcurrency},
		{"Errors", s.testErrors},
	} {
		t.Run(tc.name, tc.fn)
	}
	t.Run("NoLeftovers", func(t *testing.T) { s.waitCount(t, n0, "after the whole suite") })
}

type suite struct {
	h     Harness
	seed  uint64
	count func(context.Context) (int, error)
}

func seed(t *testing.T) uint64 {
	if v := os.Getenv(SeedEnv); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", SeedEnv, v, err)
		}
		t.Logf("content seed %d (from %s)", n, SeedEnv)
		return n
	}
	n := rand.Uint64()
	t.Logf("content seed %d (replay with %s=%d)", n, SeedEnv, n)
	return n
}

// ctx is one suite step's context: h.OpTimeout from now, cancelled when the
// test ends.
func (s *suite) ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), s.h.OpTimeout)
	t.Cleanup(cancel)
	return ctx
}

// spec is a copy of the harness's Spec with the suite's markers added.
func (s *suite) spec(t *testing.T) workspace.Spec {
	sp := s.h.Spec
	sp.Env = maps.Clone(sp.Env)
	if sp.Env == nil {
		sp.Env = map[string]string{}
	}
	sp.Env[EnvKey] = "1"
	sp.Metadata = maps.Clone(sp.Metadata)
	if sp.Metadata == nil {
		sp.Metadata = map[string]string{}
	}
	sp.Metadata[MetadataKey] = label(t.Name())
	return sp
}

func label(name string) string {
	b := []byte(name)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			b[i] = '-'
		}
	}
	if len(b) > 63 {
		b = b[len(b)-63:]
	}
	return strings.Trim(string(b), "-")
}

// create makes a session from s.spec (changed by edit, when not nil) and
// closes it when the test ends. The cleanup accepts ErrNotFound: a test may
// have closed the session through another handle.
func (s *suite) create(t *testing.T, edit func(*workspace.Spec)) workspace.Session {
	t.Helper()
	sp := s.spec(t)
	if edit != nil {
		edit(&sp)
	}
	sess, err := s.h.Provider.Create(s.ctx(t), sp)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if sess == nil {
		t.Fatal("Create returned a nil session and no error")
	}
	if sess.ID() == "" {
		t.Error("Create returned a session with an empty ID")
	}
	t.Cleanup(func() { s.closeQuietly(t, sess) })
	return sess
}

func (s *suite) closeQuietly(t *testing.T, sess workspace.Session) {
	ctx, cancel := context.WithTimeout(context.Background(), s.h.OpTimeout)
	defer cancel()
	if err := sess.Close(ctx); err != nil && !errors.Is(err, workspace.ErrNotFound) {
		t.Errorf("Close %s in cleanup: %v", sess.ID(), err)
	}
}

func (s *suite) mustCount(t *testing.T) int {
	t.Helper()
	n, err := s.count(s.ctx(t))
	if err != nil {
		t.Fatalf("counting sessions: %v", err)
	}
	return n
}

// waitCount waits until the provider holds want sessions. It polls because
// a remote provider's listing may lag its deletes; the fake settles at once.
func (s *suite) waitCount(t *testing.T, want int, when string) {
	t.Helper()
	ctx := s.ctx(t)
	var n int
	var err error
	for delay := 10 * time.Millisecond; ; delay = min(2*delay, time.Second) {
		n, err = s.count(ctx)
		if err == nil && n == want {
			return
		}
		select {
		case <-ctx.Done():
			if err != nil {
				t.Fatalf("%s: counting sessions: %v", when, err)
			}
			t.Fatalf("%s: provider holds %d sessions, want %d (a session leaked or was lost)", when, n, want)
		case <-time.After(delay):
		}
	}
}

// run runs command and fails the test on an error (not on a non-zero exit).
func (s *suite) run(t *testing.T, sess workspace.Session, spec sandbox.Spec, command string) sandbox.Result {
	t.Helper()
	res, err := sess.Run(s.ctx(t), spec, command)
	if err != nil {
		t.Fatalf("Run(%q): %v", command, err)
	}
	return res
}

// sh runs command, requires exit 0, and returns its stdout.
func (s *suite) sh(t *testing.T, sess workspace.Session, command string) string {
	t.Helper()
	res := s.run(t, sess, sandbox.Spec{}, command)
	if res.ExitCode != 0 {
		t.Fatalf("Run(%q) exited %d; stderr %q", command, res.ExitCode, clip(res.Stderr))
	}
	return string(res.Stdout)
}

// pwd is the session's working directory as its shell reports it.
func (s *suite) pwd(t *testing.T, sess workspace.Session) string {
	t.Helper()
	d := strings.TrimSuffix(s.sh(t, sess, "pwd"), "\n")
	if !strings.HasPrefix(d, "/") {
		t.Fatalf("pwd = %q, not an absolute path", d)
	}
	return d
}

// quote makes s one single-quoted sh word.
func quote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// clip shortens what a failure message quotes.
func clip[T ~string | ~[]byte](b T) string {
	const max = 200
	if len(b) > max {
		return string(b[:max]) + fmt.Sprintf("...(%d bytes)", len(b))
	}
	return string(b)
}

// classes are the error classes a caller tells apart with errors.Is; an
// error must match exactly the one the contract asks for.
var classes = []struct {
	name string
	err  error
}{
	{"workspace.ErrNotFound", workspace.ErrNotFound},
	{"workspace.ErrUnsupported", workspace.ErrUnsupported},
	{"workspace.ErrPolicy", workspace.ErrPolicy},
	{"workspace.ErrClosed", workspace.ErrClosed},
	{"workspace.ErrPaused", workspace.ErrPaused},
	{"workspace.ErrProvider", workspace.ErrProvider},
	{"fs.ErrNotExist", fs.ErrNotExist},
	{"fs.ErrExist", fs.ErrExist},
	{"fs.ErrInvalid", fs.ErrInvalid},
	{"fs.ErrPermission", fs.ErrPermission},
	{"context.Canceled", context.Canceled},
	{"context.DeadlineExceeded", context.DeadlineExceeded},
}

func className(err error) string {
	for _, c := range classes {
		if c.err == err {
			return c.name
		}
	}
	return fmt.Sprint(err)
}

// wantErr checks that err matches class and no other class, and that a
// *workspace.ProviderError in it, if any, is filled in and agrees.
func wantErr(t *testing.T, what string, err, class error) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: no error, want %s", what, className(class))
		return
	}
	if !errors.Is(err, class) {
		t.Errorf("%s: error %q does not match %s", what, err, className(class))
		return
	}
	for _, c := range classes {
		if c.err != class && errors.Is(err, c.err) {
			t.Errorf("%s: error %q matches %s as well as %s; classes must be distinguishable", what, err, c.name, className(class))
		}
	}
	var pe *workspace.ProviderError
	if errors.As(err, &pe) {
		if pe.Provider == "" || pe.Op == "" {
			t.Errorf("%s: *ProviderError %+v lacks Provider or Op", what, *pe)
		}
		if !errors.Is(pe, class) {
			t.Errorf("%s: *ProviderError %q maps to %v, but the error as a whole matches %s", what, pe, pe.Unwrap(), className(class))
		}
	}
}

// syncBuffer is a Spec.Stdout/Stderr writer the test can read while Run
// writes to it; it closes seen the first time its contents hold marker.
type syncBuffer struct {
	mu     sync.Mutex
	b      []byte
	marker string
	fired  bool
	seen   chan struct{}
}

func newSyncBuffer(marker string) *syncBuffer {
	return &syncBuffer{marker: marker, seen: make(chan struct{})}
}

func (w *syncBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b = append(w.b, p...)
	if !w.fired && w.marker != "" && strings.Contains(string(w.b), w.marker) {
		w.fired = true
		close(w.seen)
	}
	return len(p), nil
}

func (w *syncBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.b)
}
