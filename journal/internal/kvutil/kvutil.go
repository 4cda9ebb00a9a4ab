// Package kvutil is what the journal's Store implementations share: the
// write checks of the Tx contract, the event-log layout they both use, the
// schema marker, and the broadcast behind Store.Notify.
package kvutil

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/esf-dev/esf/journal"
)

// Reserved keys. The event log is sys/ev/<8-byte big-endian seq>, so a
// range scan from a seq reads in order; sys/evseq holds the last seq so
// that appending never scans.
var (
	eventPrefix = []byte(journal.ReservedPrefix + "ev/")
	SeqKey      = []byte(journal.ReservedPrefix + "evseq")
	SchemaKey   = []byte(journal.ReservedPrefix + "schema")
)

// CheckPut enforces the Tx.Put contract.
func CheckPut(key, value []byte) error {
	if err := CheckDelete(key); err != nil {
		return err
	}
	if len(value) > journal.MaxValueSize {
		return fmt.Errorf("put %q: value of %d bytes, limit %d: %w", key, len(value), journal.MaxValueSize, journal.ErrInvalidArgument)
	}
	return nil
}

// CheckDelete enforces the key rules of Tx.Put and Tx.Delete.
func CheckDelete(key []byte) error {
	if len(key) == 0 || len(key) > journal.MaxKeySize {
		return fmt.Errorf("key of %d bytes: want 1..%d: %w", len(key), journal.MaxKeySize, journal.ErrInvalidArgument)
	}
	if bytes.HasPrefix(key, []byte(journal.ReservedPrefix)) {
		return fmt.Errorf("key %q: prefix %q is reserved to the store: %w", key, journal.ReservedPrefix, journal.ErrInvalidArgument)
	}
	return nil
}

// Writes buffers a transaction's writes for a store that applies them at
// commit: a nil value is a delete.
type Writes map[string][]byte

// Put implements Tx.Put into w.
func (w Writes) Put(key, value []byte) error {
	if err := CheckPut(key, value); err != nil {
		return err
	}
	v := make([]byte, len(value)) // non-nil even when empty: nil means deleted
	copy(v, value)
	w[string(key)] = v
	return nil
}

// Delete implements Tx.Delete into w.
func (w Writes) Delete(key []byte) error {
	if err := CheckDelete(key); err != nil {
		return err
	}
	w[string(key)] = nil
	return nil
}

// KV is the raw access an implementation gives the shared event code:
// reads that see the transaction's own writes, and unchecked writes.
type KV interface {
	Get(key []byte) ([]byte, error)
	RawPut(key, value []byte) error
}

// LastSeq reads the last appended seq through get (0 if none).
func LastSeq(get func(key []byte) ([]byte, error)) (uint64, error) {
	b, err := get(SeqKey)
	if errors.Is(err, journal.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if len(b) != 8 {
		return 0, fmt.Errorf("event seq key: %d bytes: %w", len(b), journal.ErrCorrupt)
	}
	return binary.BigEndian.Uint64(b), nil
}

// Appends implements Tx.AppendEvent, and the reads of the log that must not
// see the transaction's own appends, for a store whose transactions write
// the log directly (a counter key under a single writer): the zero value
// is a transaction that appended nothing.
type Appends struct {
	appended  bool
	committed uint64 // the last seq before this transaction's first append
}

// Append appends ev through kv.
func (a *Appends) Append(kv KV, now time.Time, ev journal.Event) error {
	seq, err := AppendEvent(kv, now, ev)
	if err == nil && !a.appended {
		a.appended, a.committed = true, seq-1
	}
	return err
}

// Appended reports whether the transaction appended an event.
func (a *Appends) Appended() bool { return a.appended }

// Events implements Reader.Events in the transaction: the committed log.
func (a *Appends) Events(scan func(start, end []byte, fn func(k, v []byte) error) error, after uint64, fn func(journal.Event) error) error {
	if !a.appended {
		return ScanEvents(scan, after, fn)
	}
	if after >= a.committed {
		return nil
	}
	start, _ := EventRange(after)
	end, _ := EventRange(a.committed)
	return scan(start, end, func(k, v []byte) error {
		ev, err := DecodeEvent(k, v)
		if err != nil {
			return err
		}
		return fn(ev)
	})
}

// LastSeq implements Reader.LastSeq in the transaction.
func (a *Appends) LastSeq(get func(key []byte) ([]byte, error)) (uint64, error) {
	if a.appended {
		return a.committed, nil
	}
	return LastSeq(get)
}

// AppendEvent writes ev through kv as the next event and returns its seq.
func AppendEvent(kv KV, now time.Time, ev journal.Event) (uint64, error) {
	if err := ev.Validate(); err != nil {
		return 0, fmt.Errorf("append event: %w", err)
	}
	last, err := LastSeq(kv.Get)
	if err != nil {
		return 0, err
	}
	ev.Seq = last + 1
	if ev.Time.IsZero() {
		ev.Time = now
	}
	b, err := json.Marshal(&ev)
	if err != nil {
		return 0, fmt.Errorf("append event %s: %v: %w", ev.Type, err, journal.ErrInvalidArgument)
	}
	if len(b) > journal.MaxValueSize {
		return 0, fmt.Errorf("append event %s: %d bytes, limit %d: %w", ev.Type, len(b), journal.MaxValueSize, journal.ErrInvalidArgument)
	}
	if err := kv.RawPut(EventKey(ev.Seq), b); err != nil {
		return 0, err
	}
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], ev.Seq)
	if err := kv.RawPut(SeqKey, s[:]); err != nil {
		return 0, err
	}
	return ev.Seq, nil
}

// EventKey is the key of event seq.
func EventKey(seq uint64) []byte {
	k := make([]byte, len(eventPrefix)+8)
	copy(k, eventPrefix)
	binary.BigEndian.PutUint64(k[len(eventPrefix):], seq)
	return k
}

// EventRange is the key range of the events after seq.
func EventRange(after uint64) (start, end []byte) {
	if after == ^uint64(0) {
		return journal.PrefixEnd(eventPrefix), journal.PrefixEnd(eventPrefix)
	}
	return EventKey(after + 1), journal.PrefixEnd(eventPrefix)
}

// DecodeEvent decodes a stored event strictly and checks it against its key.
func DecodeEvent(key, value []byte) (journal.Event, error) {
	var ev journal.Event
	if len(key) != len(eventPrefix)+8 || !bytes.HasPrefix(key, eventPrefix) {
		return ev, fmt.Errorf("event key %q: %w", key, journal.ErrCorrupt)
	}
	seq := binary.BigEndian.Uint64(key[len(eventPrefix):])
	dec := json.NewDecoder(bytes.NewReader(value))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ev); err != nil {
		return ev, fmt.Errorf("decode event %d: %v: %w", seq, err, journal.ErrCorrupt)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return ev, fmt.Errorf("decode event %d: trailing data: %w", seq, journal.ErrCorrupt)
	}
	if ev.Seq != seq {
		return ev, fmt.Errorf("decode event %d: records seq %d: %w", seq, ev.Seq, journal.ErrCorrupt)
	}
	if err := ev.Validate(); err != nil {
		return ev, fmt.Errorf("decode event %d: %v: %w", seq, err, journal.ErrCorrupt)
	}
	return ev, nil
}

// SchemaValue is what SchemaKey holds for this version.
func SchemaValue() []byte { return []byte(strconv.Itoa(journal.SchemaVersion)) }

// CheckSchema compares a stored schema marker with this version.
func CheckSchema(stored []byte) error {
	if !bytes.Equal(stored, SchemaValue()) {
		return fmt.Errorf("journal schema %q, this build reads %d: %w", stored, journal.SchemaVersion, journal.ErrUnsupported)
	}
	return nil
}

// Broadcaster implements Store.Notify: Wait returns a channel that the next
// Broadcast (or Close) closes. It holds at most one channel, made lazily,
// so a store nobody follows pays nothing.
type Broadcaster struct {
	mu     sync.Mutex
	ch     chan struct{}
	closed bool
}

var closedCh = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Wait returns the channel the next Broadcast closes.
func (b *Broadcaster) Wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return closedCh
	}
	if b.ch == nil {
		b.ch = make(chan struct{})
	}
	return b.ch
}

// Broadcast wakes every waiter.
func (b *Broadcaster) Broadcast() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch != nil {
		close(b.ch)
		b.ch = nil
	}
}

// Close wakes every waiter and makes every later Wait return at once.
func (b *Broadcaster) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	if b.ch != nil {
		close(b.ch)
		b.ch = nil
	}
}

// ScanEvents implements Reader.Events over a store's Scan: every event
// after seq after, in order, decoded.
func ScanEvents(scan func(start, end []byte, fn func(k, v []byte) error) error, after uint64, fn func(journal.Event) error) error {
	start, end := EventRange(after)
	return scan(start, end, func(k, v []byte) error {
		ev, err := DecodeEvent(k, v)
		if err != nil {
			return err
		}
		return fn(ev)
	})
}
