package workspace

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// The minimal portable error taxonomy. Providers wrap these (with %w) so
// callers test with errors.Is; timeouts and cancellation are reported by
// wrapping context.DeadlineExceeded and context.Canceled themselves, and
// file operations use the io/fs classes (fs.ErrNotExist, fs.ErrInvalid,
// fs.ErrPermission, fs.ErrExist).
var (
	// ErrNotFound: the session does not exist (never did, was closed, or
	// the provider reclaimed it).
	ErrNotFound = errors.New("workspace: session not found")
	// ErrUnsupported: the provider does not offer the operation. It is
	// errors.ErrUnsupported itself, so either test matches.
	ErrUnsupported = errors.ErrUnsupported
	// ErrPolicy: the provider refused by policy: quota, rate limit,
	// authentication, authorisation, a forbidden image or path.
	ErrPolicy = errors.New("workspace: refused by policy")
	// ErrClosed: this handle was closed.
	ErrClosed = errors.New("workspace: session closed")
	// ErrPaused: the session is paused; Resume it first.
	ErrPaused = errors.New("workspace: session paused")
	// ErrProvider: anything else the provider reported (5xx, protocol
	// violations). Errors of this class carry a *ProviderError.
	ErrProvider = errors.New("workspace: provider error")
)

// ProviderError keeps what the provider said, for logs and for callers that
// need more than the class. It unwraps to the class it was mapped to, so
// errors.Is(err, ErrPolicy) holds for a mapped 429.
type ProviderError struct {
	Provider string // "esf", "e2b", ...
	Op       string // "create", "run", "upload", ...
	Status   int    // HTTP status, 0 when not HTTP
	Code     string // the provider's own error code, if any
	Message  string // the provider's message
	Class    error  // one of the classes above, or fs.Err*, or nil (= ErrProvider)
	// RetryAfter is the provider's hint (Retry-After) when it rate-limited.
	RetryAfter time.Duration
}

func (e *ProviderError) Error() string {
	s := fmt.Sprintf("%s %s", e.Provider, e.Op)
	if e.Status != 0 {
		s += fmt.Sprintf(": HTTP %d", e.Status)
	}
	if e.Code != "" {
		s += ": " + e.Code
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// Unwrap exposes the class, so errors.Is reaches wrapped classes such as
// fs.ErrNotExist inside a *fs.PathError.
func (e *ProviderError) Unwrap() error {
	if e.Class == nil {
		return ErrProvider
	}
	return e.Class
}

// ContextError turns a failure that happened because ctx ended into an error
// that matches both ctx's error and, for deadlines, the cause; it returns
// err unchanged when ctx is still live. Adapters call it on every transport
// error so a timeout never surfaces as a bare "connection reset".
func ContextError(ctx context.Context, op string, err error) error {
	if err == nil || ctx.Err() == nil {
		return err
	}
	if errors.Is(err, ctx.Err()) {
		return err
	}
	// A cause set with WithTimeoutCause/WithCancelCause replaces ctx.Err() in
	// context.Cause; keep both so the class still matches.
	if cause := context.Cause(ctx); cause != ctx.Err() {
		return fmt.Errorf("%s: %w: %w (%v)", op, ctx.Err(), cause, err)
	}
	return fmt.Errorf("%s: %w (%v)", op, ctx.Err(), err)
}
