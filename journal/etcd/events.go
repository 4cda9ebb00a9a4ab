package etcd

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/esf-dev/esf/journal"
	"github.com/esf-dev/esf/journal/internal/kvutil"
)

// The event log. A transaction that appends events writes them, in chunks,
// under x/evq/<txid>/ in its own commit: a key no other transaction
// touches, so appending events never makes two transactions conflict. The
// chunks' create revision is the commit's, and that orders the log: at any
// revision, the log is the indexed events (j/sys/ev/<seq>, up to
// j/sys/evseq) followed by the pending chunks sorted by the create revision
// of their transaction (then by chunk number), numbered on from evseq.
// Every reader computes the same Seqs, and they are gapless and in commit
// order. The indexer moves pending chunks, oldest first, into indexed keys
// with exactly those Seqs, in one transaction per batch (compared against
// evseq and each chunk's revision), so numbering never changes.

// encodeEvent is an event as stored.
func encodeEvent(ev journal.Event) ([]byte, error) {
	b, err := json.Marshal(&ev)
	if err != nil {
		return nil, fmt.Errorf("append event %s: %v: %w", ev.Type, err, journal.ErrInvalidArgument)
	}
	if len(b) > journal.MaxValueSize {
		return nil, fmt.Errorf("append event %s: %d bytes, limit %d: %w", ev.Type, len(b), journal.MaxValueSize, journal.ErrInvalidArgument)
	}
	return b, nil
}

// evChunk is a pending chunk as written: a JSON array of n events.
type evChunk struct {
	b []byte
	n int
}

// chunkEvents packs events into pending chunks that, once numbered, the
// indexer can move one at a time (a put per event and the chunk's delete
// in one transaction).
func chunkEvents(evs []journal.Event, lim limits) ([]evChunk, error) {
	var chunks []evChunk
	var cur []byte
	n := 0
	for _, ev := range evs {
		b, err := encodeEvent(ev)
		if err != nil {
			return nil, err
		}
		// A numbered event is longer by its seq's digits and key.
		if n > 0 && (n+1 > lim.chunkOps || len(cur)+len(b)+n*48 > lim.chunkBytes) {
			chunks, cur, n = append(chunks, evChunk{append(cur, ']'), n}), nil, 0
		}
		if n == 0 {
			cur = append(cur, '[')
		} else {
			cur = append(cur, ',')
		}
		cur = append(cur, b...)
		n++
	}
	if n > 0 {
		chunks = append(chunks, evChunk{append(cur, ']'), n})
	}
	return chunks, nil
}

// decodeChunkEvents decodes a pending chunk strictly.
func decodeChunkEvents(key string, b []byte, n int) ([]journal.Event, error) {
	var raws []json.RawMessage
	if err := json.Unmarshal(b, &raws); err != nil || len(raws) != n {
		return nil, fmt.Errorf("pending events %s: not a list of %d events: %w", key, n, journal.ErrCorrupt)
	}
	evs := make([]journal.Event, len(raws))
	for i, raw := range raws {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&evs[i]); err != nil {
			return nil, fmt.Errorf("pending events %s: %v: %w", key, err, journal.ErrCorrupt)
		}
		if _, err := dec.Token(); !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("pending events %s: trailing data: %w", key, journal.ErrCorrupt)
		}
		if err := evs[i].Validate(); err != nil || evs[i].Seq != 0 {
			return nil, fmt.Errorf("pending events %s: invalid event (%v, seq %d): %w", key, err, evs[i].Seq, journal.ErrCorrupt)
		}
	}
	return evs, nil
}

// pendingChunk is one chunk of pending events.
type pendingChunk struct {
	key       string
	txid      string
	i, n      int   // chunk number, event count
	createRev int64 // the lowest of its transaction's chunks: the order
	modRev    int64
	first     uint64          // the Seq of its first event
	events    []journal.Event // read on demand (fetch)
}

// eventLog is the log as of a reader's revision: numbered from a listing
// of the pending chunks' keys; their events are read when wanted.
type eventLog struct {
	base    uint64 // the last indexed Seq
	baseMod int64  // evseq's mod revision (0: absent)
	chunks  []pendingChunk
	last    uint64
}

// eventLog reads the log's state at the reader's revision, once.
func (r *reader) eventLog() (*eventLog, error) {
	if r.log != nil {
		return r.log, nil
	}
	k := r.s.k
	l := &eventLog{}
	resp, err := r.get(k.data(string(kvutil.SeqKey)))
	if err != nil {
		return nil, fmt.Errorf("event log: %w", err)
	}
	if len(resp.Kvs) > 0 {
		kv := resp.Kvs[0]
		if len(kv.Value) != 8 {
			return nil, fmt.Errorf("event seq key: %d bytes: %w", len(kv.Value), journal.ErrCorrupt)
		}
		l.base, l.baseMod = binary.BigEndian.Uint64(kv.Value), kv.ModRevision
	}
	first := map[string]int64{} // txid -> its chunks' lowest create revision
	err = r.rawScan(k.evqPrefix(), prefixEnd(k.evqPrefix()), true, func(kv *mvccpb.KeyValue) error {
		key, create, mod := string(kv.Key), kv.CreateRevision, kv.ModRevision
		txid, i, n, err := k.parseEvq(key)
		if err != nil {
			return err
		}
		if f, ok := first[txid]; !ok || create < f {
			first[txid] = create
		}
		l.chunks = append(l.chunks, pendingChunk{key: key, txid: txid, i: i, n: n, modRev: mod})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("event log: %w", err)
	}
	for i := range l.chunks {
		l.chunks[i].createRev = first[l.chunks[i].txid]
	}
	slices.SortFunc(l.chunks, func(a, b pendingChunk) int {
		if a.createRev != b.createRev {
			return cmpInt64(a.createRev, b.createRev)
		}
		if c := strings.Compare(a.txid, b.txid); c != 0 {
			return c
		}
		return a.i - b.i
	})
	l.last = l.base
	for i := range l.chunks {
		l.chunks[i].first = l.last + 1
		l.last += uint64(l.chunks[i].n)
	}
	if r.tx != nil {
		// Guards: the indexer's moves rewrite evseq; new events add chunks.
		r.tx.guardKey(string(kvutil.SeqKey), l.baseMod)
		r.tx.evq = true
	}
	r.log = l
	return l, nil
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// fetch reads the events of chunks that lack them, at the reader's
// revision, several chunks per request.
func (r *reader) fetch(chunks []pendingChunk) error {
	const perRequest = 64
	for len(chunks) > 0 {
		batch := chunks[:min(perRequest, len(chunks))]
		chunks = chunks[len(batch):]
		var ops []clientv3.Op
		var want []*pendingChunk
		for i := range batch {
			if batch[i].events == nil {
				ops = append(ops, clientv3.OpGet(batch[i].key, clientv3.WithRev(r.rev), clientv3.WithSerializable()))
				want = append(want, &batch[i])
			}
		}
		if len(ops) == 0 {
			continue
		}
		resp, err := r.s.cli.Txn(r.ctx).Then(ops...).Commit()
		if errors.Is(err, rpctypes.ErrFutureRev) {
			for i := range ops {
				ops[i] = clientv3.OpGet(want[i].key, clientv3.WithRev(r.rev))
			}
			resp, err = r.s.cli.Txn(r.ctx).Then(ops...).Commit()
		}
		if err != nil {
			return r.fail(err)
		}
		for i, c := range want {
			kvs := resp.Responses[i].GetResponseRange().Kvs
			if len(kvs) != 1 {
				return fmt.Errorf("pending events %s vanished at revision %d: %w", c.key, r.rev, journal.ErrCorrupt)
			}
			if c.events, err = decodeChunkEvents(c.key, kvs[0].Value, c.n); err != nil {
				return err
			}
		}
	}
	return nil
}

// each calls fn for every event after seq after, indexed then pending.
func (l *eventLog) each(r *reader, after uint64, fn func(journal.Event) error) error {
	if after < l.base {
		start, _ := kvutil.EventRange(after)
		end, _ := kvutil.EventRange(l.base)
		k := r.s.k
		stop := false
		err := r.rawScan(k.data(string(start)), k.data(string(end)), false, func(kv *mvccpb.KeyValue) error {
			ev, err := kvutil.DecodeEvent(k.journalKey(kv.Key), kv.Value)
			if err != nil {
				return err
			}
			if err := fn(ev); err != nil {
				stop = errors.Is(err, journal.ErrStop)
				return err
			}
			return nil
		})
		if err != nil || stop {
			return err
		}
	}
	// The pending chunks from the one holding after+1, a few at a time.
	i, _ := slices.BinarySearchFunc(l.chunks, after+1, func(c pendingChunk, seq uint64) int {
		return cmpInt64(int64(c.first+uint64(c.n)-1), int64(seq))
	})
	for i < len(l.chunks) {
		if err := r.ctx.Err(); err != nil {
			return err
		}
		batch := l.chunks[i:min(i+8, len(l.chunks))]
		if err := r.fetch(batch); err != nil {
			return err
		}
		for _, c := range batch {
			for j, ev := range c.events {
				if ev.Seq = c.first + uint64(j); ev.Seq <= after {
					continue
				}
				if err := fn(ev); err != nil {
					if errors.Is(err, journal.ErrStop) {
						return nil
					}
					return err
				}
			}
		}
		i += len(batch)
	}
	return nil
}

// indexOnce moves the oldest pending chunks into the indexed log, as many
// as fit one transaction, and reports whether any remain.
func (s *Store) indexOnce(ctx context.Context) (more bool, err error) {
	r := &reader{s: s, ctx: ctx, now: s.now()}
	defer r.end()
	l, err := r.eventLog()
	if err != nil || len(l.chunks) == 0 {
		return false, err
	}
	// As many chunks as the operations allow (a put per event, a delete
	// per chunk, evseq), then as many of those as the bytes allow.
	take, ops := 0, 1
	for take < len(l.chunks) && (take == 0 || ops+l.chunks[take].n+1 <= s.lim.ops && take+2 <= s.lim.ops) {
		ops += l.chunks[take].n + 1
		take++
	}
	chosen := l.chunks[:take]
	if err := r.fetch(chosen); err != nil {
		return false, err
	}
	k := s.k
	seqKey := k.data(string(kvutil.SeqKey))
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(seqKey), "=", l.baseMod)}
	var puts []clientv3.Op
	size, seq, moved := 0, l.base, 0
	for _, c := range chosen {
		var cops []clientv3.Op
		csize := opCost(c.key, "", 0) * 2
		for j, ev := range c.events {
			ev.Seq = c.first + uint64(j)
			b, err := json.Marshal(&ev)
			if err != nil {
				return false, fmt.Errorf("index event: %w", err)
			}
			key := k.data(string(kvutil.EventKey(ev.Seq)))
			cops = append(cops, clientv3.OpPut(key, string(b)))
			csize += opCost(key, "", len(b))
		}
		if moved > 0 && size+csize > s.lim.bytes {
			break
		}
		puts = append(append(puts, cops...), clientv3.OpDelete(c.key))
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(c.key), "=", c.modRev))
		size, seq = size+csize, c.first+uint64(c.n)-1
		moved++
	}
	var last [8]byte
	binary.BigEndian.PutUint64(last[:], seq)
	puts = append(puts, clientv3.OpPut(seqKey, string(last[:])))
	resp, err := s.cli.Txn(ctx).If(cmps...).Then(puts...).Commit()
	if err != nil {
		return false, s.mapErr(ctx, err)
	}
	// A failed compare: another indexer moved them first; look again.
	return !resp.Succeeded || moved < len(l.chunks), nil
}

// indexLoop indexes pending events after commits (this store's, and those
// the watch sees), letting them accumulate for IndexDelay first.
func (s *Store) indexLoop(ctx context.Context) {
	var retry retrier
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
		}
		if sleep(ctx, s.opts.IndexDelay) != nil {
			return
		}
		for {
			more, err := s.indexOnce(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				s.opts.Logger.Warn("etcd journal: index events (will retry)", "err", err)
				retry.n++
				if sleep(ctx, backoff(retry.n, 100*time.Millisecond, 5*time.Second)) != nil {
					return
				}
				continue
			}
			retry.n = 0
			if !more {
				break
			}
		}
	}
}

// watchLoop watches for pending events from revision from on: any commit
// of the cluster that appended events wakes Notify's waiters and the
// indexer. When the watch breaks (a member lost, no leader) or its
// revision was compacted away, followers cannot know what they missed,
// so they are woken to re-read the log from where they are (which is
// durable, so nothing is lost), and the watch restarts from now.
func (s *Store) watchLoop(ctx context.Context, from int64) {
	var retry retrier
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithFilterDelete(), clientv3.WithCreatedNotify()}
		if from > 0 {
			opts = append(opts, clientv3.WithRev(from))
		}
		healthy := false
		for resp := range s.cli.Watch(wctx, s.k.evqPrefix(), opts...) {
			if resp.CompactRevision != 0 {
				s.opts.Logger.Info("etcd journal: watch revision compacted; followers re-read the log", "from", from, "compacted", resp.CompactRevision)
				from = 0
				break
			}
			if err := resp.Err(); err != nil {
				s.opts.Logger.Debug("etcd journal: watch ended", "err", err)
				break
			}
			healthy = true
			if resp.Created && from == 0 {
				// Watching from now on: whatever committed before it
				// started, followers read now.
				s.notify.Broadcast()
				s.kickIndexer()
			}
			if n := len(resp.Events); n > 0 {
				from = resp.Events[n-1].Kv.ModRevision + 1
				s.notify.Broadcast()
				s.kickIndexer()
			}
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		s.notify.Broadcast()
		s.kickIndexer()
		if healthy {
			retry.n = 0
		}
		retry.n++
		if sleep(ctx, backoff(retry.n, 50*time.Millisecond, 2*time.Second)) != nil {
			return
		}
	}
}
