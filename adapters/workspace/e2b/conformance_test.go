package e2b_test

import (
	"context"
	"testing"

	"github.com/esf-dev/esf/adapters/workspace/e2b/e2bfake"
	"github.com/esf-dev/esf/workspace"
	"github.com/esf-dev/esf/workspace/workspacetest"
)

// TestConformance runs the shared workspace suite against the adapter and
// the offline fake, with a traffic token and a pause that takes a while so
// the 409-while-pausing path is exercised.
func TestConformance(t *testing.T) {
	e2bfake.RequireJail(t)
	srv, p := newFake(t, e2bfake.Options{TrafficToken: true}, nil)
	workspacetest.Run(t, workspacetest.Harness{
		Provider:  p,
		Spec:      workspace.Spec{Image: "base"},
		Sessions:  func(context.Context) (int, error) { return srv.Count(), nil },
		LargeFile: 256 << 20,
	})
	if n := srv.Processes(); n != 0 {
		t.Errorf("%d processes still running in the fake after the suite", n)
	}
}
