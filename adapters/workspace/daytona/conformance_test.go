package daytona_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/esf-dev/esf/adapters/workspace/daytona"
	"github.com/esf-dev/esf/adapters/workspace/daytona/daytonafake"
	"github.com/esf-dev/esf/workspace"
	"github.com/esf-dev/esf/workspace/workspacetest"
)

const fakeKey = "fake-api-key"

// newFake starts a fake and a provider speaking to it; both are torn down
// with the test. It skips when the host cannot give sandboxes private
// mount namespaces.
func newFake(t *testing.T, opts daytonafake.Options, edit func(*daytona.Config)) (*daytonafake.Server, *daytona.Provider) {
	t.Helper()
	if opts.APIKey == "" && opts.JWT == "" {
		opts.APIKey = fakeKey
	}
	srv, err := daytonafake.New(opts)
	if err != nil {
		t.Skipf("fake Daytona unavailable on this host: %v", err)
	}
	t.Cleanup(srv.Close)
	cfg := daytona.Config{APIKey: opts.APIKey, APIURL: srv.URL(), PollInterval: 5 * time.Millisecond, PollMax: 100 * time.Millisecond}
	if opts.JWT != "" {
		cfg = daytona.Config{JWTToken: opts.JWT, OrganizationID: opts.OrganizationID, APIURL: srv.URL(), PollInterval: 5 * time.Millisecond, PollMax: 100 * time.Millisecond}
	}
	if edit != nil {
		edit(&cfg)
	}
	p, err := daytona.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return srv, p
}

// TestConformance runs the shared suite against the adapter and the fake,
// counting sessions with the fake's own count of live sandboxes (the
// Enumerator is exercised by the suite's lifecycle and pause checks).
func TestConformance(t *testing.T) {
	srv, p := newFake(t, daytonafake.Options{}, nil)
	workspacetest.Run(t, workspacetest.Harness{
		Provider:  p,
		Sessions:  func(context.Context) (int, error) { return srv.Live(), nil },
		LargeFile: 256 << 20,
		OpTimeout: time.Minute,
	})
	if n := srv.Processes(); n != 0 {
		t.Errorf("after the suite the fake still runs %d processes", n)
	}
}

// TestLiveConformance runs the suite against Daytona itself when
// DAYTONA_API_KEY and DAYTONA_IMAGE are set (DAYTONA_API_URL and
// DAYTONA_TARGET optional). DAYTONA_IMAGE is an OCI image reference, or a
// snapshot name when DAYTONA_IMAGE_IS_SNAPSHOT=1. Sessions are labelled
// with a per-run label so the leak checks see only this run's sandboxes.
func TestLiveConformance(t *testing.T) {
	image := os.Getenv("DAYTONA_IMAGE")
	cfg := daytona.ConfigFromEnv()
	if cfg.APIKey == "" || image == "" {
		t.Skip("DAYTONA_API_KEY and DAYTONA_IMAGE not set: live Daytona conformance skipped")
	}
	cfg.ImageKind = daytona.ImageOCI
	if os.Getenv("DAYTONA_IMAGE_IS_SNAPSHOT") == "1" {
		cfg.ImageKind = daytona.ImageSnapshot
	}
	cfg.Labels = map[string]string{"esf-live-run": time.Now().UTC().Format("20060102t150405")}
	p, err := daytona.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	workspacetest.Run(t, workspacetest.Harness{
		Provider:  p,
		Spec:      workspace.Spec{Image: image, Timeout: time.Hour},
		LargeFile: 256 << 20,
		OpTimeout: 5 * time.Minute,
	})
}
