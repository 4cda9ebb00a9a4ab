package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/esf-dev/esf/errdefs"
)

// statusOf is the one table between the stable error codes and HTTP statuses.
// Several codes share a status (stale_generation and conflict are both 409):
// clients must switch on the code in the body, never on the status.
var statusOf = map[errdefs.Code]int{
	errdefs.CodeInvalidArgument:    http.StatusBadRequest,          // 400
	errdefs.CodeUnauthenticated:    http.StatusUnauthorized,        // 401
	errdefs.CodeNotFound:           http.StatusNotFound,            // 404
	errdefs.CodeConflict:           http.StatusConflict,            // 409
	errdefs.CodeStaleGeneration:    http.StatusConflict,            // 409
	errdefs.CodeFailedPrecondition: http.StatusPreconditionFailed,  // 412
	errdefs.CodeQuotaExceeded:      http.StatusTooManyRequests,     // 429
	errdefs.CodeInternal:           http.StatusInternalServerError, // 500
	errdefs.CodeCorrupt:            http.StatusInternalServerError, // 500: the daemon's own data is bad
	errdefs.CodeUnsupported:        http.StatusNotImplemented,      // 501
	errdefs.CodeUnavailable:        http.StatusServiceUnavailable,  // 503
	errdefs.CodeDeadlineExceeded:   http.StatusGatewayTimeout,      // 504
}

// HTTPStatus is the status a response with code carries.
func HTTPStatus(code errdefs.Code) int {
	if s, ok := statusOf[code]; ok {
		return s
	}
	return http.StatusInternalServerError
}

// ErrorBody is the body of every error response and of the Esf-Error trailer.
type ErrorBody = errdefs.Error

// maxJSONBody bounds request bodies that are JSON documents: every one of
// them is a few paths and ids. Tar streams are not JSON and are not bounded.
const maxJSONBody = 1 << 20

// decodeJSON decodes exactly one JSON object of type T from r: unknown fields,
// trailing data and bodies over maxJSONBody are invalid_argument, so a typo
// in a field name is an error instead of a silently ignored option.
func decodeJSON[T any](r io.Reader) (T, error) {
	var v T
	lr := &io.LimitedReader{R: r, N: maxJSONBody + 1}
	dec := json.NewDecoder(lr)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		if lr.N <= 0 {
			return v, fmt.Errorf("request body over %d bytes: %w", maxJSONBody, errdefs.ErrInvalidArgument)
		}
		if errors.Is(err, io.EOF) {
			return v, fmt.Errorf("empty request body: %w", errdefs.ErrInvalidArgument)
		}
		return v, fmt.Errorf("decode request: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	// One document only: "{} {}" or "{}x" is not a request we understand.
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		if lr.N <= 0 {
			return v, fmt.Errorf("request body over %d bytes: %w", maxJSONBody, errdefs.ErrInvalidArgument)
		}
		return v, fmt.Errorf("decode request: trailing data after the JSON object: %w", errdefs.ErrInvalidArgument)
	}
	return v, nil
}
