package export

import "github.com/esf-dev/esf/errdefs"

// Error classes returned by export; test with errors.Is.
var (
	ErrNotFound           = errdefs.ErrNotFound
	ErrCorrupt            = errdefs.ErrCorrupt
	ErrInvalidArgument    = errdefs.ErrInvalidArgument
	ErrUnsupported        = errdefs.ErrUnsupported
	ErrFailedPrecondition = errdefs.ErrFailedPrecondition
)
