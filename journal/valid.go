package journal

import (
	"encoding/json"
	"math"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Allocation-free forms of the field checks. The error-building checks box
// every argument of their message (fmt's ...any escapes), even when the
// field is fine: that was about a fifth of the allocations of a fork (issue
// 21). So Validate of the records a graph mutation reads and writes first
// asks these predicates, and only when one says no runs the checks that
// explain what is wrong. A predicate may be stricter than its check (the
// check then finds nothing, and Validate returns nil), never laxer:
// TestValidFastPath holds them to that.

func idOK(k Kind, id string) bool {
	if len(id) <= len(k)+1 || len(id) > len(k)+1+maxIDSuffix || id[len(k)] != '_' || !strings.HasPrefix(id, string(k)) {
		return false
	}
	for i := len(k) + 1; i < len(id); i++ {
		if c := id[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'z') {
			return false
		}
	}
	return true
}

func optIDOK(k Kind, id string) bool { return id == "" || idOK(k, id) }

// hexOK: exactly n lowercase hex digits.
func hexOK(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

func optHexOK(s string, n int) bool { return s == "" || hexOK(s, n) }

func jsonOK(b json.RawMessage) bool { return len(b) == 0 || json.Valid(b) }

func stringOK(s string, limit int) bool { return len(s) <= limit && utf8.ValidString(s) }

func nameOK(s string) bool { return s != "" && stringOK(s, maxNameLen) }

func textOK(s string) bool { return stringOK(s, maxTextLen) }

func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

func idempotencyKeyOK(key string) bool {
	if key == "" || len(key) > MaxIdempotencyKeyLen {
		return false
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c == 0x7f || c >= utf8.RuneSelf {
			// Control characters, and anything not ASCII: the full check
			// decides (UTF-8, C1 controls).
			return asciiFree(key)
		}
	}
	return true
}

// asciiFree is CheckIdempotencyKey's rule for a key with non-ASCII bytes or
// controls, still without allocating.
func asciiFree(key string) bool {
	if !utf8.ValidString(key) {
		return false
	}
	for _, r := range key {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}

func (n *Node) ok() bool {
	if !idOK(KindNode, n.NodeID) || !idOK(KindGroup, n.GroupID) || !hexOK(n.RootID, 64) || !jsonOK(n.LogicalState) ||
		!n.Status.Valid() || !finite(n.Value) || !n.Provenance.ok() || len(n.Parents) > 16 {
		return false
	}
	for i, p := range n.Parents {
		if !idOK(KindNode, p) || p == n.NodeID {
			return false
		}
		for _, q := range n.Parents[:i] {
			if q == p {
				return false
			}
		}
	}
	return true
}

func (p *Provenance) ok() bool {
	return nameOK(p.Op) && textOK(p.Source) && optIDOK(KindAttempt, p.AttemptID) && textOK(p.Executor) &&
		jsonOK(p.Environment) && textOK(p.IdempotencyKey) && textOK(p.TraceID)
}

func (e *Evaluation) ok() bool {
	if !idOK(KindEvaluation, e.EvaluationID) || !idOK(KindNode, e.NodeID) || !optIDOK(KindAttempt, e.AttemptID) ||
		!idOK(KindGroup, e.GroupID) || !nameOK(e.Evaluator) || !nameOK(e.EvaluatorVersion) || !finite(e.Reward) || !textOK(e.Verdict) {
		return false
	}
	for _, id := range e.Evidence {
		if !hexOK(id, 64) {
			return false
		}
	}
	return true
}

func (e *IdempotencyEntry) ok() bool {
	if !idempotencyKeyOK(e.Key) || !nameOK(e.Op) || len(e.Fingerprint) != len("sha256:")+64 ||
		!(e.ExpiresAt.IsZero() || e.ExpiresAt.After(e.CreatedAt)) {
		return false
	}
	if e.ResultParts == 0 {
		return e.ResultSize == 0 && e.ResultDigest == "" && len(e.Result) > 0 && json.Valid(e.Result)
	}
	return (len(e.Result) == 0 || int64(len(e.Result)) == e.ResultSize) &&
		e.ResultSize > InlineResultSize && e.ResultSize <= MaxResultSize &&
		int64(e.ResultParts) == (e.ResultSize+resultPartSize-1)/resultPartSize &&
		len(e.ResultDigest) == len("sha256:")+64 && strings.HasPrefix(e.ResultDigest, "sha256:")
}

func (ev *Event) ok() bool {
	return nameOK(ev.Type) && optIDOK(KindGroup, ev.GroupID) && optIDOK(KindNode, ev.NodeID) &&
		optIDOK(KindAttempt, ev.AttemptID) && optIDOK(KindLease, ev.LeaseID) && optHexOK(ev.RootID, 64) &&
		optHexOK(ev.TraceID, 32) && optHexOK(ev.SpanID, 16) && optHexOK(ev.ParentSpanID, 16) &&
		textOK(ev.IdempotencyKey) && jsonOK(ev.Data)
}
