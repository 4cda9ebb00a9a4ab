package fabric

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/esf-dev/esf/delta"
	"github.com/esf-dev/esf/journal"
)

// Recover reconciles live attempts with what is mounted, after a start:
// an active attempt whose root is mounted is adopted, one whose delta
// survives is mounted again, one whose delta is gone fails; a seal cut
// before its commit (quiescing) goes back to active with its delta; a seal
// committed but not released is released.
func (f *Fabric) Recover(ctx context.Context) error {
	var live []string
	err := f.journal.View(ctx, func(r journal.Reader) error {
		return journal.ExpiredLeases(r, time.Unix(1<<40, 0), func(lid string) error {
			l, err := journal.GetLease(r, lid)
			if err != nil {
				return err
			}
			live = append(live, l.AttemptID)
			return nil
		})
	})
	if err != nil {
		return fmt.Errorf("recover: %w", err)
	}
	ci := f.callInfo(ctx)
	var errs []error
	for _, id := range live {
		a, err := f.attemptView(ctx, id)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !f.ownsRuntime(a.Runtime) {
			continue // another worker's
		}
		// An attempt whose record does not decode is left as it is
		// (its delta stays, its lease runs out) and reported.
		d, err := runtimeData(a.Runtime)
		if err != nil {
			errs = append(errs, fmt.Errorf("recover: %w", err))
			continue
		}
		if a.Runtime != nil {
			f.quota.adopt(id, d.MemoryBytes)
		}
		switch a.State {
		case journal.AttemptQuiescing:
			err = f.setAttemptState(ctx, ci, id, journal.AttemptQuiescing, journal.AttemptActive)
			if err == nil {
				a.State = journal.AttemptActive
			}
		case journal.AttemptSealed:
			err = f.releaseSealed(ctx, id)
		}
		if err == nil && a.State == journal.AttemptActive {
			if _, serr := os.Stat(delta.Layout{Dir: f.attemptDir(id) + "/delta"}.Upper()); serr != nil {
				f.failAttempt(ctx, id, errors.New("delta lost"))
				continue
			}
			root := ""
			if a.Runtime != nil {
				root = a.Runtime.Mount
			}
			if err = f.ensureMounted(ctx, a.Attempt, root); err == nil {
				// A container that survived is adopted as it is; one that
				// did not starts again on the same root.
				err = f.startContainer(ctx, a.Attempt)
			}
			if err != nil {
				f.failAttempt(ctx, id, err)
				err = nil
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("recover attempt %s: %w", id, err))
		}
	}
	// Deltas of attempts that are no longer live are leftovers of a crash
	// between a release's commit and its cleanup.
	liveDirs := map[string]bool{}
	for _, id := range live {
		liveDirs[id] = true
	}
	if ents, err := os.ReadDir(filepath.Join(f.stateDir, "attempts")); err == nil {
		for _, e := range ents {
			if !liveDirs[e.Name()] && !f.isQueued(ctx, e.Name()) {
				root := filepath.Join(f.stateDir, "attempts", e.Name(), "root")
				if f.mounter.Mounted(root) {
					f.mounter.Unmount(root)
				}
				f.deleteDelta(e.Name())
			}
		}
	}
	// Containers of attempts that are no longer live are leftovers.
	if f.exec != nil {
		liveSet := map[string]bool{}
		for _, id := range live {
			liveSet[id] = true
		}
		infos, err := f.exec.List(ctx, string(journal.KindAttempt)+"_")
		if err != nil {
			errs = append(errs, err)
		}
		for _, info := range infos {
			if !liveSet[info.ID] {
				if err := f.exec.Stop(ctx, info.ID); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	// Queued attempts wait in creation order (ids are time-ordered); start
	// those that fit now.
	queued, err := f.queuedAttempts(ctx)
	if err != nil {
		errs = append(errs, err)
	}
	for _, q := range queued {
		f.quota.enqueue(q.id, q.mem)
	}
	f.attemptEnded(ctx, "")
	return errors.Join(errs...)
}

// isQueued reports whether attempt id is queued.
func (f *Fabric) isQueued(ctx context.Context, id string) bool {
	v, err := f.attemptView(ctx, id)
	return err == nil && v.State == journal.AttemptQueued
}

// queuedAttempts lists this worker's queued attempts, oldest first. It
// scans every attempt record: recovery only.
func (f *Fabric) queuedAttempts(ctx context.Context) ([]queued, error) {
	var out []queued
	var corrupt []error // such an attempt stays queued, and is reported
	err := f.journal.View(ctx, func(r journal.Reader) error {
		return journal.Attempts(r, func(a journal.Attempt) error {
			if a.State != journal.AttemptQueued {
				return nil
			}
			var d rtData
			if rt, err := journal.GetAttemptRuntime(r, a.AttemptID); err == nil {
				if rt.Worker != f.worker {
					return nil
				}
				if d, err = runtimeData(&rt); err != nil {
					corrupt = append(corrupt, err)
					return nil
				}
			}
			out = append(out, queued{a.AttemptID, d.MemoryBytes})
			return nil
		})
	})
	return out, errors.Join(append([]error{err}, corrupt...)...)
}

// StopAll releases every live attempt and stops the projection: a full
// teardown for tests and for `esfd --stop-all`. Close alone leaves both
// running for the next daemon to adopt.
func (f *Fabric) StopAll(ctx context.Context) error {
	var live []string
	err := f.journal.View(ctx, func(r journal.Reader) error {
		return journal.ExpiredLeases(r, time.Unix(1<<40, 0), func(lid string) error {
			l, err := journal.GetLease(r, lid)
			if err == nil {
				live = append(live, l.AttemptID)
			}
			return err
		})
	})
	if err != nil {
		return err
	}
	queued, err := f.queuedAttempts(ctx)
	if err != nil {
		return err
	}
	// Queued attempts first, so releasing live ones starts none of them.
	for _, q := range queued {
		live = append([]string{q.id}, live...)
	}
	if f.Fenced() {
		// A fenced worker may change nothing: it stopped its sandboxes
		// already, and the other workers fail its attempts.
		live = nil
	}
	var errs []error
	for _, id := range live {
		a, err := f.attemptView(ctx, id)
		if err == nil && !f.ownsRuntime(a.Runtime) {
			continue // another worker's
		}
		if err == nil && a.State == journal.AttemptQuiescing {
			err = f.setAttemptState(ctx, f.callInfo(ctx), id, journal.AttemptQuiescing, journal.AttemptActive)
		}
		if err == nil {
			_, err = f.Release(ctx, ReleaseRequest{AttemptID: id})
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	// On a shared graph, this worker's attempts may have been failed by
	// the others while it was down: their sandboxes go too.
	if f.cluster != nil {
		ents, _ := os.ReadDir(filepath.Join(f.stateDir, "attempts"))
		for _, e := range ents {
			f.stopEnded(ctx, e.Name())
		}
	}
	// Read-only binds of projected roots keep the projection busy.
	views, err := f.mounter.Views(f.projection.mnt)
	if err != nil {
		errs = append(errs, err)
	}
	for _, v := range views {
		if err := f.mounter.Unmount(v.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	if err := f.projection.Stop(); err != nil {
		errs = append(errs, err)
	}
	// The disk pool goes last, once every delta in it is deleted; it is
	// unmounted whatever this process's options (esfd stop-all).
	f.reaping.Wait()
	if err := delta.ClosePool(filepath.Join(f.stateDir, "attempts"), filepath.Join(f.stateDir, "attempts.img")); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
