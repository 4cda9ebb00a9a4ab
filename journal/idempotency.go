package journal

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"
)

// MaxIdempotencyKeyLen bounds a caller's idempotency key.
const MaxIdempotencyKeyLen = 256

// CheckIdempotencyKey checks that key is 1..MaxIdempotencyKeyLen bytes of
// UTF-8 without control characters; a violation wraps ErrInvalidArgument.
func CheckIdempotencyKey(key string) error {
	if key == "" || len(key) > MaxIdempotencyKeyLen {
		return fmt.Errorf("idempotency key: want 1..%d bytes, got %d: %w", MaxIdempotencyKeyLen, len(key), ErrInvalidArgument)
	}
	if !utf8.ValidString(key) {
		return fmt.Errorf("idempotency key %q: not UTF-8: %w", key, ErrInvalidArgument)
	}
	for _, r := range key {
		if unicode.IsControl(r) {
			return fmt.Errorf("idempotency key %q: control character: %w", key, ErrInvalidArgument)
		}
	}
	return nil
}

// Fingerprint names a request: "sha256:" and the hex SHA-256 of op, a NUL,
// and the canonical JSON of request. Canonical means json.Marshal, then
// decoded and re-encoded so object keys are sorted and insignificant space
// is gone even inside json.RawMessage fields (a caller's logical_state), while
// numbers keep their exact text. Two requests fingerprint alike iff they
// mean the same JSON to an API client.
func Fingerprint(op string, request any) (string, error) {
	canon, err := CanonicalJSON(request)
	if err != nil {
		return "", fmt.Errorf("fingerprint %s request: %w", op, err)
	}
	h := sha256.New()
	h.Write([]byte(op))
	h.Write([]byte{0})
	h.Write(canon)
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// CanonicalJSON encodes v with sorted object keys, no insignificant space and
// numbers as written. An unencodable v wraps ErrInvalidArgument.
func CanonicalJSON(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode: %v: %w", err, ErrInvalidArgument)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var generic any
	if err := dec.Decode(&generic); err != nil {
		return nil, fmt.Errorf("re-decode: %v: %w", err, ErrInvalidArgument)
	}
	out, err := json.Marshal(generic)
	if err != nil {
		return nil, fmt.Errorf("re-encode: %v: %w", err, ErrInvalidArgument)
	}
	return out, nil
}

// CheckIdempotency looks key up. If it holds the first result of the same
// request (same op and fingerprint) it returns that result's bytes exactly as
// stored and found = true. If it holds a different request it returns an
// error wrapping ErrConflict that names the key. If the key is free it
// returns found = false: run the operation and RecordResult in the same
// transaction.
func CheckIdempotency(r Reader, key, op string, request any) (result []byte, found bool, err error) {
	fp, err := Fingerprint(op, request)
	if err != nil {
		return nil, false, err
	}
	return checkIdempotency(r, key, op, fp)
}

func checkIdempotency(r Reader, key, op, fp string) ([]byte, bool, error) {
	e, found, err := getIdempotency(r, key)
	if err != nil || !found {
		return nil, false, err
	}
	if e.Op != op || e.Fingerprint != fp {
		return nil, false, fmt.Errorf("idempotency key %q was first used for a different %s request: %w", key, e.Op, ErrConflict)
	}
	return []byte(e.Result), true, nil
}

// Sizes of recorded results. Any result up to MaxResultSize is recorded:
// up to InlineResultSize in the entry, a larger one in parts of
// resultPartSize bytes under idem-part/, so no stored value exceeds
// MaxValueSize however large the result (a fork of MaxFork children with
// a logical state each).
const (
	InlineResultSize = 64 << 10
	MaxResultSize    = 16 << 20
	resultPartSize   = 512 << 10
)

// GetIdempotency reads the entry under key with its result whole (read
// from its parts and checked against its digest if it has parts). A key
// never recorded is ErrNotFound; a part missing or not matching the digest
// is ErrCorrupt.
func GetIdempotency(r Reader, key string) (IdempotencyEntry, error) {
	e, found, err := getIdempotency(r, key)
	if err == nil && !found {
		return e, fmt.Errorf("idempotency key %q: %w", key, ErrNotFound)
	}
	return e, err
}

// getIdempotency is GetIdempotency with a key never recorded found =
// false, not an error: every mutation looks up a fresh key first.
func getIdempotency(r Reader, key string) (e IdempotencyEntry, found bool, err error) {
	e, err = readIdempotency(r, key)
	if errors.Is(err, errNoEntry) {
		return e, false, nil
	}
	return e, err == nil, err
}

// errNoEntry is readIdempotency's answer for a key never recorded.
var errNoEntry = errors.New("no idempotency entry")

func readIdempotency(r Reader, key string) (IdempotencyEntry, error) {
	var e IdempotencyEntry
	if err := CheckIdempotencyKey(key); err != nil {
		return e, err
	}
	b, err := r.Get(idemKey(key))
	if errors.Is(err, ErrNotFound) {
		return e, errNoEntry
	}
	if err != nil {
		return e, fmt.Errorf("idempotency key %q: %w", key, err)
	}
	what := fmt.Sprintf("idempotency key %q", key)
	if err := decode(what, b, &e); err != nil {
		return e, err
	}
	if e.ResultParts == 0 {
		return e, nil
	}
	if len(e.Result) != 0 {
		return e, fmt.Errorf("decode %s: result both inline and in parts: %w", what, ErrCorrupt)
	}
	res := make([]byte, 0, e.ResultSize)
	for i := range e.ResultParts {
		part, err := r.Get(idemPartKey(key, i))
		if errors.Is(err, ErrNotFound) {
			return e, fmt.Errorf("%s: result part %d of %d missing: %w", what, i+1, e.ResultParts, ErrCorrupt)
		}
		if err != nil {
			return e, fmt.Errorf("%s: result part %d: %w", what, i+1, err)
		}
		res = append(res, part...)
	}
	if int64(len(res)) != e.ResultSize || resultDigest(res) != e.ResultDigest {
		return e, fmt.Errorf("%s: result parts (%d bytes) do not match the entry's size %d and digest: %w", what, len(res), e.ResultSize, ErrCorrupt)
	}
	e.Result = res
	return e, nil
}

func resultDigest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// RecordResult stores result (encoded with json.Marshal; a json.RawMessage
// is kept as is, compacted) as the first result of request under key, and
// returns the stored bytes. A key already taken is ErrExists: call
// CheckIdempotency first, in the same transaction.
func RecordResult(tx Tx, key, op string, request, result any) ([]byte, error) {
	fp, err := Fingerprint(op, request)
	if err != nil {
		return nil, err
	}
	return recordResult(tx, key, op, fp, result, 0, false)
}

// recordResult records result under key; ttl > 0 lets ExpireIdempotency
// delete the entry once ttl has passed. free says this transaction already
// found the key free (DoIdempotentFor), so it is not looked up again.
func recordResult(tx Tx, key, op, fp string, result any, ttl time.Duration, free bool) ([]byte, error) {
	if err := CheckIdempotencyKey(key); err != nil {
		return nil, err
	}
	res, err := json.Marshal(result)
	if err != nil {
		return nil, fmt.Errorf("idempotency key %q: encode %s result: %v: %w", key, op, err, ErrInvalidArgument)
	}
	if len(res) > MaxResultSize {
		return nil, fmt.Errorf("idempotency key %q: %s result of %d bytes, limit %d (do less in one call): %w", key, op, len(res), MaxResultSize, ErrInvalidArgument)
	}
	if !free {
		if ok, err := exists(tx, idemKey(key)); err != nil || ok {
			return nil, fmt.Errorf("idempotency key %q: %w", key, orErr(err, ErrExists))
		}
	}
	e := IdempotencyEntry{Key: key, Op: op, Fingerprint: fp, CreatedAt: tx.Now()}
	if ttl > 0 {
		e.ExpiresAt = e.CreatedAt.Add(ttl)
		if err := tx.Put(expiryKey(prefixIdemExpiry, e.ExpiresAt, key), nil); err != nil {
			return nil, err
		}
	}
	if len(res) <= InlineResultSize {
		e.Result = res
	} else {
		e.ResultSize, e.ResultDigest = int64(len(res)), resultDigest(res)
		for rest := res; len(rest) > 0; e.ResultParts++ {
			n := min(len(rest), resultPartSize)
			if err := tx.Put(idemPartKey(key, e.ResultParts), rest[:n]); err != nil {
				return nil, err
			}
			rest = rest[n:]
		}
	}
	if err := putRecord(tx, "idempotency entry", idemKey(key), &e); err != nil {
		return nil, err
	}
	return res, nil
}

func idemKey(key string) []byte { return recordKey(prefixIdem, key) }

// idemPartKey names part i of key's result. The part number is the last
// four digits, so no two (key, part) pairs share a name even though a key
// may contain "/".
func idemPartKey(key string, i int) []byte {
	return fmt.Appendf(nil, "%s%s/%04d", prefixIdemPart, key, i)
}

// DoIdempotent runs one mutating operation exactly once per key, in one
// Update: if key already holds the same request's result, it returns those
// bytes unchanged with replayed = true and writes nothing; if it holds a
// different request, ErrConflict; otherwise it runs fn and stores fn's
// result under key in the same atomic batch as fn's writes, and returns the
// stored bytes. An error from fn is returned and records nothing, so the key
// stays free for a retry. fn may run more than once (see Store.Update).
//
// Because the check, the operation and the record commit together, a crash
// at any point leaves either no trace of the operation or the operation and
// its result: the replay after a lost reply returns the committed result.
func DoIdempotent(ctx context.Context, s Store, key, op string, request any, fn func(tx Tx) (any, error)) (result []byte, replayed bool, err error) {
	return DoIdempotentFor(ctx, s, key, op, request, 0, fn)
}

// DoIdempotentFor is DoIdempotent whose record may be deleted once ttl has
// passed (ExpireIdempotency), for keys nobody may replay after that: the
// ones a server made up for a caller that sent none. ttl <= 0 keeps the
// record for ever, as DoIdempotent does.
func DoIdempotentFor(ctx context.Context, s Store, key, op string, request any, ttl time.Duration, fn func(tx Tx) (any, error)) (result []byte, replayed bool, err error) {
	if err := CheckIdempotencyKey(key); err != nil {
		return nil, false, err
	}
	if op == "" {
		return nil, false, fmt.Errorf("idempotent operation: op is required: %w", ErrInvalidArgument)
	}
	fp, err := Fingerprint(op, request)
	if err != nil {
		return nil, false, err
	}
	err = s.Update(ctx, func(tx Tx) error {
		result, replayed = nil, false
		prev, found, err := checkIdempotency(tx, key, op, fp)
		if err != nil {
			return err
		}
		if found {
			result, replayed = prev, true
			return nil
		}
		v, err := fn(tx)
		if err != nil {
			return err
		}
		result, err = recordResult(tx, key, op, fp, v, ttl, true)
		return err
	})
	if err != nil {
		return nil, false, err
	}
	return result, replayed, nil
}

// ExpireIdempotency deletes up to limit idempotency entries (with their
// result parts and index keys) whose ExpiresAt is at or before now, soonest
// first, and returns how many it deleted: fewer than limit means none is
// left. It reads only the expired part of the expiry index. A replay of a
// deleted key runs the operation afresh.
func ExpireIdempotency(tx Tx, now time.Time, limit int) (int, error) {
	type expired struct {
		key   string
		index []byte
	}
	var due []expired
	err := scanExpired(tx, prefixIdemExpiry, now, func(key string, index []byte) error {
		if len(due) == limit {
			return ErrStop
		}
		due = append(due, expired{key, bytes.Clone(index)})
		return nil
	})
	if err != nil {
		return 0, err
	}
	for _, d := range due {
		b, err := tx.Get(idemKey(d.key))
		if err != nil && !errors.Is(err, ErrNotFound) {
			return 0, fmt.Errorf("expire idempotency key %q: %w", d.key, err)
		}
		var e IdempotencyEntry
		if err == nil {
			if err := decode(fmt.Sprintf("idempotency key %q", d.key), b, &e); err != nil {
				return 0, err
			}
		}
		for i := range e.ResultParts {
			if err := tx.Delete(idemPartKey(d.key, i)); err != nil {
				return 0, err
			}
		}
		if err := errors.Join(tx.Delete(idemKey(d.key)), tx.Delete(d.index)); err != nil {
			return 0, err
		}
	}
	return len(due), nil
}
