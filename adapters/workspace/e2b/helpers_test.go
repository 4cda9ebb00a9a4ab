package e2b_test

import (
	"context"
	"testing"
	"time"

	"github.com/esf-dev/esf/adapters/workspace/e2b"
	"github.com/esf-dev/esf/adapters/workspace/e2b/e2bfake"
	"github.com/esf-dev/esf/workspace"
)

const testKey = "e2b_0123456789abcdef"

// newFake starts a fake and a provider that reaches envd through the fake's
// single URL (E2B_SANDBOX_URL style). edit may change the provider config.
func newFake(t *testing.T, opts e2bfake.Options, edit func(*e2b.Config)) (*e2bfake.Server, *e2b.Provider) {
	t.Helper()
	if opts.APIKey == "" {
		opts.APIKey = testKey
	}
	opts.Dir = t.TempDir()
	srv, err := e2bfake.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	cfg := e2b.Config{
		APIKey:       opts.APIKey,
		APIURL:       srv.URL,
		SandboxURL:   srv.URL,
		PollInterval: 20 * time.Millisecond,
	}
	if edit != nil {
		edit(&cfg)
	}
	p, err := e2b.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return srv, p
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func create(t *testing.T, p workspace.Provider, spec workspace.Spec) workspace.Session {
	t.Helper()
	s, err := p.Create(ctxT(t), spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}
