package fabric

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/esf-dev/esf/journal"
)

// Front-door records: the small durable records a front door of the
// fabric (the E2B one, package e2b) keeps of its own, beside the graph and
// never part of it: what its protocol has and esf has not (an E2B
// sandbox's id, the hash of its access token, its paused node), so that
// it finds its state again when the daemon restarts. They live in the
// journal under front/<door>/<id>, one opaque value each; the graph's
// operations never read them, and a front door keeps no copy of a graph
// record in them (it names nodes and attempts by id).

const prefixFront = "front/"

// maxFrontRecord bounds a front-door record's value.
const maxFrontRecord = 256 << 10

func frontKey(door, id string) ([]byte, error) {
	for _, s := range []string{door, id} {
		if s == "" || len(s) > 200 || strings.ContainsAny(s, "/\x00") {
			return nil, fmt.Errorf("front-door record %q/%q: want 1..200 bytes without '/': %w", door, id, journal.ErrInvalidArgument)
		}
	}
	return []byte(prefixFront + door + "/" + id), nil
}

// PutFrontRecord sets the record id of the front door door to v.
func (f *Fabric) PutFrontRecord(ctx context.Context, door, id string, v []byte) error {
	key, err := frontKey(door, id)
	if err != nil {
		return err
	}
	if len(v) > maxFrontRecord {
		return fmt.Errorf("front-door record %s: %d bytes, at most %d: %w", key, len(v), maxFrontRecord, journal.ErrInvalidArgument)
	}
	return f.journal.Update(ctx, func(tx journal.Tx) error { return tx.Put(key, v) })
}

// DeleteFrontRecord removes the record id of the front door door (a
// missing one is no error).
func (f *Fabric) DeleteFrontRecord(ctx context.Context, door, id string) error {
	key, err := frontKey(door, id)
	if err != nil {
		return err
	}
	return f.journal.Update(ctx, func(tx journal.Tx) error { return tx.Delete(key) })
}

// FrontRecords calls fn with every record of the front door door, by id
// in ascending order.
func (f *Fabric) FrontRecords(ctx context.Context, door string, fn func(id string, v []byte) error) error {
	if _, err := frontKey(door, "x"); err != nil {
		return err
	}
	type rec struct {
		id string
		v  []byte
	}
	var recs []rec
	prefix := []byte(prefixFront + door + "/")
	err := f.journal.View(ctx, func(r journal.Reader) error {
		recs = recs[:0]
		return journal.ScanPrefix(r, prefix, func(key, value []byte) error {
			recs = append(recs, rec{id: string(key[len(prefix):]), v: append([]byte(nil), value...)})
			return nil
		})
	})
	if err != nil {
		return err
	}
	for _, r := range recs {
		if err := fn(r.id, r.v); err != nil {
			if errors.Is(err, journal.ErrStop) {
				return nil
			}
			return err
		}
	}
	return nil
}
