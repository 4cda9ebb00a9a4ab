package cubesandbox_test

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/esf-dev/esf/adapters/workspace/cubesandbox"
	"github.com/esf-dev/esf/workspace"
	"github.com/esf-dev/esf/workspace/workspacetest"
)

// TestLiveConformance runs the suite against a real CubeSandbox when its
// configuration is present: CUBE_API_URL (or E2B_API_URL), CUBE_API_KEY
// (or E2B_API_KEY) and CUBE_TEMPLATE_ID, plus the data-plane variables
// ConfigFromEnv reads. CUBE_LARGE_FILE sets the transfer size (default
// 64 MiB).
func TestLiveConformance(t *testing.T) {
	cfg := cubesandbox.ConfigFromEnv()
	if cfg.APIURL == "" || cfg.APIKey == "" || cfg.Template == "" {
		t.Skip("CUBE_API_URL/E2B_API_URL, CUBE_API_KEY/E2B_API_KEY and CUBE_TEMPLATE_ID not all set: live CubeSandbox conformance skipped")
	}
	p, err := cubesandbox.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	large := int64(64 << 20)
	if v, err := strconv.ParseInt(os.Getenv("CUBE_LARGE_FILE"), 10, 64); err == nil && v > 0 {
		large = v
	}
	workspacetest.Run(t, workspacetest.Harness{
		Provider:  p,
		Spec:      workspace.Spec{Timeout: 10 * time.Minute},
		LargeFile: large,
		OpTimeout: 3 * time.Minute,
	})
}
