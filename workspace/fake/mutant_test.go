package fake_test

import (
	"context"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/esf-dev/esf/sandbox"
	"github.com/esf-dev/esf/vfs"
	"github.com/esf-dev/esf/workspace"
	"github.com/esf-dev/esf/workspace/fake"
	"github.com/esf-dev/esf/workspace/workspacetest"
)

// A conformance suite that cannot fail proves nothing. Each mutant below
// breaks one promise of the contract in a decorator over the fake; the
// suite, run against it in a child process, must fail in the subtest that
// owns that promise, with a message naming it.

const mutantEnv = "ESF_FAKE_MUTANT"

type mutant struct {
	name string
	sub  string // the suite subtest that must fail
	want string // a fragment of its failure message
}

var mutants = []mutant{
	{"close-noop", "Lifecycle", "on a closed handle"},
	{"stderr-merged", "Exec", "Run = stdout"},
	{"run-env-ignored", "Exec", "Run with Spec.Env"},
	{"mode-lost", "Files", "a file replaced by Write"},
	{"grep-unsorted", "Files", "Grep("},
	{"relative-to-root", "Paths", "then Read"},
	{"upload-partial", "Transfer", "want the old content"},
	{"attach-resumes", "Pause", "attached while paused"},
	{"create-leaks", "Cancellation", "a session leaked"},
	{"upload-ignores-ctx", "Cancellation", "Upload cancelled mid-stream"},
	{"timeout-ignored", "Cancellation", "Spec.Timeout was not enforced"},
	{"shared-tree", "Concurrency", "distinct ids"},
}

func TestSuiteCatchesMutants(t *testing.T) {
	if os.Getenv(mutantEnv) != "" {
		t.Skip("inside a mutant run")
	}
	for _, m := range mutants {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestMutant$/^"+m.sub+"$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), mutantEnv+"="+m.name)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed against mutant %q (%s must fail):\n%s", m.name, m.sub, tail(out))
			}
			if !strings.Contains(string(out), "--- FAIL: TestMutant/"+m.sub) || !strings.Contains(string(out), m.want) {
				t.Errorf("mutant %q: want %s to fail with %q; got:\n%s", m.name, m.sub, m.want, tail(out))
			}
		})
	}
}

func tail(b []byte) string {
	const n = 3000
	if len(b) > n {
		return "..." + string(b[len(b)-n:])
	}
	return string(b)
}

// TestMutant is the child: the suite against the mutant named in the
// environment.
func TestMutant(t *testing.T) {
	name := os.Getenv(mutantEnv)
	if name == "" {
		t.Skip("run by TestSuiteCatchesMutants")
	}
	if !slices.ContainsFunc(mutants, func(m mutant) bool { return m.name == name }) {
		t.Fatalf("unknown mutant %q", name)
	}
	var shared *fake.Provider
	p, err := fake.New(fake.Options{Fault: slowCreate})
	if err != nil {
		t.Fatal(err)
	}
	mp := &mutProvider{Provider: p, m: name}
	if name == "shared-tree" {
		// Every Create hands out a handle to one session.
		shared = p
		one, err := p.Create(context.Background(), workspace.Spec{})
		if err != nil {
			t.Fatal(err)
		}
		mp.one = one
	}
	workspacetest.Run(t, workspacetest.Harness{
		Provider: mp,
		Sessions: func(context.Context) (int, error) {
			if shared != nil {
				return shared.Live() - 1, nil
			}
			return p.Live(), nil
		},
		LargeFile: 4 << 20,
		OpTimeout: 3 * time.Second,
	})
}

type mutProvider struct {
	*fake.Provider
	m   string
	one workspace.Session
}

func (p *mutProvider) Create(ctx context.Context, spec workspace.Spec) (workspace.Session, error) {
	switch p.m {
	case "create-leaks":
		// Boots on regardless of ctx and drops the session when ctx ended.
		s, err := p.Provider.Create(context.WithoutCancel(ctx), spec)
		if err != nil {
			return nil, err
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		return &mutSession{Session: s, m: p.m}, nil
	case "shared-tree":
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		s, err := p.Provider.Attach(ctx, p.one.ID())
		if err != nil {
			return nil, err
		}
		return &mutSession{Session: s, m: p.m}, nil
	}
	s, err := p.Provider.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &mutSession{Session: s, m: p.m}, nil
}

func (p *mutProvider) Attach(ctx context.Context, id string) (workspace.Session, error) {
	s, err := p.Provider.Attach(ctx, id)
	if err != nil {
		return nil, err
	}
	if p.m == "attach-resumes" {
		if err := s.(workspace.Pauser).Resume(ctx); err != nil {
			return nil, err
		}
	}
	return &mutSession{Session: s, m: p.m}, nil
}

type mutSession struct {
	workspace.Session
	m string
}

func (s *mutSession) Pause(ctx context.Context) error {
	return s.Session.(workspace.Pauser).Pause(ctx)
}

func (s *mutSession) Resume(ctx context.Context) error {
	return s.Session.(workspace.Pauser).Resume(ctx)
}

func (s *mutSession) Close(ctx context.Context) error {
	if s.m == "close-noop" || s.m == "shared-tree" {
		return nil
	}
	return s.Session.Close(ctx)
}

func (s *mutSession) Run(ctx context.Context, spec sandbox.Spec, cmd string) (sandbox.Result, error) {
	switch s.m {
	case "stderr-merged":
		if spec.Stderr == nil {
			res, err := s.Session.Run(ctx, spec, cmd)
			res.Stdout, res.Stderr = append(res.Stdout, res.Stderr...), nil
			return res, err
		}
	case "run-env-ignored":
		spec.Env = nil
	case "timeout-ignored":
		spec.Timeout = 0
	}
	return s.Session.Run(ctx, spec, cmd)
}

func (s *mutSession) Write(ctx context.Context, p string, data []byte) error {
	if s.m == "mode-lost" {
		_ = s.Session.Delete(ctx, p)
	}
	return s.Session.Write(ctx, s.path(p), data)
}

func (s *mutSession) Read(ctx context.Context, p string) ([]byte, error) {
	return s.Session.Read(ctx, s.path(p))
}

// path re-spells p for the relative-to-root mutant, which resolves
// relative paths against "/" instead of the working directory.
func (s *mutSession) path(p string) string {
	if s.m == "relative-to-root" && p != "" && !strings.HasPrefix(p, "/") && !strings.HasPrefix(p, "~") {
		return "/" + p
	}
	return p
}

func (s *mutSession) Grep(ctx context.Context, pattern string, opts vfs.GrepOptions) ([]vfs.Match, error) {
	ms, err := s.Session.Grep(ctx, pattern, opts)
	if s.m == "grep-unsorted" {
		slices.Reverse(ms)
	}
	return ms, err
}

func (s *mutSession) Upload(ctx context.Context, p string, r io.Reader) error {
	switch s.m {
	case "upload-partial":
		// Writes what it got before the reader failed.
		data, err := io.ReadAll(r)
		if werr := s.Session.Write(ctx, p, data); werr != nil {
			return werr
		}
		return err
	case "upload-ignores-ctx":
		ctx = context.WithoutCancel(ctx)
	}
	return s.Session.Upload(ctx, p, r)
}
