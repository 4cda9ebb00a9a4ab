package cas

import "github.com/esf-dev/esf/errdefs"

// Error classes returned by stores and tree code; test with errors.Is.
var (
	ErrNotFound           = errdefs.ErrNotFound
	ErrCorrupt            = errdefs.ErrCorrupt
	ErrInvalidArgument    = errdefs.ErrInvalidArgument
	ErrUnsupported        = errdefs.ErrUnsupported
	ErrFailedPrecondition = errdefs.ErrFailedPrecondition
)
