package workspacetest

import (
	"context"
	"time"

	"github.com/esf-dev/esf/workspace"
)

// Harness is what a provider's test hands the suite.
type Harness struct {
	// Provider under test. Required.
	Provider workspace.Provider
	// Spec is used for every Create the suite makes (image, template...).
	// The suite adds its own Env and Metadata keys to a copy.
	Spec workspace.Spec
	// Sessions counts the provider's live sessions, for the leak checks.
	// When nil the suite uses the Provider's workspace.Enumerator; a
	// provider with neither fails the suite.
	Sessions func(ctx context.Context) (int, error)
	// LargeFile is the size of the big upload/download round trip; 0 means
	// 1 GiB. Remote adapters against fakes use 256 MiB.
	LargeFile int64
	// OpTimeout bounds each suite step; 0 means two minutes.
	OpTimeout time.Duration
}
