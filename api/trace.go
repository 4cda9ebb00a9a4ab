package api

import (
	"strings"

	"github.com/esf-dev/esf/internal/randid"
)

// traceContext is the part of a W3C traceparent the daemon keeps: the trace
// the request belongs to, the span the daemon opens for it, and the flags.
type traceContext struct {
	TraceID string // 32 lowercase hex digits, not all zero
	SpanID  string // 16 lowercase hex digits, not all zero
	Flags   string // 2 hex digits
}

// String is the traceparent of the daemon's span, returned to the caller so
// that it can correlate its own trace with the daemon's logs and events.
func (t traceContext) String() string {
	return "00-" + t.TraceID + "-" + t.SpanID + "-" + t.Flags
}

// parseTraceparent reads the caller's traceparent and opens a span for the
// request under it. A missing or malformed header starts a new trace, as the
// W3C spec asks ("restart the trace"), rather than failing the request.
func parseTraceparent(h string) traceContext {
	tc := traceContext{SpanID: randid.Hex(8), Flags: "00"}
	if trace, flags, ok := splitTraceparent(strings.TrimSpace(h)); ok {
		tc.TraceID, tc.Flags = trace, flags
	} else {
		tc.TraceID = randid.Hex(16)
	}
	return tc
}

// splitTraceparent validates version-traceid-parentid-flags. Versions above
// 00 may append fields after the flags; version ff is invalid.
func splitTraceparent(h string) (trace, flags string, ok bool) {
	if len(h) < 55 {
		return "", "", false
	}
	version := h[0:2]
	if !isHex(version) || version == "ff" || h[2] != '-' || h[35] != '-' || h[52] != '-' {
		return "", "", false
	}
	if version == "00" && len(h) != 55 {
		return "", "", false
	}
	if len(h) > 55 && h[55] != '-' {
		return "", "", false
	}
	trace, parent, flags := h[3:35], h[36:52], h[53:55]
	if !isHex(trace) || !isHex(parent) || !isHex(flags) ||
		allZero(trace) || allZero(parent) {
		return "", "", false
	}
	return trace, flags, true
}

// isHex reports whether s is lowercase hex, as the spec requires.
func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

func allZero(s string) bool { return strings.Trim(s, "0") == "" }

// ParseTraceparent is what the API does with a request's traceparent, for
// esfd's other front doors (package e2b): the trace and span ids of the
// request (the caller's trace continued, or a new one) and the traceparent
// to answer with.
func ParseTraceparent(h string) (traceID, spanID, response string) {
	tc := parseTraceparent(h)
	return tc.TraceID, tc.SpanID, tc.String()
}
