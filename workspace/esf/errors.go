package esf

import (
	"context"
	"errors"
	"fmt"

	"github.com/esf-dev/esf/api/client"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/internal/randid"
	"github.com/esf-dev/esf/workspace"
)

// ProviderName is the Provider field of every *workspace.ProviderError this
// package returns.
const ProviderName = "esf"

// mapErr is the one translation from what the esf API returns (always an
// *errdefs.Error with a stable code) to the workspace classes:
//
//	not_found, invalid_argument  -> workspace.ErrNotFound when the id named a session (session true)
//	quota_exceeded               -> workspace.ErrPolicy
//	deadline_exceeded            -> context.DeadlineExceeded (an exec timeout; esf also sends it for a cancelled call)
//	unsupported                  -> workspace.ErrUnsupported
//	anything else                -> workspace.ErrProvider
//
// each inside a *workspace.ProviderError{Provider: "esf"} that keeps the
// code and message. When ctx has ended, the result matches ctx's error
// instead (workspace.ContextError): esf reports a cancelled call as
// deadline_exceeded, which must not read as a timeout.
func mapErr(ctx context.Context, op string, err error, session bool) error {
	if err == nil {
		return nil
	}
	code := errdefs.CodeOf(err)
	var class error
	switch code {
	case errdefs.CodeNotFound, errdefs.CodeInvalidArgument:
		if session {
			class = workspace.ErrNotFound
		}
	case errdefs.CodeQuotaExceeded:
		class = workspace.ErrPolicy
	case errdefs.CodeDeadlineExceeded:
		class = context.DeadlineExceeded
	case errdefs.CodeUnsupported:
		class = workspace.ErrUnsupported
	}
	perr := &workspace.ProviderError{Provider: ProviderName, Op: op, Code: string(code), Message: err.Error(), Class: class}
	return workspace.ContextError(ctx, ProviderName+" "+op, perr)
}

// outcomeUnknown reports whether a failed mutation may nevertheless have
// been applied by the daemon: the call was cut (ctx, transport) rather
// than refused. Cleanup replays such a call under its idempotency key to
// learn what it made.
func outcomeUnknown(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return true
	}
	switch errdefs.CodeOf(err) {
	case errdefs.CodeUnavailable, errdefs.CodeDeadlineExceeded, errdefs.CodeInternal:
		return true
	}
	return false
}

// codeIs reports whether err carries one of codes.
func codeIs(err error, codes ...errdefs.Code) bool {
	if err == nil {
		return false
	}
	c := errdefs.CodeOf(err)
	for _, want := range codes {
		if c == want {
			return true
		}
	}
	return false
}

// invalid is a request this provider refuses before asking the daemon.
func invalid(op, format string, args ...any) error {
	return &workspace.ProviderError{Provider: ProviderName, Op: op, Code: string(errdefs.CodeInvalidArgument),
		Message: fmt.Sprintf(format, args...)}
}

// stateError is the error of an operation on a handle that cannot serve it.
func stateError(op, id string, class error) error {
	return fmt.Errorf("%s %s %s: %w", ProviderName, op, id, class)
}

func isStateClass(err error) bool {
	return errors.Is(err, workspace.ErrClosed) || errors.Is(err, workspace.ErrPaused) || errors.Is(err, workspace.ErrNotFound)
}

// newKey makes an idempotency key for one mutation, kept so that cleanup
// can replay it.
func newKey(op string) string { return "esf-ws-" + op + "-" + randid.Hex(12) }

// keyed is the call options of a mutation under key, one newKey made up
// for this package's own retries: the daemon forgets its result after a
// day, not for ever.
func keyed(key string) client.CallOptions {
	return client.CallOptions{IdempotencyKey: key, KeyGenerated: true}
}
