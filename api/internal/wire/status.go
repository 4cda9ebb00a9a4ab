package wire

import (
	"net/http"
	"strings"

	"github.com/esf-dev/esf/errdefs"
)

// CodeForStatus guesses a code for a response that carries none (a proxy, a
// crash before the handler wrote its body). Statuses shared by several codes
// map to the most general one.
func CodeForStatus(status int) errdefs.Code {
	switch status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType,
		http.StatusMethodNotAllowed:
		return errdefs.CodeInvalidArgument
	case http.StatusUnauthorized:
		return errdefs.CodeUnauthenticated
	case http.StatusNotFound:
		return errdefs.CodeNotFound
	case http.StatusConflict:
		return errdefs.CodeConflict
	case http.StatusPreconditionFailed:
		return errdefs.CodeFailedPrecondition
	case http.StatusTooManyRequests:
		return errdefs.CodeQuotaExceeded
	case http.StatusNotImplemented:
		return errdefs.CodeUnsupported
	case http.StatusServiceUnavailable, http.StatusBadGateway:
		return errdefs.CodeUnavailable
	case http.StatusGatewayTimeout:
		return errdefs.CodeDeadlineExceeded
	}
	return errdefs.CodeInternal
}

// MediaType is the lowercased media type of a Content-Type header, without
// parameters.
func MediaType(h string) string {
	if i := strings.IndexByte(h, ';'); i >= 0 {
		h = h[:i]
	}
	return strings.ToLower(strings.TrimSpace(h))
}
