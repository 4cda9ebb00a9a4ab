package journal

import (
	"errors"
	"fmt"

	"github.com/esf-dev/esf/errdefs"
)

// Error classes returned by stores and the record helpers; test with
// errors.Is. They are the errdefs classes, so the API maps them to stable codes.
var (
	ErrNotFound           = errdefs.ErrNotFound
	ErrExists             = errdefs.ErrExists
	ErrConflict           = errdefs.ErrConflict
	ErrStaleGeneration    = errdefs.ErrStaleGeneration
	ErrFailedPrecondition = errdefs.ErrFailedPrecondition
	ErrInvalidArgument    = errdefs.ErrInvalidArgument
	ErrCorrupt            = errdefs.ErrCorrupt
	ErrUnsupported        = errdefs.ErrUnsupported
	ErrUnavailable        = errdefs.ErrUnavailable
)

// ErrClosed is returned by every operation on a closed Store. It is an
// ErrUnavailable: the caller may retry against a reopened store.
var ErrClosed = fmt.Errorf("journal closed: %w", errdefs.ErrUnavailable)

// ErrStop, returned by a Scan or Events callback, ends the iteration early;
// the Scan then returns nil. It is never returned to callers.
var ErrStop = errors.New("journal: stop iteration")
