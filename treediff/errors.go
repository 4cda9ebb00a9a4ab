package treediff

import "github.com/esf-dev/esf/errdefs"

// Error classes returned by treediff; test with errors.Is. A failed merge is
// also a *ConflictError (errors.As).
var (
	ErrConflict        = errdefs.ErrConflict
	ErrNotFound        = errdefs.ErrNotFound
	ErrCorrupt         = errdefs.ErrCorrupt
	ErrInvalidArgument = errdefs.ErrInvalidArgument
)
