package e2b

import (
	"context"
	"errors"
	"io/fs"
	"net/http"
	"strconv"
	"time"

	"connectrpc.com/connect"

	"github.com/esf-dev/esf/adapters/workspace/e2b/envd"
	"github.com/esf-dev/esf/workspace"
)

const codeAlreadyExists = connect.CodeAlreadyExists

func isCode(err error, c connect.Code) bool {
	var ce *connect.Error
	return errors.As(err, &ce) && ce.Code() == c
}

// mapErr is the one translation of envd failures into the contract's
// classes. path is the sandbox path a file operation was about ("" for
// Run); file classes come back inside a *fs.PathError. Answers that mean
// "the proxy cannot reach the sandbox" (unavailable, 502/503/504) are
// resolved with the control plane: gone is ErrNotFound, paused ErrPaused.
func (s *Session) mapErr(ctx context.Context, op, path string, err error) error {
	if err == nil {
		return nil
	}
	name := s.p.cfg.Name
	if ctx.Err() != nil {
		return workspace.ContextError(ctx, name+" "+op, err)
	}
	pe := &workspace.ProviderError{Provider: name, Op: op, Message: err.Error()}
	var (
		ce *connect.Error
		he *envd.HTTPError
	)
	switch {
	case errors.As(err, &ce):
		pe.Code, pe.Message = ce.Code().String(), ce.Message()
		switch ce.Code() {
		case connect.CodeNotFound:
			pe.Class = fs.ErrNotExist
		case connect.CodeInvalidArgument, connect.CodeOutOfRange:
			pe.Class = fs.ErrInvalid
		case connect.CodeAlreadyExists:
			pe.Class = fs.ErrExist
		case connect.CodePermissionDenied:
			pe.Class = workspace.ErrPolicy
			if path != "" {
				pe.Class = fs.ErrPermission
			}
		case connect.CodeUnauthenticated, connect.CodeResourceExhausted:
			pe.Class = workspace.ErrPolicy
		case connect.CodeDeadlineExceeded:
			pe.Class = context.DeadlineExceeded
		case connect.CodeCanceled:
			pe.Class = context.Canceled
		case connect.CodeUnavailable, connect.CodeUnimplemented:
			return s.probe(ctx, pe)
		}
		if ra := ce.Meta().Get("Retry-After"); ra != "" {
			pe.RetryAfter = parseRetryAfter(ra)
		}
	case errors.As(err, &he):
		pe.Status, pe.Message = he.Status, he.Message
		switch he.Status {
		case http.StatusBadRequest:
			pe.Class = fs.ErrInvalid
		case http.StatusNotFound:
			pe.Class = fs.ErrNotExist
		case http.StatusUnauthorized, http.StatusForbidden, http.StatusInsufficientStorage:
			pe.Class = workspace.ErrPolicy
		case http.StatusTooManyRequests:
			pe.Class = workspace.ErrPolicy
			pe.RetryAfter = parseRetryAfter(he.RetryAfter)
		case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			return s.probe(ctx, pe)
		}
	}
	if path != "" && isFileClass(pe.Class) {
		return &fs.PathError{Op: op, Path: path, Err: pe}
	}
	return pe
}

func isFileClass(err error) bool {
	return err == fs.ErrNotExist || err == fs.ErrInvalid || err == fs.ErrExist || err == fs.ErrPermission
}

func parseRetryAfter(v string) time.Duration {
	if n, err := strconv.Atoi(v); err == nil && n >= 0 {
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(0, time.Until(t))
	}
	return 0
}

// probe asks the control plane why envd could not be reached.
func (s *Session) probe(ctx context.Context, pe *workspace.ProviderError) error {
	sb, err := s.p.api.get(ctx, s.id)
	switch {
	case errors.Is(err, workspace.ErrNotFound):
		pe.Class = workspace.ErrNotFound
	case err != nil:
	case sb.State == "paused" || sb.State == "pausing":
		s.mu.Lock()
		s.paused, s.env = true, nil
		s.mu.Unlock()
		pe.Class = workspace.ErrPaused
	}
	return pe
}

const (
	codeNotFound        = connect.CodeNotFound
	codeInvalidArgument = connect.CodeInvalidArgument
)
