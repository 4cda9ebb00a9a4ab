// Package randid makes the random hex ids esf hands out: trace and span ids,
// generated idempotency keys, temporary file names.
package randid

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
)

// Hex returns n random bytes as 2n lowercase hex digits, never all zeros
// (W3C trace context forbids an all-zero trace or span id).
func Hex(n int) string {
	b := make([]byte, n)
	for {
		rand.Read(b) // never fails: crypto/rand panics rather than return an error
		if s := hex.EncodeToString(b); strings.Trim(s, "0") != "" {
			return s
		}
	}
}
