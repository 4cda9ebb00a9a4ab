package etcd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/esf-dev/esf/internal/randid"
	"github.com/esf-dev/esf/journal"
	"github.com/esf-dev/esf/journal/internal/kvutil"
)

// scanPage is how many keys one range request of a Scan reads.
const scanPage = 256

var errEnded = fmt.Errorf("journal transaction used after it ended: %w", journal.ErrFailedPrecondition)

// reader reads at one revision, fixed by its first read.
type reader struct {
	s     *Store
	ctx   context.Context
	now   time.Time
	rev   int64 // 0 until the first read
	ended bool
	tx    *tx // nil in a View
	// fault is the first read that failed for a reason of the cluster's
	// (transient, or the revision compacted): an Update retries.
	fault error
	log   *eventLog // the event log at rev, read on first use
	// got caches what Get read: at a fixed revision a key never changes,
	// and operations often read a record twice (a check, then an update).
	got map[string]cached
}

type cached struct {
	val []byte
	mod int64
}

func (r *reader) end() { r.ended = true }

func (r *reader) fail(err error) error {
	e := r.s.mapErr(r.ctx, err)
	if r.ctx.Err() == nil && (transient(err) || errors.Is(err, rpctypes.ErrCompacted)) && r.fault == nil {
		r.fault = e
	}
	return e
}

// get runs a range read at the reader's revision. The first read of a
// reader is linearizable and fixes the revision; it also makes sure no
// large transaction is half rolled forward at that revision (it waits for
// it, or finishes it), so every read sees whole transactions only.
func (r *reader) get(key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	if r.rev == 0 {
		for {
			resp, err := r.s.cli.Txn(r.ctx).Then(
				clientv3.OpGet(r.s.k.commitPrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1)),
				clientv3.OpGet(key, opts...),
			).Commit()
			if err != nil {
				return nil, r.fail(err)
			}
			if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
				if err := r.s.awaitCommit(r.ctx, string(kvs[0].Key)); err != nil {
					return nil, r.fail(err)
				}
				continue
			}
			r.rev = resp.Header.Revision
			return (*clientv3.GetResponse)(resp.Responses[1].GetResponseRange()), nil
		}
	}
	// The revision is fixed, so any member that has applied it answers
	// the same; one that has not says so, and the leader's read waits.
	o := append(opts, clientv3.WithRev(r.rev))
	resp, err := r.s.cli.Get(r.ctx, key, append(o, clientv3.WithSerializable())...)
	if errors.Is(err, rpctypes.ErrFutureRev) {
		resp, err = r.s.cli.Get(r.ctx, key, o...)
	}
	if err != nil {
		return nil, r.fail(err)
	}
	return resp, nil
}

func (r *reader) Get(key []byte) ([]byte, error) {
	if r.ended {
		return nil, errEnded
	}
	if r.tx != nil {
		if v, ok := r.tx.writes[string(key)]; ok {
			if v == nil {
				return nil, fmt.Errorf("key %q: %w", key, journal.ErrNotFound)
			}
			return bytes.Clone(v), nil
		}
	}
	c, ok := r.got[string(key)]
	if !ok {
		resp, err := r.get(r.s.k.data(string(key)))
		if err != nil {
			return nil, fmt.Errorf("get %q: %w", key, err)
		}
		if len(resp.Kvs) > 0 {
			c = cached{resp.Kvs[0].Value, resp.Kvs[0].ModRevision}
		}
		if r.got == nil {
			r.got = map[string]cached{}
		}
		r.got[string(key)] = c
	}
	mod, val := c.mod, c.val
	if r.tx != nil {
		r.tx.guardKey(string(key), mod)
	}
	if mod == 0 {
		return nil, fmt.Errorf("key %q: %w", key, journal.ErrNotFound)
	}
	return append([]byte{}, val...), nil // a copy, non-nil even when empty
}

// rawScan calls fn for every etcd key in [start, end) at the reader's
// revision, a page at a time, checking the context as it goes. fn's
// ErrStop ends it with nil.
func (r *reader) rawScan(start, end string, keysOnly bool, fn func(kv *mvccpb.KeyValue) error) error {
	for start < end {
		if err := r.ctx.Err(); err != nil {
			return err
		}
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(scanPage)}
		if keysOnly {
			opts = append(opts, clientv3.WithKeysOnly())
		}
		resp, err := r.get(start, opts...)
		if err != nil {
			return err
		}
		for i, kv := range resp.Kvs {
			if i > 0 && i%64 == 0 {
				if err := r.ctx.Err(); err != nil {
					return err
				}
			}
			if err := fn(kv); err != nil {
				if errors.Is(err, journal.ErrStop) {
					return nil
				}
				return err
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return nil
		}
		start = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	return nil
}

type kv struct {
	k string
	v []byte // nil: deleted in the transaction
}

func (r *reader) Scan(start, end []byte, fn func(key, value []byte) error) error {
	if r.ended {
		return errEnded
	}
	if err := r.ctx.Err(); err != nil {
		return err
	}
	if end != nil && bytes.Compare(start, end) >= 0 {
		return nil
	}
	// The transaction's writes as of now, sorted: later ones are not seen.
	var overlay []kv
	if r.tx != nil {
		for k, v := range r.tx.writes {
			if k >= string(start) && (end == nil || k < string(end)) {
				overlay = append(overlay, kv{k, v})
			}
		}
		slices.SortFunc(overlay, func(a, b kv) int { return strings.Compare(a.k, b.k) })
	}
	stopped := "" // the journal key fn stopped at, if it did
	emit := func(k string, v []byte) error {
		if err := fn([]byte(k), v); err != nil {
			if errors.Is(err, journal.ErrStop) {
				stopped = k
			}
			return err
		}
		return nil
	}
	j := 0
	lo, hi := r.s.k.dataRange(string(start), string(end))
	err := r.rawScan(lo, hi, false, func(kv *mvccpb.KeyValue) error {
		k, v := string(r.s.k.journalKey(kv.Key)), kv.Value
		for j < len(overlay) && overlay[j].k < k {
			o := overlay[j]
			j++
			if o.v != nil {
				if err := emit(o.k, o.v); err != nil {
					return err
				}
			}
		}
		if j < len(overlay) && overlay[j].k == k {
			o := overlay[j] // the transaction's write wins
			j++
			if o.v == nil {
				return nil
			}
			return emit(o.k, o.v)
		}
		if v == nil {
			v = []byte{}
		}
		return emit(k, v)
	})
	for ; err == nil && stopped == "" && j < len(overlay); j++ {
		if overlay[j].v != nil {
			err = emit(overlay[j].k, overlay[j].v)
		}
	}
	if errors.Is(err, journal.ErrStop) {
		err = nil
	}
	if r.tx != nil {
		// What the scan saw: the range up to where it stopped.
		guardEnd := string(end)
		if stopped != "" {
			guardEnd = stopped + "\x00"
		}
		r.tx.guardRange(string(start), guardEnd)
	}
	return err
}

func (r *reader) Events(after uint64, fn func(ev journal.Event) error) error {
	if r.ended {
		return errEnded
	}
	l, err := r.eventLog()
	if err != nil {
		return err
	}
	return l.each(r, after, fn)
}

func (r *reader) LastSeq() (uint64, error) {
	if r.ended {
		return 0, errEnded
	}
	l, err := r.eventLog()
	if err != nil {
		return 0, err
	}
	return l.last, nil
}

func (r *reader) Now() time.Time { return r.now }

// tx is an Update's attempt: reads at one revision, buffered writes, and
// what it read (the guards its commit compares).
type tx struct {
	reader
	txid   string
	bucket bucket
	writes kvutil.Writes // journal keys; nil: deleted
	events []journal.Event
	// points are keys read from the store with the mod revision they had
	// (0: absent); spans are scanned ranges of journal keys (end ""
	// means to the end); evq is set when the event log was read.
	points map[string]int64
	spans  []span
	evq    bool
}

type span struct{ start, end string }

func newTx(s *Store, ctx context.Context) *tx {
	t := &tx{
		reader: reader{s: s, ctx: ctx, now: s.now()},
		txid:   randid.Hex(12),
		bucket: bucketOf(time.Now()),
		writes: kvutil.Writes{},
		points: map[string]int64{},
	}
	t.reader.tx = t
	return t
}

func (t *tx) guardKey(key string, mod int64) {
	if _, ok := t.points[key]; !ok {
		t.points[key] = mod
	}
}

func (t *tx) guardRange(start, end string) { t.spans = append(t.spans, span{start, end}) }

func (t *tx) Put(key, value []byte) error {
	if t.ended {
		return errEnded
	}
	return t.writes.Put(key, value)
}

func (t *tx) Delete(key []byte) error {
	if t.ended {
		return errEnded
	}
	return t.writes.Delete(key)
}

func (t *tx) AppendEvent(ev journal.Event) error {
	if t.ended {
		return errEnded
	}
	if err := ev.Validate(); err != nil {
		return fmt.Errorf("append event: %w", err)
	}
	ev.Seq = 0
	if ev.Time.IsZero() {
		ev.Time = t.now
	}
	if _, err := encodeEvent(ev); err != nil {
		return err
	}
	t.events = append(t.events, ev)
	return nil
}
