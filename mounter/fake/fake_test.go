package fake_test

import (
	"testing"

	"github.com/esf-dev/esf/mounter"
	"github.com/esf-dev/esf/mounter/fake"
	"github.com/esf-dev/esf/mounter/mountertest"
)

// TestConformance runs the mounter suite against the fake, as any user.
func TestConformance(t *testing.T) {
	mountertest.Run(t, func(*testing.T) mounter.Mounter { return fake.New() })
}
