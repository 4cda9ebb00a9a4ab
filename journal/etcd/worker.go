package etcd

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/esf-dev/esf/journal"
)

// Workers. Each esfd on a shared journal registers under an etcd lease:
//
//	P w/<worker id>   the worker's record (Worker, JSON), attached to its lease
//
// The key exists exactly while the lease lives: etcd deletes it when the
// lease expires (the worker stopped renewing: killed, stopped, cut off) or
// is revoked. Once a store has registered, every commit it makes compares
// the key's create revision with the one its registration wrote (the
// fencing compare, in the same etcd transaction as the writes). A worker
// whose lease expired can therefore change nothing, whatever it believes:
// the compare is evaluated by the cluster, at the commit's revision, not by
// the worker's clock. Re-registering creates the key anew with another
// create revision, so even a worker that registered again under the same
// id cannot commit with an old registration.

// Worker is a registered worker's record.
type Worker struct {
	ID string `json:"id"`
	// Addr is the worker's API address (an https:// or http:// URL), empty
	// if it serves only its unix socket.
	Addr string `json:"addr,omitempty"`
	// Capacity is how many attempts it runs at once, 0 unbounded.
	Capacity int `json:"capacity,omitempty"`
	// Live is how many attempts it runs now (its load), updated as they
	// start and end.
	Live    int       `json:"live"`
	Started time.Time `json:"started"`
	// TTLSeconds is its lease's TTL.
	TTLSeconds int64 `json:"ttl_s"`
	// State identifies what the process holds exclusively while it runs
	// (fabric.StateLock's ID), empty for none. A process registering with
	// the State of the current holder of its id takes the id over at once
	// (see Register). Two live processes must never present one State.
	State string `json:"state,omitempty"`
}

// ErrFenced is returned by every commit of a store whose registration was
// lost (its lease expired or was revoked): the worker is no longer a member
// and may change nothing. It wraps journal.ErrFailedPrecondition.
var ErrFenced = fmt.Errorf("etcd journal: this worker's registration (lease) is lost: %w", journal.ErrFailedPrecondition)

func (k keys) workerPrefix() string       { return k.p + "w/" }
func (k keys) worker(id string) string    { return k.workerPrefix() + id }
func (k keys) workerID(key []byte) string { return strings.TrimPrefix(string(key), k.workerPrefix()) }

// Registration is a store's membership: its worker record under a lease
// the store keeps alive.
type Registration struct {
	s         *Store
	key       string
	lease     clientv3.LeaseID
	createRev int64

	mu   sync.Mutex
	rec  Worker
	lost chan struct{}
	once sync.Once
	// isLost: Lost is closed; every later commit fails without asking.
	isLost    atomic.Bool
	closeOnce sync.Once
	closeErr  error
	stop      context.CancelFunc
	done      chan struct{}
}

// fence is what every commit of a registered store compares.
type fence struct {
	key       string
	createRev int64
}

// Register makes this store a worker of the cluster: it grants a lease of
// ttl, writes w under it and keeps it alive until Close. From then on
// every commit of the store carries the fencing compare. If a worker of
// the same id is registered (a previous process whose lease has not
// expired yet), Register waits for its key to go, until ctx ends: two
// processes never hold one id; unless that record has w's non-empty
// State: its process is gone, and Register takes the id over at once (the
// old registration is fenced). A store registers at most once.
func (s *Store) Register(ctx context.Context, w Worker, ttl time.Duration) (*Registration, error) {
	if w.ID == "" || strings.ContainsAny(w.ID, "/\x00") {
		return nil, fmt.Errorf("register worker %q: bad id: %w", w.ID, journal.ErrInvalidArgument)
	}
	secs := int64((ttl + time.Second - 1) / time.Second)
	if secs < 1 {
		secs = 1
	}
	if s.fence.Load() != nil {
		return nil, fmt.Errorf("register worker %q: already registered: %w", w.ID, journal.ErrFailedPrecondition)
	}
	w.TTLSeconds = secs
	if w.Started.IsZero() {
		w.Started = s.now()
	}
	key := s.k.worker(w.ID)
	var retry retrier
	for {
		g, err := s.cli.Grant(ctx, secs)
		if err != nil {
			if rerr := retry.transient(ctx, s, s.mapErr(ctx, err)); rerr != nil {
				return nil, fmt.Errorf("register worker %s: %w", w.ID, rerr)
			}
			continue
		}
		val, _ := json.Marshal(w)
		resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.Version(key), "=", 0)).
			Then(clientv3.OpPut(key, string(val), clientv3.WithLease(g.ID))).
			Else(clientv3.OpGet(key)).Commit()
		if err != nil || !resp.Succeeded {
			s.cli.Revoke(context.WithoutCancel(ctx), g.ID)
			if err != nil {
				if rerr := retry.transient(ctx, s, s.mapErr(ctx, err)); rerr != nil {
					return nil, fmt.Errorf("register worker %s: %w", w.ID, rerr)
				}
				continue
			}
			// Taken: by a dead process of the same state, take it back;
			// else wait for the holder's lease to end.
			if took, err := s.takeOver(ctx, key, w.State, resp); err != nil {
				if rerr := retry.transient(ctx, s, s.mapErr(ctx, err)); rerr != nil {
					return nil, fmt.Errorf("register worker %s: %w", w.ID, rerr)
				}
				continue
			} else if took {
				continue
			}
			s.opts.Logger.Warn("worker id registered by another process; waiting for its lease to end", "worker", w.ID)
			if err := s.awaitGone(ctx, key); err != nil {
				return nil, fmt.Errorf("register worker %s: %w", w.ID, err)
			}
			continue
		}
		r := &Registration{s: s, key: key, lease: g.ID, createRev: resp.Header.Revision, rec: w,
			lost: make(chan struct{}), done: make(chan struct{})}
		s.reg.Store(r)
		s.fence.Store(&fence{key: key, createRev: r.createRev})
		kctx, cancel := context.WithCancel(context.Background())
		r.stop = cancel
		ka, err := s.cli.KeepAlive(kctx, g.ID)
		if err != nil {
			cancel()
			r.markLost()
			close(r.done)
			return nil, fmt.Errorf("register worker %s: keep alive: %w", w.ID, s.mapErr(ctx, err))
		}
		go r.keepAlive(kctx, ka)
		return r, nil
	}
}

// takeOver deletes the worker record a failed registration found in the
// way (resp's Else) if it has state (non-empty), and revokes its lease.
// It reports whether the key is free to try again.
func (s *Store) takeOver(ctx context.Context, key, state string, resp *clientv3.TxnResponse) (bool, error) {
	if state == "" || len(resp.Responses) == 0 {
		return false, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return true, nil // gone meanwhile
	}
	var old Worker
	if err := json.Unmarshal(kvs[0].Value, &old); err != nil || old.State != state {
		return false, nil
	}
	kv := kvs[0]
	if _, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", kv.CreateRevision)).
		Then(clientv3.OpDelete(key)).Commit(); err != nil {
		return false, err
	}
	// Whether this delete or another took the record, it is gone; its
	// lease holds nothing else.
	if kv.Lease != 0 {
		s.cli.Revoke(context.WithoutCancel(ctx), clientv3.LeaseID(kv.Lease))
	}
	s.opts.Logger.Warn("worker id registered by a previous process of this state, which is gone; taking it back",
		"worker", old.ID, "started", old.Started)
	return true, nil
}

// awaitGone waits until key does not exist.
func (s *Store) awaitGone(ctx context.Context, key string) error {
	for {
		wctx, cancel := context.WithCancel(ctx)
		resp, err := s.cli.Get(wctx, key)
		if err == nil && len(resp.Kvs) == 0 {
			cancel()
			return nil
		}
		if err == nil {
			wch := s.cli.Watch(wctx, key, clientv3.WithRev(resp.Header.Revision+1))
			for wr := range wch {
				if wr.Err() != nil {
					break
				}
				for _, ev := range wr.Events {
					if ev.Type == clientv3.EventTypeDelete {
						cancel()
						return nil
					}
				}
			}
		}
		cancel()
		if err := sleep(ctx, time.Second); err != nil {
			return err
		}
	}
}

// keepAlive renews the lease until Close, and declares the registration
// lost when the lease ends (the channel closes: the cluster said the lease
// is gone, or renewals failed past its TTL) or the key disappears.
func (r *Registration) keepAlive(ctx context.Context, ka <-chan *clientv3.LeaseKeepAliveResponse) {
	defer close(r.done)
	wch := r.s.cli.Watch(ctx, r.key, clientv3.WithRev(r.createRev+1))
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case resp, ok := <-ka:
			if !ok || resp == nil || resp.TTL <= 0 {
				if ctx.Err() == nil {
					r.markLost()
				}
				return
			}
			last = time.Now()
		case wr, ok := <-wch:
			if !ok {
				wch = nil
				continue
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					r.markLost()
					return
				}
			}
		case <-tick.C:
			// The process was stopped (SIGSTOP) or starved past its TTL:
			// the lease is gone on the cluster whatever the channel says.
			// Ask the cluster whether the key is still ours; if it cannot
			// say, the lease may have ended: stop acting as a member.
			if time.Since(last) > time.Duration(r.rec.TTLSeconds)*time.Second {
				gctx, cancel := context.WithTimeout(ctx, time.Duration(r.rec.TTLSeconds)*time.Second)
				resp, err := r.s.cli.Get(gctx, r.key, clientv3.WithKeysOnly())
				cancel()
				if ctx.Err() != nil {
					return
				}
				if err != nil || len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != r.createRev {
					r.markLost()
					return
				}
				last = time.Now()
			}
		}
	}
}

func (r *Registration) markLost() {
	r.once.Do(func() {
		r.isLost.Store(true)
		r.s.opts.Logger.Error("worker registration lost: this worker is fenced and can change nothing", "worker", r.rec.ID)
		close(r.lost)
	})
}

// Lost is closed when the registration is lost: the lease expired or was
// revoked, or the store found its fencing compare failing.
func (r *Registration) Lost() <-chan struct{} { return r.lost }

// ID is the worker id.
func (r *Registration) ID() string { return r.rec.ID }

// SetLive records the worker's load (its live attempts) in its record.
// The write holds only while the registration does.
func (r *Registration) SetLive(ctx context.Context, live int) error {
	r.mu.Lock()
	if r.rec.Live == live {
		r.mu.Unlock()
		return nil
	}
	r.rec.Live = live
	val, _ := json.Marshal(r.rec)
	r.mu.Unlock()
	resp, err := r.s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(r.key), "=", r.createRev)).
		Then(clientv3.OpPut(r.key, string(val), clientv3.WithLease(r.lease))).Commit()
	if err != nil {
		return r.s.mapErr(ctx, err)
	}
	if !resp.Succeeded {
		r.markLost()
		return ErrFenced
	}
	return nil
}

// Close revokes the lease (the worker leaves the cluster at once) and stops
// renewing it. Call it before closing the store; closing twice is nil.
func (r *Registration) Close() error {
	r.closeOnce.Do(func() {
		r.stop()
		<-r.done
		if r.isLost.Load() {
			return // nothing left to revoke
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := r.s.cli.Revoke(ctx, r.lease); err != nil {
			r.closeErr = fmt.Errorf("worker %s: revoke its lease: %w", r.rec.ID, r.s.mapErr(ctx, err))
		}
	})
	return r.closeErr
}

// Workers lists the registered workers, by id.
func (s *Store) Workers(ctx context.Context) ([]Worker, error) {
	resp, err := s.cli.Get(ctx, s.k.workerPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("list workers: %w", s.mapErr(ctx, err))
	}
	out := make([]Worker, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var w Worker
		if err := json.Unmarshal(kv.Value, &w); err != nil {
			return nil, fmt.Errorf("worker %s: %v: %w", s.k.workerID(kv.Key), err, journal.ErrCorrupt)
		}
		out = append(out, w)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

func (f *fence) cmp() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(f.key), "=", f.createRev)
}

// elseOps are what a failed commit reads to tell why it failed: a large
// transaction in the way, or (registered) the fencing compare.
func (s *Store) elseOps(fc *fence) []clientv3.Op {
	ops := []clientv3.Op{clientv3.OpGet(s.k.commitPrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1))}
	if fc != nil {
		ops = append(ops, clientv3.OpGet(fc.key, clientv3.WithKeysOnly()))
	}
	return ops
}

// fenced reports whether a failed commit failed its fencing compare, and
// then declares the registration lost.
func (s *Store) fenced(fc *fence, resp *clientv3.TxnResponse) bool {
	if fc == nil || len(resp.Responses) < 2 {
		return false
	}
	kvs := resp.Responses[1].GetResponseRange().Kvs
	if len(kvs) == 1 && kvs[0].CreateRevision == fc.createRev {
		return false
	}
	if r := s.reg.Load(); r != nil {
		r.markLost()
	}
	return true
}
