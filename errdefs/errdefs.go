package errdefs

import (
	"context"
	"errors"
)

// Code is a stable, machine-readable error code of the API.
type Code string

// The stable codes of DESIGN.md. Never rename one: scripts match on them.
const (
	CodeNotFound           Code = "not_found"
	CodeStaleGeneration    Code = "stale_generation"
	CodeConflict           Code = "conflict"
	CodeQuotaExceeded      Code = "quota_exceeded"
	CodeInvalidArgument    Code = "invalid_argument"
	CodeUnsupported        Code = "unsupported"
	CodeFailedPrecondition Code = "failed_precondition"
	CodeDeadlineExceeded   Code = "deadline_exceeded"
	CodeCorrupt            Code = "corrupt"
	CodeUnavailable        Code = "unavailable"
	CodeInternal           Code = "internal"
	// CodeUnauthenticated: a request on the network API without a valid
	// bearer token (HTTP 401).
	CodeUnauthenticated Code = "unauthenticated"
)

// The error classes. Wrap them; never compare with ==.
var (
	ErrNotFound           = errors.New("not found")
	ErrExists             = errors.New("already exists")
	ErrStaleGeneration    = errors.New("stale generation")
	ErrConflict           = errors.New("conflict")
	ErrQuotaExceeded      = errors.New("quota exceeded")
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrUnsupported        = errors.New("unsupported")
	ErrFailedPrecondition = errors.New("failed precondition")
	ErrCorrupt            = errors.New("corrupt object")
	ErrUnavailable        = errors.New("unavailable")
	ErrUnauthenticated    = errors.New("unauthenticated")
)

var classes = []struct {
	err  error
	code Code
}{
	{ErrNotFound, CodeNotFound},
	{ErrStaleGeneration, CodeStaleGeneration},
	{ErrConflict, CodeConflict},
	{ErrExists, CodeConflict},
	{ErrQuotaExceeded, CodeQuotaExceeded},
	{ErrInvalidArgument, CodeInvalidArgument},
	{ErrUnsupported, CodeUnsupported},
	{ErrFailedPrecondition, CodeFailedPrecondition},
	{ErrCorrupt, CodeCorrupt},
	{ErrUnavailable, CodeUnavailable},
	{ErrUnauthenticated, CodeUnauthenticated},
	{context.DeadlineExceeded, CodeDeadlineExceeded},
	{context.Canceled, CodeDeadlineExceeded},
}

// CodeOf names the class of err; unknown errors are CodeInternal.
func CodeOf(err error) Code {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	for _, c := range classes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return CodeInternal
}

// Class returns the sentinel error for a code, or nil for CodeInternal and
// unknown codes.
func Class(code Code) error {
	for _, c := range classes {
		if c.code == code {
			return c.err
		}
	}
	return nil
}

// Error is an error that crossed the API: a code and the server's message.
// It matches its class with errors.Is.
type Error struct {
	Code    Code   `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string {
	if e.Message == "" {
		return string(e.Code)
	}
	return e.Message
}

// Is reports whether target is the class of e's code.
func (e *Error) Is(target error) bool {
	c := Class(e.Code)
	return c != nil && c == target
}

// Wire turns any error into the form the API sends.
func Wire(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Code: CodeOf(err), Message: err.Error()}
}
