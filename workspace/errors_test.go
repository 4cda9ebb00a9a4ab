package workspace_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"testing"
	"time"

	"github.com/esf-dev/esf/workspace"
)

func TestErrUnsupportedIsStdlib(t *testing.T) {
	err := fmt.Errorf("pause: %w", workspace.ErrUnsupported)
	if !errors.Is(err, errors.ErrUnsupported) {
		t.Error("workspace.ErrUnsupported does not match errors.ErrUnsupported")
	}
}

func TestProviderError(t *testing.T) {
	for _, tc := range []struct {
		name  string
		pe    *workspace.ProviderError
		class error
		text  string
	}{
		{"no class is ErrProvider", &workspace.ProviderError{Provider: "e2b", Op: "create", Status: 502, Message: "bad gateway"},
			workspace.ErrProvider, "e2b create: HTTP 502: bad gateway"},
		{"rate limit is policy", &workspace.ProviderError{Provider: "daytona", Op: "run", Status: 429, Code: "rate_limited", Class: workspace.ErrPolicy, RetryAfter: time.Second},
			workspace.ErrPolicy, "daytona run: HTTP 429: rate_limited"},
		{"not found", &workspace.ProviderError{Provider: "opensandbox", Op: "attach", Status: 404, Class: workspace.ErrNotFound},
			workspace.ErrNotFound, "opensandbox attach: HTTP 404"},
		{"file class through a PathError", &workspace.ProviderError{Provider: "e2b", Op: "download", Code: "not_found", Class: &fs.PathError{Op: "download", Path: "/x", Err: fs.ErrNotExist}},
			fs.ErrNotExist, "e2b download: not_found"},
	} {
		err := fmt.Errorf("wrapped: %w", tc.pe)
		if !errors.Is(err, tc.class) {
			t.Errorf("%s: %v does not match its class %v", tc.name, err, tc.class)
		}
		for _, other := range []error{workspace.ErrNotFound, workspace.ErrPolicy, workspace.ErrProvider, workspace.ErrClosed, workspace.ErrPaused, fs.ErrNotExist} {
			if other != tc.class && errors.Is(err, other) {
				t.Errorf("%s: %v also matches %v", tc.name, err, other)
			}
		}
		var pe *workspace.ProviderError
		if !errors.As(err, &pe) || pe != tc.pe {
			t.Errorf("%s: errors.As does not find the *ProviderError", tc.name)
		}
		if got := tc.pe.Error(); got != tc.text {
			t.Errorf("%s: Error() = %q, want %q", tc.name, got, tc.text)
		}
	}
}

func TestContextError(t *testing.T) {
	transport := errors.New("connection reset by peer")
	if err := workspace.ContextError(context.Background(), "run", transport); err != transport {
		t.Errorf("with a live ctx, ContextError = %v, want the error unchanged", err)
	}
	if err := workspace.ContextError(context.Background(), "run", nil); err != nil {
		t.Errorf("ContextError(nil) = %v", err)
	}

	dctx, cancel := context.WithTimeout(context.Background(), -time.Second)
	defer cancel()
	err := workspace.ContextError(dctx, "run", transport)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, workspace.ErrProvider) {
		t.Errorf("after a deadline, ContextError = %v; want it to match context.DeadlineExceeded only", err)
	}
	if want := "run: context deadline exceeded (connection reset by peer)"; err.Error() != want {
		t.Errorf("after a deadline, ContextError says %q, want %q", err, want)
	}

	cctx, ccancel := context.WithCancel(context.Background())
	ccancel()
	if err := workspace.ContextError(cctx, "upload", transport); !errors.Is(err, context.Canceled) {
		t.Errorf("after cancel, ContextError = %v; want context.Canceled", err)
	}
	already := fmt.Errorf("read body: %w", context.Canceled)
	if err := workspace.ContextError(cctx, "upload", already); err != already {
		t.Errorf("an error already matching ctx.Err() came back as %v", err)
	}
	// A provider failure that is not the context's fault is not relabelled
	// while ctx lives, even when it is a ProviderError.
	pe := &workspace.ProviderError{Provider: "x", Op: "run", Class: workspace.ErrPolicy}
	if err := workspace.ContextError(context.Background(), "run", pe); !errors.Is(err, workspace.ErrPolicy) {
		t.Errorf("ContextError with a live ctx changed the class: %v", err)
	}
}

// TestContextErrorWithCause: a cause set with WithTimeoutCause or
// WithCancelCause must not hide the context class, or a caller's
// errors.Is(err, context.DeadlineExceeded) misses a timeout.
func TestContextErrorWithCause(t *testing.T) {
	cause := errors.New("lease expired")
	ctx, cancel := context.WithTimeoutCause(context.Background(), -time.Second, cause)
	defer cancel()
	err := workspace.ContextError(ctx, "run", errors.New("connection reset"))
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, cause) {
		t.Errorf("ContextError with a deadline cause = %v; want it to match context.DeadlineExceeded and the cause", err)
	}
	cctx, ccancel := context.WithCancelCause(context.Background())
	ccancel(cause)
	err = workspace.ContextError(cctx, "run", errors.New("connection reset"))
	if !errors.Is(err, context.Canceled) || !errors.Is(err, cause) {
		t.Errorf("ContextError with a cancel cause = %v; want it to match context.Canceled and the cause", err)
	}
}
