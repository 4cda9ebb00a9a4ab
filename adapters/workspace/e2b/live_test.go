package e2b_test

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/esf-dev/esf/adapters/workspace/e2b"
	"github.com/esf-dev/esf/workspace"
	"github.com/esf-dev/esf/workspace/workspacetest"
)

// TestLiveConformance runs the suite against the real E2B when
// E2B_API_KEY is set (E2B_DOMAIN, E2B_API_URL as the SDKs read them;
// E2B_TEMPLATE picks the template, default "base"; E2B_LARGE_FILE the
// transfer size in bytes, default 64 MiB). It counts sessions through the
// Enumerator, so other sandboxes of the same team must not come and go
// meanwhile.
func TestLiveConformance(t *testing.T) {
	cfg := e2b.ConfigFromEnv()
	if cfg.APIKey == "" {
		t.Skip("E2B_API_KEY not set: live E2B conformance skipped")
	}
	p, err := e2b.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	large := int64(64 << 20)
	if v, err := strconv.ParseInt(os.Getenv("E2B_LARGE_FILE"), 10, 64); err == nil && v > 0 {
		large = v
	}
	workspacetest.Run(t, workspacetest.Harness{
		Provider:  p,
		Spec:      workspace.Spec{Image: os.Getenv("E2B_TEMPLATE"), Timeout: 10 * time.Minute},
		LargeFile: large,
		OpTimeout: 3 * time.Minute,
	})
}
