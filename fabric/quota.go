package fabric

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/journal"
)

// Quotas (FR-08): a daemon runs at most MaxLiveAttempts attempts whose
// reserved memory adds up to at most MaxMemoryBytes, however large the
// graph. An activation beyond that is recorded as a queued attempt and
// started first-in first-out when capacity frees; with NoQueue it is
// refused with quota_exceeded instead. Capacity is per daemon and lives in
// memory: the journal is the truth about which attempts are live, and
// Recover rebuilds the tally and the queue from it.

// DefaultAttemptMemory is what an attempt reserves against MaxMemoryBytes
// when it names no memory limit.
const DefaultAttemptMemory = 512 << 20

type quota struct {
	maxLive int   // 0: unlimited
	maxMem  int64 // 0: unlimited

	mu    sync.Mutex
	live  map[string]int64 // attempt id → reserved bytes
	held  int              // reservations not yet bound to an attempt
	heldM int64
	queue []queued // FIFO

	// room, when set, hears the live-attempt room left after every
	// change (executor.PoolLimiter); called without mu held, under
	// roomMu: one change's number never reaches the pool after a later
	// change's.
	room   func(n int)
	roomMu sync.Mutex
}

type queued struct {
	id  string
	mem int64
}

func newQuota(maxLive int, maxMem int64) *quota {
	return &quota{maxLive: maxLive, maxMem: maxMem, live: map[string]int64{}}
}

func (q *quota) fitsLocked(mem int64) bool {
	n := len(q.live) + q.held
	var used int64 = q.heldM
	for _, m := range q.live {
		used += m
	}
	return (q.maxLive == 0 || n < q.maxLive) && (q.maxMem == 0 || used+mem <= q.maxMem)
}

// reserve takes capacity for a new activation if it fits and nobody is
// queued ahead of it (FIFO).
//
// Neither it nor bind tells the pool (room): the activation is about to
// adopt one of its idle containers, which the executor then counts
// itself; startContainer (or unreserve) tells it the outcome.
func (q *quota) reserve(mem int64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.queue) > 0 || !q.fitsLocked(mem) {
		return false
	}
	q.held++
	q.heldM += mem
	return true
}

// changed tells room how many more attempts could start now: a warm pool
// of the executor sizes itself to it, so pre-started containers count
// against MaxLiveAttempts with the attempts (-1: unlimited). A Start
// takes its own place from that room in the executor, adopted or cold (a
// cold start first stops an idle container beyond it), until this says
// the same.
func (q *quota) changed() {
	if q.room == nil {
		return
	}
	// Computed and told under one lock: two changes that told the pool
	// in the other order would leave it sized to the older, larger room.
	q.roomMu.Lock()
	defer q.roomMu.Unlock()
	q.mu.Lock()
	n := -1
	if q.maxLive > 0 {
		n = max(q.maxLive-len(q.live)-q.held, 0)
	}
	q.mu.Unlock()
	q.room(n)
}

// bind turns a reservation into the attempt's; a replayed activation
// (the attempt is already live) gives its reservation back.
func (q *quota) bind(id string, mem int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.held--
	q.heldM -= mem
	if _, ok := q.live[id]; !ok {
		q.live[id] = mem
	}
}

// unreserve gives back a reservation that was never bound.
func (q *quota) unreserve(mem int64) {
	defer q.changed()
	q.mu.Lock()
	defer q.mu.Unlock()
	q.held--
	q.heldM -= mem
}

func (q *quota) enqueue(id string, mem int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, e := range q.queue {
		if e.id == id {
			return
		}
	}
	q.queue = append(q.queue, queued{id, mem})
}

// ended frees an attempt's capacity (or its place in the queue) and
// returns the queued attempts that now fit, in order, already counted live.
func (q *quota) ended(id string) []string {
	defer q.changed()
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.live, id)
	for i, e := range q.queue {
		if e.id == id {
			q.queue = append(q.queue[:i], q.queue[i+1:]...)
			break
		}
	}
	var start []string
	for len(q.queue) > 0 && q.fitsLocked(q.queue[0].mem) {
		e := q.queue[0]
		q.queue = q.queue[1:]
		q.live[e.id] = e.mem
		start = append(start, e.id)
	}
	return start
}

// memOf is the memory reserved for a live attempt.
func (q *quota) memOf(id string) int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.live[id]
}

// adopt counts an attempt found live at recovery.
func (q *quota) adopt(id string, mem int64) {
	defer q.changed()
	q.mu.Lock()
	defer q.mu.Unlock()
	q.live[id] = mem
}

// Live and Queued report the tally, for status and metrics.
func (q *quota) counts() (live, waiting int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.live), len(q.queue)
}

// attemptEnded is called once an attempt left the live states (released,
// failed): its capacity goes to the next queued attempts.
func (f *Fabric) attemptEnded(ctx context.Context, id string) {
	for _, next := range f.quota.ended(id) {
		f.bg.Add(1)
		go func() {
			defer f.bg.Done()
			f.startQueued(context.WithoutCancel(ctx), next)
		}()
	}
}

// startQueued activates a queued attempt that was granted capacity: it
// takes its lease and mounts its root.
func (f *Fabric) startQueued(ctx context.Context, id string) {
	// As in Activate: mount and start under the attempt's lock, which a
	// failure, release or seal holds from its unmount to its commit.
	defer f.lockAttempt(id)()
	var a journal.Attempt
	err := f.journal.Update(ctx, func(tx journal.Tx) error {
		var err error
		if a, err = journal.GetAttempt(tx, id); err != nil {
			return err
		}
		if a.State != journal.AttemptQueued {
			return fmt.Errorf("attempt %s is %s: %w", id, a.State, journal.ErrFailedPrecondition)
		}
		var d rtData
		if rt, err := journal.GetAttemptRuntime(tx, id); err == nil {
			if d, err = runtimeData(&rt); err != nil {
				return err
			}
		}
		ttl := d.TTLMillis
		if ttl == 0 {
			ttl = DefaultLeaseTTL.Milliseconds()
		}
		return startInTx(tx, f.callInfo(ctx), f.ids, &a, ttl)
	})
	if err == nil {
		err = f.ensureMounted(ctx, a, "")
	}
	if err == nil {
		err = f.startContainer(ctx, a)
	}
	if err != nil {
		f.log.Error("start queued attempt", "attempt_id", id, "err", err)
		f.failAttemptLocked(ctx, id, err)
	}
}

// startInTx moves a queued or new attempt to active with a fresh lease.
func startInTx(tx journal.Tx, ci CallInfo, ids *journal.IDGen, a *journal.Attempt, ttlMillis int64) error {
	lid, err := ids.New(journal.KindLease)
	if err != nil {
		return err
	}
	token, err := journal.NextFencingToken(tx)
	if err != nil {
		return err
	}
	from := a.State
	if err := a.Transition(journal.AttemptActive); err != nil {
		return err
	}
	a.LeaseID = lid
	if err := journal.UpdateAttempt(tx, *a); err != nil {
		return err
	}
	ttl := ttlMillis
	l := journal.Lease{LeaseID: lid, AttemptID: a.AttemptID, NodeID: a.NodeID, GroupID: a.GroupID, Token: token,
		TTLMillis: ttl, ExpiresAt: tx.Now().Add(time.Duration(ttl) * time.Millisecond)}
	if err := journal.CreateLease(tx, l); err != nil {
		return err
	}
	if err := event(tx, ci, l.Event(journal.EventLeaseAcquired), map[string]any{"token": token, "ttl_ms": ttl}); err != nil {
		return err
	}
	return event(tx, ci, a.Event(journal.EventAttemptState), map[string]any{"from": from, "to": a.State})
}

func quotaExceeded(live, maxLive int) error {
	return fmt.Errorf("%d of %d live attempts, or memory quota, in use: %w", live, maxLive, errdefs.ErrQuotaExceeded)
}
