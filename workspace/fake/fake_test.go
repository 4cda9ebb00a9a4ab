package fake_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/esf-dev/esf/sandbox"
	"github.com/esf-dev/esf/workspace"
	"github.com/esf-dev/esf/workspace/fake"
	"github.com/esf-dev/esf/workspace/workspacetest"
)

// conformanceLargeFile is the fake's round-trip size. The suite's default
// is 1 GiB; the fake keeps every byte in memory, so 1 GiB would hold 1 GiB
// (the machine has room) but cost seconds of hashing under -race for no
// extra coverage: the fake's Upload and Download are chunked the same at
// any size past a few chunks.
const conformanceLargeFile = 64 << 20

// slowCreate makes Create take a few milliseconds, as booting a sandbox
// does, so the suite's short Create deadlines expire while the session is
// half made and the fake's cleanup of it is exercised.
func slowCreate(ctx context.Context, op fake.Op, id string) error {
	if op != fake.OpCreate {
		return nil
	}
	select {
	case <-time.After(3 * time.Millisecond):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// largeFileEnv overrides conformanceLargeFile, e.g. with 1073741824 to
// measure the suite's default.
const largeFileEnv = "ESF_FAKE_LARGE_FILE"

func TestConformance(t *testing.T) {
	p, err := fake.New(fake.Options{Fault: slowCreate})
	if err != nil {
		t.Fatal(err)
	}
	size := int64(conformanceLargeFile)
	if v := os.Getenv(largeFileEnv); v != "" {
		if size, err = strconv.ParseInt(v, 10, 64); err != nil || size <= 0 {
			t.Fatalf("%s=%q: want a positive byte count", largeFileEnv, v)
		}
	}
	workspacetest.Run(t, workspacetest.Harness{
		Provider:  p,
		LargeFile: size,
		OpTimeout: 30 * time.Second,
	})
	if n := p.Live(); n != 0 {
		t.Errorf("after the suite, %d sessions are live", n)
	}
}

// TestConformanceSessionsFunc runs the suite's lifecycle checks counting
// through Harness.Sessions instead of the Enumerator, with another home.
func TestConformanceSessionsFunc(t *testing.T) {
	p, err := fake.New(fake.Options{Home: "/root"})
	if err != nil {
		t.Fatal(err)
	}
	h := workspacetest.Harness{
		Provider:  onlyProvider{p},
		Sessions:  func(context.Context) (int, error) { return p.Live(), nil },
		LargeFile: 1 << 20,
		OpTimeout: 30 * time.Second,
	}
	t.Run("Suite", func(t *testing.T) { workspacetest.Run(t, h) })
}

// onlyProvider hides the fake's Enumerator.
type onlyProvider struct{ workspace.Provider }

func TestOptionsValidate(t *testing.T) {
	for _, home := range []string{"home", "~/x", "/a\x00b"} {
		if _, err := fake.New(fake.Options{Home: home}); !errors.Is(err, fs.ErrInvalid) {
			t.Errorf("New with Home %q = %v, want fs.ErrInvalid", home, err)
		}
	}
	p, err := fake.New(fake.Options{Home: "/srv/"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := p.Create(context.Background(), workspace.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	if res, _ := s.Run(context.Background(), sandbox.Spec{}, "pwd; printenv HOME"); string(res.Stdout) != "/srv\n/srv\n" {
		t.Errorf("home /srv/: pwd and HOME = %q", res.Stdout)
	}
}

// TestFault: the hook sees every operation with the session id, its error
// fails the operation (wrapped, so errors.Is finds it), and a Create whose
// hook fails or outlives ctx leaves no session.
func TestFault(t *testing.T) {
	boom := errors.New("boom")
	var mu sync.Mutex
	var seen []string
	fail := map[fake.Op]bool{}
	p, err := fake.New(fake.Options{Fault: func(ctx context.Context, op fake.Op, id string) error {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, string(op))
		if fail[op] {
			return boom
		}
		if op == fake.OpCreate && fail["slow"] {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	setFail := func(op fake.Op, on bool) {
		mu.Lock()
		defer mu.Unlock()
		fail[op] = on
	}
	ctx := context.Background()

	setFail(fake.OpCreate, true)
	if _, err := p.Create(ctx, workspace.Spec{}); !errors.Is(err, boom) {
		t.Errorf("Create with a failing fault = %v", err)
	}
	if p.Live() != 0 {
		t.Errorf("a Create that failed in its fault hook left %d sessions", p.Live())
	}
	setFail(fake.OpCreate, false)

	// The hook blocks until ctx ends; the half-made session must go.
	setFail("slow", true)
	dctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	_, err = p.Create(dctx, workspace.Spec{})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || p.Live() != 0 {
		t.Errorf("Create whose ctx ended while booting = %v with %d live sessions", err, p.Live())
	}
	setFail("slow", false)

	s, err := p.Create(ctx, workspace.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, "f", []byte("x")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		op fake.Op
		do func() error
	}{
		{fake.OpRead, func() error { _, err := s.Read(ctx, "f"); return err }},
		{fake.OpRun, func() error { _, err := s.Run(ctx, sandbox.Spec{}, "true"); return err }},
		{fake.OpUpload, func() error { return s.Upload(ctx, "f", strings.NewReader("y")) }},
		{fake.OpGlob, func() error { _, err := s.Glob(ctx, "*"); return err }},
		{fake.OpPause, func() error { return s.(workspace.Pauser).Pause(ctx) }},
		{fake.OpSessions, func() error { _, err := p.Sessions(ctx); return err }},
		{fake.OpAttach, func() error { _, err := p.Attach(ctx, s.ID()); return err }},
		{fake.OpClose, func() error { return s.Close(ctx) }},
	} {
		setFail(tc.op, true)
		if err := tc.do(); !errors.Is(err, boom) {
			t.Errorf("%s with a failing fault = %v, want boom", tc.op, err)
		}
		setFail(tc.op, false)
		if err := tc.do(); err != nil {
			t.Errorf("%s after the fault cleared = %v", tc.op, err)
		}
	}
	// The failed Write left the file as it was; the failed Close left the
	// handle open until the second Close.
	if p.Live() != 0 {
		t.Errorf("after Close, %d sessions live", p.Live())
	}
	mu.Lock()
	defer mu.Unlock()
	for _, want := range []string{"create", "write", "read", "run", "upload", "glob", "pause", "sessions", "attach", "close"} {
		found := false
		for _, op := range seen {
			found = found || op == want
		}
		if !found {
			t.Errorf("the fault hook never saw %q (saw %q)", want, seen)
		}
	}
}

// TestTimeoutReclaims: Spec.Timeout is honoured with the injected clock: a
// running session past it is gone (ErrNotFound everywhere, not counted),
// while a paused one does not expire and Resume restarts its clock.
func TestTimeoutReclaims(t *testing.T) {
	var mu sync.Mutex
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); defer mu.Unlock(); now = now.Add(d) }
	p, err := fake.New(fake.Options{Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	short, err := p.Create(ctx, workspace.Spec{Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	paused, err := p.Create(ctx, workspace.Spec{Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	forever, err := p.Create(ctx, workspace.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer forever.Close(ctx)
	if err := paused.(workspace.Pauser).Pause(ctx); err != nil {
		t.Fatal(err)
	}
	advance(59 * time.Second)
	if _, err := short.Run(ctx, sandbox.Spec{}, "true"); err != nil {
		t.Fatalf("before its timeout: %v", err)
	}
	advance(time.Second)
	if _, err := short.Run(ctx, sandbox.Spec{}, "true"); !errors.Is(err, workspace.ErrNotFound) {
		t.Errorf("Run past Spec.Timeout = %v, want ErrNotFound", err)
	}
	if _, err := p.Attach(ctx, short.ID()); !errors.Is(err, workspace.ErrNotFound) {
		t.Errorf("Attach past Spec.Timeout = %v, want ErrNotFound", err)
	}
	if err := short.Close(ctx); !errors.Is(err, workspace.ErrNotFound) {
		t.Errorf("Close of a reclaimed session = %v, want ErrNotFound", err)
	}
	if n := p.Live(); n != 2 {
		t.Errorf("Live = %d, want 2 (the paused and the timeless session)", n)
	}
	advance(time.Hour)
	if err := paused.(workspace.Pauser).Resume(ctx); err != nil {
		t.Fatalf("Resume of a paused session past its timeout: %v", err)
	}
	advance(59 * time.Second)
	if _, err := paused.Run(ctx, sandbox.Spec{}, "true"); err != nil {
		t.Errorf("Resume did not restart the timeout: %v", err)
	}
	advance(time.Second)
	if _, err := paused.Read(ctx, "x"); !errors.Is(err, workspace.ErrNotFound) {
		t.Errorf("a resumed session past its timeout: %v, want ErrNotFound", err)
	}
	if n := p.Live(); n != 1 {
		t.Errorf("Live = %d, want 1", n)
	}
}
