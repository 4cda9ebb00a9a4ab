package wasi

import "github.com/esf-dev/esf/errdefs"

// The classes Run and New return, re-exported from errdefs. Timeouts and
// cancellation wrap context.DeadlineExceeded and context.Canceled.
var (
	// ErrInvalidArgument: a bad Spec, a module that is not valid
	// WebAssembly, or one that imports what this runtime does not provide.
	ErrInvalidArgument = errdefs.ErrInvalidArgument
	// ErrNotFound: Root or a read-only mount source does not exist.
	ErrNotFound = errdefs.ErrNotFound
	// ErrQuotaExceeded: the module needed more memory than its limit.
	ErrQuotaExceeded = errdefs.ErrQuotaExceeded
	// ErrUnavailable: the Runtime is closed.
	ErrUnavailable = errdefs.ErrUnavailable
	// ErrUnsupported: this platform cannot confine a module to its root.
	ErrUnsupported = errdefs.ErrUnsupported
)
