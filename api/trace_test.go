package api

import (
	"strings"
	"testing"
)

func TestParseTraceparent(t *testing.T) {
	const trace = "4bf92f3577b34da6a3ce929d0e0e4736"
	tests := []struct {
		name   string
		header string
		keep   bool // the caller's trace is continued
		flags  string
	}{
		{"valid", "00-" + trace + "-00f067aa0ba902b7-01", true, "01"},
		{"surrounding space", " 00-" + trace + "-00f067aa0ba902b7-00 ", true, "00"},
		{"future version with extra field", "01-" + trace + "-00f067aa0ba902b7-01-xyz", true, "01"},
		{"absent", "", false, "00"},
		{"version ff", "ff-" + trace + "-00f067aa0ba902b7-01", false, "00"},
		{"v00 with extra field", "00-" + trace + "-00f067aa0ba902b7-01-xyz", false, "00"},
		{"zero trace", "00-" + strings.Repeat("0", 32) + "-00f067aa0ba902b7-01", false, "00"},
		{"zero parent", "00-" + trace + "-0000000000000000-01", false, "00"},
		{"uppercase", "00-" + strings.ToUpper(trace) + "-00f067aa0ba902b7-01", false, "00"},
		{"short", "00-" + trace[:31] + "-00f067aa0ba902b7-01", false, "00"},
		{"bad separator", "00_" + trace + "-00f067aa0ba902b7-01", false, "00"},
		{"garbage", "hello", false, "00"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tc := parseTraceparent(tt.header)
			if len(tc.TraceID) != 32 || !isHex(tc.TraceID) || allZero(tc.TraceID) {
				t.Fatalf("trace id %q", tc.TraceID)
			}
			if len(tc.SpanID) != 16 || !isHex(tc.SpanID) || allZero(tc.SpanID) {
				t.Fatalf("span id %q", tc.SpanID)
			}
			if (tc.TraceID == trace) != tt.keep {
				t.Fatalf("trace id %s, continue caller's: %v", tc.TraceID, tt.keep)
			}
			if tc.Flags != tt.flags {
				t.Fatalf("flags %q, want %q", tc.Flags, tt.flags)
			}
			// What we send back is itself a valid version-00 traceparent.
			if back, _, ok := splitTraceparent(tc.String()); !ok || back != tc.TraceID {
				t.Fatalf("response traceparent %q does not parse", tc.String())
			}
		})
	}
	if a, b := parseTraceparent(""), parseTraceparent(""); a.TraceID == b.TraceID || a.SpanID == b.SpanID {
		t.Fatal("fresh traces repeat ids")
	}
}
