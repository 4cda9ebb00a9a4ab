package opensandbox_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/esf-dev/esf/adapters/workspace/opensandbox"
	"github.com/esf-dev/esf/adapters/workspace/opensandbox/osfake"
	"github.com/esf-dev/esf/workspace"
	"github.com/esf-dev/esf/workspace/workspacetest"
)

const testKey = "osfake-test-key"

// newFake starts a fake with an API key and returns it with a Provider
// aimed at it. cfg fields left zero get fast test defaults.
func newFake(t *testing.T, opts osfake.Options, cfg opensandbox.Config) (*osfake.Server, *opensandbox.Provider) {
	t.Helper()
	if opts.APIKey == "" {
		opts.APIKey = testKey
	}
	srv, err := osfake.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	if cfg.BaseURL == "" {
		cfg.BaseURL = srv.URL()
	}
	if cfg.APIKey == "" {
		cfg.APIKey = opts.APIKey
	}
	if cfg.Image == "" {
		cfg.Image = "ubuntu:24.04"
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 5 * time.Millisecond
	}
	if cfg.MaxPollInterval == 0 {
		cfg.MaxPollInterval = 50 * time.Millisecond
	}
	p, err := opensandbox.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return srv, p
}

// waitFor polls cond for up to d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestConformance runs the shared suite against the adapter and the fake.
// The fake's own count of live sandboxes is the leak check, and afterwards
// no command may still run in any sandbox.
func TestConformance(t *testing.T) {
	srv, p := newFake(t, osfake.Options{}, opensandbox.Config{})
	workspacetest.Run(t, workspacetest.Harness{
		Provider:  p,
		Sessions:  func(context.Context) (int, error) { return srv.Live(), nil },
		LargeFile: 256 << 20,
		OpTimeout: time.Minute,
	})
	waitFor(t, 10*time.Second, fmt.Sprintf("%d commands still run in the fake", srv.RunningCommands()),
		func() bool { return srv.RunningCommands() == 0 })
	t.Logf("fake: %d sandboxes created, %d commands run, %d requests", srv.Created(), srv.CommandsStarted(), srv.Requests())
}

// TestLiveConformance runs the suite against a real OpenSandbox server when
// OPENSANDBOX_API_KEY and OPENSANDBOX_URL are set (OPENSANDBOX_IMAGE picks
// the image, default ubuntu:24.04; OPENSANDBOX_USE_SERVER_PROXY=1 reaches
// execd through the server). Sandboxes are tagged with a per-run metadata
// label, and only those are counted.
func TestLiveConformance(t *testing.T) {
	key, base := os.Getenv("OPENSANDBOX_API_KEY"), os.Getenv("OPENSANDBOX_URL")
	if key == "" || base == "" {
		t.Skip("OPENSANDBOX_API_KEY and OPENSANDBOX_URL are not both set: live conformance skipped")
	}
	image := os.Getenv("OPENSANDBOX_IMAGE")
	if image == "" {
		image = "ubuntu:24.04"
	}
	run := fmt.Sprintf("r%d", time.Now().UnixNano())
	p, err := opensandbox.New(opensandbox.Config{
		BaseURL:        base,
		APIKey:         key,
		Image:          image,
		UseServerProxy: os.Getenv("OPENSANDBOX_USE_SERVER_PROXY") != "",
		// Only this run's sandboxes are counted and listed.
		Metadata: map[string]string{"esf-live-run": run},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("live OpenSandbox at %s, image %s, run tag esf-live-run=%s", base, image, run)
	var _ workspace.Enumerator = p
	workspacetest.Run(t, workspacetest.Harness{
		Provider:  p,
		LargeFile: 32 << 20,
		OpTimeout: 5 * time.Minute,
	})
}
