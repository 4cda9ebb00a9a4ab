package fabric

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/journal"
	journaletcd "github.com/esf-dev/esf/journal/etcd"
)

// Cluster is this daemon's membership of a graph several workers share
// (the etcd journal): its registration under an etcd lease, which fences
// every commit of its journal (see journal/etcd's worker.go).
//
// With a Cluster, the daemon
//   - names itself by the registration's id in the runtime records of the
//     attempts it runs (their owner);
//   - publishes its load (live attempts) in its worker record;
//   - fails the live attempts of workers whose registration is gone (a
//     dead or stopped worker's lease ended: nobody runs them any more);
//   - stops the sandboxes of its own attempts that ended elsewhere (a lease
//     expired by another worker, a failure decided by a survivor);
//   - when its own registration is lost, stops every sandbox it runs, by
//     itself: its commits are refused by then, and survivors fail its
//     attempts;
//   - recovers, expires and stops only its own attempts;
//   - authenticates provenance with a key all workers share (kept in the
//     journal), so a record one worker wrote verifies on every other.
type Cluster struct {
	Store        *journaletcd.Store
	Registration *journaletcd.Registration
	// Interval is how often the worker publishes its load and looks for
	// dead workers' attempts and its own ended ones; default 1 s.
	Interval time.Duration
}

// provKeyRecord is the journal key of the provenance MAC key the workers of
// a cluster share. It is configuration, not a graph record.
var provKeyRecord = []byte("cfg/provenance-key")

// sharedKey reads the cluster's provenance key, creating it once (a
// start commits nothing when it exists).
func sharedKey(ctx context.Context, s journal.Store) ([]byte, error) {
	var key []byte
	err := s.View(ctx, func(r journal.Reader) error {
		b, err := r.Get(provKeyRecord)
		if err == nil && len(b) == 32 {
			key = b
		}
		return nil
	})
	if err != nil || key != nil {
		return key, err
	}
	err = s.Update(ctx, func(tx journal.Tx) error {
		b, err := tx.Get(provKeyRecord)
		if err == nil && len(b) == 32 {
			key = b
			return nil
		}
		if err != nil && !errors.Is(err, journal.ErrNotFound) {
			return err
		}
		key = make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return err
		}
		return tx.Put(provKeyRecord, key)
	})
	if err != nil {
		return nil, fmt.Errorf("provenance key of the cluster: %w", err)
	}
	return key, nil
}

// Fenced reports whether this worker lost its registration: it can change
// nothing in the graph any more and has stopped its sandboxes.
func (f *Fabric) Fenced() bool {
	if f.cluster == nil {
		return false
	}
	select {
	case <-f.cluster.Registration.Lost():
		return true
	default:
		return false
	}
}

// WorkerInfo is a worker of the graph and its load.
type WorkerInfo = journaletcd.Worker

// Workers lists the workers of the graph; without a cluster, this daemon
// alone.
func (f *Fabric) Workers(ctx context.Context) ([]WorkerInfo, error) {
	if f.cluster == nil {
		live, _ := f.quota.counts()
		return []WorkerInfo{{ID: f.worker, Capacity: f.opts.MaxLiveAttempts, Live: live}}, nil
	}
	return f.cluster.Store.Workers(ctx)
}

// WorkerID is the id this daemon runs attempts under.
func (f *Fabric) WorkerID() string { return f.worker }

// ownsRuntime reports whether this daemon may act on the attempt whose
// runtime record is rt (always, without a cluster).
func (f *Fabric) ownsRuntime(rt *journal.AttemptRuntime) bool {
	return f.cluster == nil || (rt != nil && rt.Worker == f.worker)
}

// clusterLoop is the membership's background work, from Open to Close.
func (f *Fabric) clusterLoop(ctx context.Context) {
	every := f.cluster.Interval
	if every <= 0 {
		every = time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.cluster.Registration.Lost():
			f.stopOwnSandboxes(ctx)
			return
		case <-t.C:
		}
		if err := f.clusterRound(ctx); err != nil && ctx.Err() == nil {
			f.log.Warn("cluster round", "err", err)
		}
	}
}

// clusterRound publishes the load, fails dead workers' attempts and stops
// the sandboxes of own attempts that ended.
func (f *Fabric) clusterRound(ctx context.Context) error {
	live, _ := f.quota.counts()
	if err := f.cluster.Registration.SetLive(ctx, live); err != nil {
		return err
	}
	workers, err := f.cluster.Store.Workers(ctx)
	if err != nil {
		return err
	}
	alive := map[string]bool{f.worker: true}
	for _, w := range workers {
		alive[w.ID] = true
	}
	var dead []journal.AttemptRuntime
	mine := map[string]bool{}
	err = f.journal.View(ctx, func(r journal.Reader) error {
		return journal.AttemptRuntimes(r, func(rt journal.AttemptRuntime) error {
			switch {
			case rt.Worker == f.worker:
				mine[rt.AttemptID] = true
			case !alive[rt.Worker]:
				dead = append(dead, rt)
			}
			return nil
		})
	})
	if err != nil {
		return err
	}
	var errs []error
	for _, rt := range dead {
		if err := f.failOrphan(ctx, rt); err != nil {
			errs = append(errs, err)
		}
	}
	// Own attempts with a delta here but no longer live (nor queued) in
	// the journal ended elsewhere: their sandboxes go.
	ents, _ := os.ReadDir(filepath.Join(f.stateDir, "attempts"))
	for _, e := range ents {
		if !mine[e.Name()] {
			f.stopEnded(ctx, e.Name())
		}
	}
	return errors.Join(errs...)
}

// failOrphan fails a live attempt whose owner's registration is gone.
func (f *Fabric) failOrphan(ctx context.Context, rt journal.AttemptRuntime) error {
	failed := false
	err := f.journal.Update(ctx, func(tx journal.Tx) error {
		failed = false
		cur, err := journal.GetAttemptRuntime(tx, rt.AttemptID)
		if isNotFound(err) || (err == nil && cur.Worker != rt.Worker) {
			return nil // ended or taken meanwhile
		}
		if err != nil {
			return err
		}
		failed = true
		return releaseInTx(tx, f.callInfo(ctx), rt.AttemptID, journal.AttemptFailed,
			fmt.Sprintf("worker %s lost its lease", rt.Worker))
	})
	if err != nil {
		return fmt.Errorf("fail attempt %s of lost worker %s: %w", rt.AttemptID, rt.Worker, err)
	}
	if failed {
		f.log.Warn("failed the attempt of a lost worker", "attempt_id", rt.AttemptID, "worker", rt.Worker)
	}
	return nil
}

// stopEnded stops the container of an attempt with a delta on this worker,
// unmounts its root and deletes its delta, if the journal says it ended.
// An attempt the journal does not know yet (being activated) is left alone.
func (f *Fabric) stopEnded(ctx context.Context, id string) {
	defer f.lockAttempt(id)()
	a, err := f.attemptView(ctx, id)
	if err != nil || a.State.Live() {
		return
	}
	if err := f.unmountAttempt(a.Attempt, a.Runtime); err != nil {
		f.log.Error("stop the sandbox of an ended attempt", "attempt_id", id, "err", err)
		return
	}
	f.deleteDelta(id)
	f.attemptEnded(ctx, id)
}

// stopOwnSandboxes runs when this worker lost its registration: it stops
// every container and unmounts every root of its attempts, without asking
// the journal for anything but reads (its commits are refused). Survivors
// fail the attempts.
func (f *Fabric) stopOwnSandboxes(ctx context.Context) {
	f.log.Error("this worker lost its registration: stopping its sandboxes; restart esfd to rejoin", "worker", f.worker)
	ents, _ := os.ReadDir(filepath.Join(f.stateDir, "attempts"))
	for _, e := range ents {
		id := e.Name()
		func() {
			defer f.lockAttempt(id)()
			a, err := f.attemptView(ctx, id)
			if err != nil {
				// Unknown: a root mounted for an activation that never
				// committed; nothing of it may stay either.
				a.AttemptID, a.Executor = id, ExecutorRunc
			}
			if err := f.unmountAttempt(a.Attempt, a.Runtime); err != nil {
				f.log.Error("stop sandbox of a fenced worker", "attempt_id", id, "err", err)
				return
			}
			f.deleteDelta(id)
		}()
	}
}

// Route says where a call on an attempt (named by its id, or by its
// lease's) must run: "" when here (this worker owns it, it has no owner,
// or there is no cluster), else the owner's API address. An owner that
// lists no address cannot be reached: failed_precondition.
func (f *Fabric) Route(ctx context.Context, attemptID, leaseID string) (string, error) {
	if f.cluster == nil || (attemptID == "" && leaseID == "") {
		return "", nil
	}
	owner := ""
	err := f.journal.View(ctx, func(r journal.Reader) error {
		if attemptID == "" {
			l, err := journal.GetLease(r, leaseID)
			if err != nil {
				return err
			}
			attemptID = l.AttemptID
		}
		rt, err := journal.GetAttemptRuntime(r, attemptID)
		if err == nil {
			owner = rt.Worker
		}
		return nil
	})
	if err != nil && !isNotFound(err) {
		return "", err
	}
	if owner == "" || owner == f.worker {
		return "", nil // here: the operation itself reports what is wrong
	}
	return f.workerAddr(ctx, owner)
}

func (f *Fabric) workerAddr(ctx context.Context, id string) (string, error) {
	ws, err := f.cluster.Store.Workers(ctx)
	if err != nil {
		return "", err
	}
	for _, w := range ws {
		if w.ID == id {
			if w.Addr == "" {
				return "", fmt.Errorf("worker %s has no API address (--listen, --advertise): %w", id, errdefs.ErrFailedPrecondition)
			}
			return w.Addr, nil
		}
	}
	return "", fmt.Errorf("worker %s is not registered (its lease ended): %w", id, errdefs.ErrUnavailable)
}

// Place chooses the worker an activation runs on: the one it is pinned to
// (worker), else the least loaded worker with free capacity that is
// reachable (has an address), this one on a tie. "" is here.
func (f *Fabric) Place(ctx context.Context, worker string) (string, error) {
	if f.cluster == nil {
		if worker != "" && worker != f.worker {
			return "", fmt.Errorf("no worker %s: this daemon is alone on its graph: %w", worker, errdefs.ErrNotFound)
		}
		return "", nil
	}
	if worker == f.worker {
		return "", nil
	}
	if worker != "" {
		return f.workerAddr(ctx, worker)
	}
	ws, err := f.cluster.Store.Workers(ctx)
	if err != nil {
		return "", err
	}
	load := func(w WorkerInfo) float64 {
		if w.Capacity <= 0 {
			return float64(w.Live) / 1e6 // unbounded: by count, below any bounded one
		}
		return float64(w.Live) / float64(w.Capacity)
	}
	var best *WorkerInfo
	for i := range ws {
		w := &ws[i]
		if w.ID == f.worker {
			live, _ := f.quota.counts()
			w.Live = live // fresher than the published one
		}
		if (w.Addr == "" && w.ID != f.worker) || (w.Capacity > 0 && w.Live >= w.Capacity) {
			continue
		}
		if best == nil || load(*w) < load(*best) || (load(*w) == load(*best) && w.ID == f.worker) {
			best = w
		}
	}
	if best == nil || best.ID == f.worker {
		return "", nil // full everywhere: queue here
	}
	return best.Addr, nil
}
