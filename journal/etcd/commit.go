package etcd

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/esf-dev/esf/journal"
	"github.com/esf-dev/esf/journal/failpoint"
)

// FailpointRollForward is evaluated by a large transaction's writer after
// it published the transaction and before it rolled it forward: a crash
// there leaves the rolling forward to whoever reads next.
var FailpointRollForward = failpoint.Declare("journal.etcd.roll-forward")

// limits are what one etcd request may hold.
type limits struct {
	ops   int // operations in each of a transaction's compare and then lists
	bytes int // bytes of one request, with room for its framing
	// chunk bounds a staged chunk or a pending-events chunk: it must fit,
	// with its own bookkeeping, in one transaction.
	chunkOps, chunkBytes int
}

func newLimits(ops, reqBytes int) limits {
	l := limits{ops: ops, bytes: reqBytes - reqBytes/16}
	l.chunkOps = ops - 8
	// A chunk carries one value of up to journal.MaxValueSize whole.
	l.chunkBytes = max(journal.MaxValueSize+journal.MaxKeySize+64, l.bytes-128<<10)
	return l
}

// opCost estimates the bytes an operation or compare adds to a request.
func opCost(key, rangeEnd string, value int) int { return len(key) + len(rangeEnd) + value + 24 }

// outcome of one commit attempt.
type outcome int

const (
	committed  outcome = iota
	conflicted         // a compare failed: someone changed what fn read
	lost               // not committed for a transient reason: try again
)

// write is one etcd operation of a commit: a put, or a delete (del).
type write struct {
	key string
	val []byte
	del bool
}

// writes lists a transaction's etcd operations: its puts, its deletes
// (each with its tombstone), and its events in pending chunks.
func (t *tx) etcdWrites() ([]write, error) {
	k := t.s.k
	keys := make([]string, 0, len(t.writes))
	for key := range t.writes {
		keys = append(keys, key)
	}
	slices.Sort(keys)
	out := make([]write, 0, len(keys)+1)
	for _, key := range keys {
		if v := t.writes[key]; v != nil {
			out = append(out, write{key: k.data(key), val: v})
		} else {
			out = append(out, write{key: k.data(key), del: true}, write{key: k.tomb(key), val: []byte{}})
		}
	}
	chunks, err := chunkEvents(t.events, t.s.lim)
	if err != nil {
		return nil, err
	}
	for i, c := range chunks {
		out = append(out, write{key: k.evq(t.txid, i, c.n), val: c.b})
	}
	return out, nil
}

func (w write) op() clientv3.Op {
	if w.del {
		return clientv3.OpDelete(w.key)
	}
	return clientv3.OpPut(w.key, string(w.val))
}

func (w write) cost() int { return opCost(w.key, "", len(w.val)) }

// compares are the conditions a commit of t holds under: nothing t read has
// changed since its revision. A key read has its exact mod revision; a
// scanned range has no key modified after the revision and no tombstone
// (deletion) newer than it, and the tombstones were not cleared meanwhile.
// Beyond budget compares, neighbouring guards merge into wider ranges:
// a wider guard can only add conflicts, never miss one.
func (t *tx) compares(budget int) []clientv3.Cmp {
	if t.rev == 0 {
		return nil
	}
	k, next := t.s.k, t.rev+1
	var cmps []clientv3.Cmp
	if t.evq {
		// New pending events (the indexer's moves rewrite evseq, a point).
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k.evqPrefix()).WithRange(prefixEnd(k.evqPrefix())), "<", next))
	}
	if len(t.points)+2*len(t.spans)+1 <= budget-len(cmps) {
		for key, mod := range t.points {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k.data(key)), "=", mod))
		}
		for _, sp := range t.spans {
			cmps = append(cmps, rangeCmps(k, sp, next)...)
		}
		if len(t.spans) > 0 {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k.tombGC()), "<", next))
		}
		return cmps
	}
	// Too many: every guard becomes a range, sorted, and runs of them
	// merge until they fit.
	all := make([]span, 0, len(t.points)+len(t.spans))
	for key := range t.points {
		all = append(all, span{key, key + "\x00"})
	}
	all = append(all, t.spans...)
	slices.SortFunc(all, func(a, b span) int { return strings.Compare(a.start, b.start) })
	groups := (budget - len(cmps) - 1) / 2
	per := (len(all) + groups - 1) / groups
	for i := 0; i < len(all); i += per {
		g := all[i:min(i+per, len(all))]
		merged := span{g[0].start, g[0].end}
		for _, sp := range g[1:] {
			if merged.end != "" && (sp.end == "" || sp.end > merged.end) {
				merged.end = sp.end
			}
		}
		cmps = append(cmps, rangeCmps(k, merged, next)...)
	}
	return append(cmps, clientv3.Compare(clientv3.ModRevision(k.tombGC()), "<", next))
}

func rangeCmps(k keys, sp span, next int64) []clientv3.Cmp {
	lo, hi := k.dataRange(sp.start, sp.end)
	tlo, thi := k.tombRange(sp.start, sp.end)
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(lo).WithRange(hi), "<", next),
		clientv3.Compare(clientv3.ModRevision(tlo).WithRange(thi), "<", next),
	}
}

func cmpCost(cmps []clientv3.Cmp) int {
	n := 0
	for i := range cmps {
		n += opCost(string(cmps[i].KeyBytes()), string(cmps[i].GetCompare().RangeEnd), 8)
	}
	return n
}

// commit writes t if nothing it read changed. A transaction that fits one
// etcd request commits in it; a larger one is staged and published (see
// commitStaged). Either way the request also writes t's outcome marker and
// holds only if t was not aborted, so a lost reply is resolved, not
// guessed (resolve).
func (s *Store) commit(ctx context.Context, t *tx) (outcome, error) {
	ws, err := t.etcdWrites()
	if err != nil {
		return 0, err
	}
	k := s.k
	fixed := []clientv3.Cmp{
		// No large transaction is being rolled forward: until it is
		// whole, nobody else commits.
		clientv3.Compare(clientv3.Version(k.commitPrefix()).WithRange(prefixEnd(k.commitPrefix())), "=", 0),
		clientv3.Compare(clientv3.Version(k.abort(t.bucket, t.txid)), "=", 0),
	}
	if r := s.reg.Load(); r != nil && r.isLost.Load() {
		return 0, ErrFenced
	}
	fc := s.fence.Load()
	if fc != nil {
		fixed = append(fixed, fc.cmp())
	}
	cmps := append(t.compares(s.lim.ops-len(fixed)-1), fixed...)
	size := cmpCost(cmps) + opCost(k.done(t.bucket, t.txid), "", 0)
	for _, w := range ws {
		size += w.cost()
	}
	if len(ws)+1 > s.lim.ops || size > s.lim.bytes {
		return s.commitStaged(ctx, t, ws, cmps)
	}
	ops := make([]clientv3.Op, 0, len(ws)+1)
	for _, w := range ws {
		ops = append(ops, w.op())
	}
	ops = append(ops, clientv3.OpPut(k.done(t.bucket, t.txid), ""))
	resp, err := s.cli.Txn(ctx).If(cmps...).Then(ops...).Else(s.elseOps(fc)...).Commit()
	if err != nil {
		return s.resolve(ctx, t, err)
	}
	if resp.Succeeded {
		return committed, nil
	}
	if s.fenced(fc, resp) {
		return 0, ErrFenced
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		// Blocked by a large transaction, not by a change to what fn read.
		if err := s.awaitCommit(ctx, string(kvs[0].Key)); err != nil {
			return 0, err
		}
	}
	return conflicted, nil
}

// resolve decides the outcome of a commit whose reply was lost (the member
// died, the connection broke, the leader changed): either its outcome
// marker exists, or this writes its abort marker, after which the commit,
// should its request still be on its way, fails its compare. The answer
// is exact; only a cluster that stays unreachable for the whole retry
// window leaves it unknown.
func (s *Store) resolve(ctx context.Context, t *tx, cause error) (outcome, error) {
	if !transient(cause) && ctx.Err() == nil {
		return 0, s.mapErr(ctx, cause)
	}
	// The caller's context may be what ended the request: resolving still
	// gets a few seconds of its own.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.UnavailableTimeout)
	defer cancel()
	k := s.k
	for n := 1; ; n++ {
		resp, err := s.cli.Txn(rctx).
			If(clientv3.Compare(clientv3.Version(k.done(t.bucket, t.txid)), "=", 0)).
			Then(clientv3.OpPut(k.abort(t.bucket, t.txid), "")).Commit()
		if err == nil {
			if !resp.Succeeded {
				return committed, nil
			}
			if cerr := ctx.Err(); cerr != nil {
				return 0, cerr
			}
			return lost, nil
		}
		if !transient(err) || sleep(rctx, backoff(n, 10*time.Millisecond, 500*time.Millisecond)) != nil {
			return 0, fmt.Errorf("etcd journal: commit outcome unknown (%v; resolving: %v): %w", cause, err, journal.ErrUnavailable)
		}
	}
}

// commitStaged commits a transaction too large for one etcd request:
//
//  1. stage: its writes go, in chunks that each fit a request, under
//     x/stage/<txid>/ (nobody reads there);
//  2. publish: one small transaction holds under t's compares and writes
//     x/commit/<txid> (and the outcome marker): this is the commit point;
//  3. roll forward: each chunk is applied and deleted in a transaction of
//     its own, then the commit key is deleted.
//
// While a commit key exists, no other transaction commits (every commit
// compares x/commit/ empty) and every reader's first read waits for it to
// finish or finishes it (awaitCommit), so nobody sees part of it. A crash
// before 2 leaves staged garbage the maintenance deletes; after 2, the
// next reader rolls forward.
func (s *Store) commitStaged(ctx context.Context, t *tx, ws []write, cmps []clientv3.Cmp) (outcome, error) {
	k := s.k
	chunks := chunkWrites(ws, s.lim)
	cleanup := func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if _, err := s.cli.Delete(cctx, k.stagePrefix(t.txid), clientv3.WithPrefix()); err != nil {
			s.opts.Logger.Warn("etcd journal: delete staged writes (the maintenance will)", "txid", t.txid, "err", err)
		}
	}
	if err := s.stage(ctx, t.txid, chunks); err != nil {
		cleanup()
		if transient(err) {
			return lost, nil
		}
		return 0, s.mapErr(ctx, err)
	}
	cmps = append(cmps, clientv3.Compare(clientv3.Version(k.stage(t.txid, 0)), ">", 0))
	resp, err := s.cli.Txn(ctx).If(cmps...).Then(
		clientv3.OpPut(k.commit(t.txid), strconv.Itoa(len(chunks))),
		clientv3.OpPut(k.done(t.bucket, t.txid), ""),
	).Else(s.elseOps(s.fence.Load())...).Commit()
	var res outcome
	switch {
	case err != nil:
		if res, err = s.resolve(ctx, t, err); err != nil {
			return 0, err
		}
	case resp.Succeeded:
		res = committed
	case s.fenced(s.fence.Load(), resp):
		cleanup()
		return 0, ErrFenced
	default:
		res = conflicted
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			cleanup()
			if err := s.awaitCommit(ctx, string(kvs[0].Key)); err != nil {
				return 0, err
			}
			return conflicted, nil
		}
	}
	if res != committed {
		cleanup()
		return res, nil
	}
	// Committed: the rest is bookkeeping anyone can finish, so a failure
	// here does not make the Update fail.
	if err := s.opts.Failpoint(FailpointRollForward); err != nil {
		return committed, nil
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.UnavailableTimeout)
	defer cancel()
	if err := s.rollForward(rctx, t.txid); err != nil {
		s.opts.Logger.Warn("etcd journal: roll forward (the next reader will finish it)", "txid", t.txid, "err", err)
	}
	return committed, nil
}

// stage writes the chunks, a few at a time.
func (s *Store) stage(ctx context.Context, txid string, chunks [][]byte) error {
	var mu sync.Mutex
	var first error
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for i, c := range chunks {
		sem <- struct{}{}
		mu.Lock()
		failed := first != nil
		mu.Unlock()
		if failed {
			<-sem
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			if _, err := s.cli.Put(ctx, s.k.stage(txid, i), string(c)); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return first
}

// rollForward applies the staged chunks of a published transaction, each
// once (applying a chunk deletes it, under a compare of its revision),
// then ends the transaction. Any number of clients may run it at once.
func (s *Store) rollForward(ctx context.Context, txid string) error {
	k := s.k
	var retry retrier
	for {
		resp, err := s.cli.Get(ctx, k.commit(txid))
		if err != nil {
			if rerr := retry.transient(ctx, s, err); rerr != nil {
				return rerr
			}
			continue
		}
		if len(resp.Kvs) == 0 {
			return nil // finished
		}
		n, err := strconv.Atoi(string(resp.Kvs[0].Value))
		if err != nil || n < 1 {
			return fmt.Errorf("etcd journal: commit %s: chunk count %q: %w", txid, resp.Kvs[0].Value, journal.ErrCorrupt)
		}
		for i := 0; i < n; i++ {
			if err := s.applyChunk(ctx, txid, i); err != nil {
				if rerr := retry.transient(ctx, s, err); rerr != nil {
					return rerr
				}
				i-- // again
			}
		}
		end, err := s.cli.Txn(ctx).If(
			clientv3.Compare(clientv3.Version(k.commit(txid)), ">", 0),
			clientv3.Compare(clientv3.Version(k.stagePrefix(txid)).WithPrefix(), "=", 0),
		).Then(clientv3.OpDelete(k.commit(txid))).Commit()
		if err != nil {
			if rerr := retry.transient(ctx, s, err); rerr != nil {
				return rerr
			}
			continue
		}
		if end.Succeeded {
			return nil
		}
	}
}

func (s *Store) applyChunk(ctx context.Context, txid string, i int) error {
	k := s.k
	resp, err := s.cli.Get(ctx, k.stage(txid, i))
	if err != nil || len(resp.Kvs) == 0 {
		return err // applied already, or retry
	}
	ws, err := decodeChunk(resp.Kvs[0].Value)
	if err != nil {
		return fmt.Errorf("etcd journal: staged chunk %s/%d: %w", txid, i, err)
	}
	ops := make([]clientv3.Op, 0, len(ws)+1)
	for _, w := range ws {
		ops = append(ops, w.op())
	}
	ops = append(ops, clientv3.OpDelete(k.stage(txid, i)))
	_, err = s.cli.Txn(ctx).If(
		clientv3.Compare(clientv3.Version(k.commit(txid)), ">", 0),
		clientv3.Compare(clientv3.ModRevision(k.stage(txid, i)), "=", resp.Kvs[0].ModRevision),
	).Then(ops...).Commit()
	// A failed compare: someone else applied it.
	return err
}

// awaitCommit waits until the large transaction whose commit key is key is
// rolled forward, by its writer, or by this caller if the writer makes no
// progress for Options.RollForwardStall (it died, or is cut off).
func (s *Store) awaitCommit(ctx context.Context, key string) error {
	txid := strings.TrimPrefix(key, s.k.commitPrefix())
	last, since := int64(-1), time.Now()
	var retry retrier
	for {
		resp, err := s.cli.Txn(ctx).Then(
			clientv3.OpGet(key, clientv3.WithCountOnly()),
			clientv3.OpGet(s.k.stagePrefix(txid), clientv3.WithPrefix(), clientv3.WithCountOnly()),
		).Commit()
		if err != nil {
			if rerr := retry.transient(ctx, s, err); rerr != nil {
				return rerr
			}
			continue
		}
		if resp.Responses[0].GetResponseRange().Count == 0 {
			return nil
		}
		switch left := resp.Responses[1].GetResponseRange().Count; {
		case left != last:
			last, since = left, time.Now()
		case time.Since(since) > s.opts.RollForwardStall:
			return s.rollForward(ctx, txid)
		}
		if err := sleep(ctx, 5*time.Millisecond); err != nil {
			return err
		}
	}
}

// chunkWrites packs writes into staged chunks, each applicable (with the
// deletion of the chunk) in one transaction. A chunk is a sequence of
// records: kind (1 byte: 'p' put, 'd' delete), key length (uvarint), key,
// and for a put the value's length (uvarint) and the value.
func chunkWrites(ws []write, lim limits) [][]byte {
	var chunks [][]byte
	var cur []byte
	n, size := 0, 0
	for _, w := range ws {
		c := w.cost()
		if n > 0 && (n+1 > lim.chunkOps || size+c > lim.chunkBytes) {
			chunks, cur, n, size = append(chunks, cur), nil, 0, 0
		}
		if w.del {
			cur = append(cur, 'd')
		} else {
			cur = append(cur, 'p')
		}
		cur = binary.AppendUvarint(cur, uint64(len(w.key)))
		cur = append(cur, w.key...)
		if !w.del {
			cur = binary.AppendUvarint(cur, uint64(len(w.val)))
			cur = append(cur, w.val...)
		}
		n, size = n+1, size+c
	}
	if n > 0 {
		chunks = append(chunks, cur)
	}
	return chunks
}

var errBadChunk = fmt.Errorf("malformed staged chunk: %w", journal.ErrCorrupt)

func decodeChunk(b []byte) ([]write, error) {
	var ws []write
	field := func() ([]byte, error) {
		l, n := binary.Uvarint(b)
		if n <= 0 || l > uint64(len(b)-n) {
			return nil, errBadChunk
		}
		v := b[n : n+int(l)]
		b = b[n+int(l):]
		return v, nil
	}
	for len(b) > 0 {
		kind := b[0]
		b = b[1:]
		key, err := field()
		if err != nil {
			return nil, err
		}
		switch kind {
		case 'd':
			ws = append(ws, write{key: string(key), del: true})
		case 'p':
			val, err := field()
			if err != nil {
				return nil, err
			}
			ws = append(ws, write{key: string(key), val: val})
		default:
			return nil, errBadChunk
		}
	}
	if len(ws) == 0 {
		return nil, errBadChunk
	}
	return ws, nil
}
