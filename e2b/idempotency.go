package e2b

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/esf-dev/esf/fabric"
)

// Idempotency: create, fork, snapshot and pause honour the Idempotency-Key
// header of the /v1 API. The first call with a key runs; a call with the
// same key and the same request (method, path, body) gets the first one's
// answer (a retried create: the same sandbox, token included), waiting for
// it if it is still running; a different request under the key is 409.
// The fabric calls it makes carry keys derived from it ("e2b-KEY-STEP"),
// so a retry after a failure replays the steps that succeeded instead of
// doing them twice; without the header the fabric makes up its keys as
// before. A failed call is not remembered (its retry runs again, and finds
// the fabric keys it spent: start refuses an activation replayed under
// the key whose attempt has ended since). Answers
// are kept in memory (at most maxIdempotent keys, the oldest dropped).

// HeaderIdempotencyKey is the header a caller names its key with.
const HeaderIdempotencyKey = "Idempotency-Key"

// maxIdempotencyKey bounds the key (room left for the derived fabric keys).
const maxIdempotencyKey = 200

// maxIdempotent bounds the remembered keys.
const maxIdempotent = 10000

type idemEntry struct {
	fp     [32]byte
	done   chan struct{}
	status int
	body   any
	err    error
}

type idemKey struct{}

// keyFrom returns the request's Idempotency-Key, if it sent one.
func keyFrom(ctx context.Context) string {
	k, _ := ctx.Value(idemKey{}).(string)
	return k
}

// withStep gives ctx the fabric idempotency key of one step of an
// idempotent call: derived from the caller's key, or none (the fabric
// makes one up) when the caller sent none.
func withStep(ctx context.Context, step string) context.Context {
	k := keyFrom(ctx)
	if k == "" {
		return ctx
	}
	ci, _ := fabric.CallInfoFrom(ctx)
	ci.IdempotencyKey, ci.KeyGenerated = "e2b-"+k+"-"+step, false
	return fabric.WithCallInfo(ctx, ci)
}

// sandboxIDFor is a new sandbox's id: derived from the caller's key (and
// the sandbox's index in the call) so a retry names the same sandbox, else
// random.
func sandboxIDFor(ctx context.Context, i int) string {
	k := keyFrom(ctx)
	if k == "" {
		return newSandboxID()
	}
	h := sha256.Sum256([]byte("e2b sandbox\x00" + k + "\x00" + strconv.Itoa(i)))
	return "i" + sandboxIDEncoding.EncodeToString(h[:13])[:20]
}

func parseKey(vals []string) (string, error) {
	if len(vals) == 0 {
		return "", nil
	}
	if len(vals) > 1 {
		return "", httpErr(http.StatusBadRequest, "%s given %d times", HeaderIdempotencyKey, len(vals))
	}
	k := vals[0]
	if k == "" || len(k) > maxIdempotencyKey {
		return "", httpErr(http.StatusBadRequest, "%s: want 1 to %d characters", HeaderIdempotencyKey, maxIdempotencyKey)
	}
	for i := 0; i < len(k); i++ {
		if k[i] <= ' ' || k[i] > '~' {
			return "", httpErr(http.StatusBadRequest, "%s: want visible ASCII characters only", HeaderIdempotencyKey)
		}
	}
	return k, nil
}

// idempotent wraps a mutating handler with the Idempotency-Key header.
func (s *Server) idempotent(h func(w http.ResponseWriter, r *http.Request) (int, any, error)) func(w http.ResponseWriter, r *http.Request) (int, any, error) {
	return func(w http.ResponseWriter, r *http.Request) (int, any, error) {
		key, err := parseKey(r.Header.Values(HeaderIdempotencyKey))
		if err != nil || key == "" {
			if err != nil {
				return 0, nil, err
			}
			return h(w, r)
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20+1))
		if err != nil {
			return 0, nil, httpErr(http.StatusBadRequest, "Error when parsing request: %v", err)
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		fp := sha256.Sum256(fmt.Appendf(nil, "%s\x00%s\x00%s", r.Method, r.URL.Path, body))
		s.mu.Lock()
		e, ok := s.idem[key]
		if !ok {
			e = &idemEntry{fp: fp, done: make(chan struct{})}
			s.idem[key] = e
			s.idemOrder = append(s.idemOrder, key)
			s.trimIdemLocked()
		}
		s.mu.Unlock()
		if e.fp != fp {
			return 0, nil, httpErr(http.StatusConflict, "%s %q was first used for a different request", HeaderIdempotencyKey, key)
		}
		if ok {
			select {
			case <-e.done:
			case <-r.Context().Done():
				return 0, nil, r.Context().Err()
			}
			if e.err != nil {
				// The first call failed and was forgotten: run again.
				return s.idempotent(h)(w, r)
			}
			w.Header().Set(HeaderIdempotencyKey, key)
			return e.status, e.body, nil
		}
		r = r.WithContext(context.WithValue(r.Context(), idemKey{}, key))
		e.status, e.body, e.err = h(w, r)
		s.mu.Lock()
		if e.err != nil && s.idem[key] == e {
			delete(s.idem, key)
		}
		s.mu.Unlock()
		close(e.done)
		w.Header().Set(HeaderIdempotencyKey, key)
		return e.status, e.body, e.err
	}
}

// trimIdemLocked drops the oldest finished keys past maxIdempotent.
// Caller holds s.mu.
func (s *Server) trimIdemLocked() {
	for len(s.idemOrder) > maxIdempotent {
		k := s.idemOrder[0]
		s.idemOrder = s.idemOrder[1:]
		if e, ok := s.idem[k]; ok {
			select {
			case <-e.done:
				delete(s.idem, k)
			default:
				s.idemOrder = append(s.idemOrder, k) // still running: keep
				return
			}
		}
	}
}
