package fabric

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/delta"
	"github.com/esf-dev/esf/executor"
	"github.com/esf-dev/esf/ingest"
	"github.com/esf-dev/esf/journal"
	"github.com/esf-dev/esf/journal/failpoint"
)

// Seal boundaries for the crash harness, beside the generic ones of mutate
// and the journal: after the attempt turned quiescing (in the journal or,
// with no executor, in memory), after the new root's objects are stored,
// and before the release (for an attempt with no executor, before the
// unmount that lets the release join the seal's commit; otherwise between
// that commit and the release's own).
var (
	fpSealQuiesced = failpoint.Declare("fabric.suspend.after-quiesce")
	fpSealWritten  = failpoint.Declare("fabric.suspend.after-write-trees")
	fpSealReleased = failpoint.Declare("fabric.suspend.before-release")
)

// SuspendRequest seals an attempt's delta into a node.
type SuspendRequest struct {
	AttemptID string `json:"attempt_id"`
	// LogicalState of the sealed node; the attempt node's when absent.
	LogicalState json.RawMessage `json:"logical_state,omitempty"`
	// KeepRunning seals a checkpoint and leaves the attempt active; its
	// next seal becomes a child of this one.
	KeepRunning bool `json:"keep_running,omitempty"`
	// Token, if set, must be the attempt's current lease token.
	Token uint64 `json:"token,omitempty"`
}

// SuspendResult is the sealed node and the attempt after the seal.
type SuspendResult struct {
	Node    journal.Node `json:"node"`
	Attempt AttemptView  `json:"attempt"`
}

// Suspend quiesces an attempt, seals its upper directory over its base
// root (reading only the delta and writing trees only along changed paths)
// and publishes root, logical state, provenance and the attempt's result in
// one journal batch (FR-03). A draft node becomes sealed with the new root;
// a sealed one gets a new sealed child. Then the attempt is released, unless
// KeepRunning.
//
// Commits: an attempt that can run work (runc, wasi) is quiesced in the
// journal first, so that exec refuses it while the seal reads. One without
// an executor has nothing to stop: this process claims it in memory (a
// second seal or a release is refused meanwhile), and the quiescing
// transition is committed with the seal; a crash before that commit leaves
// it active, as Recover would make a quiescing one. Such an attempt is also
// unmounted before the commit, so that its release joins the same batch
// and a one-file seal costs one journal commit: a crash after the unmount
// leaves an active attempt whose delta Recover mounts again.
func (f *Fabric) Suspend(ctx context.Context, req SuspendRequest) (SuspendResult, error) {
	var res SuspendResult
	if err := journal.CheckID(journal.KindAttempt, req.AttemptID); err != nil {
		return res, fmt.Errorf("suspend: %w", err)
	}
	if err := checkJSON("logical_state", req.LogicalState); err != nil {
		return res, err
	}
	ci := f.callInfo(ctx)
	ctx = WithCallInfo(ctx, ci) // one key for the whole operation
	// A replay returns the first result without sealing again.
	var prev []byte
	var a *AttemptView
	var base string
	err := f.journal.View(ctx, func(r journal.Reader) error {
		b, found, err := journal.CheckIdempotency(r, ci.IdempotencyKey, OpSuspend, req)
		if err != nil || found {
			prev = b
			return err
		}
		if a, err = attemptView(r, req.AttemptID); err != nil {
			return err
		}
		n, err := journal.GetNode(r, a.NodeID)
		if err != nil {
			return err
		}
		if a.Runtime != nil {
			base, err = baseRoot(n, a.Runtime)
		}
		return err
	})
	if err != nil {
		return res, fmt.Errorf("suspend: %w", err)
	}
	if prev != nil {
		if err := json.Unmarshal(prev, &res); err != nil {
			return res, err
		}
		return res, f.finishSuspend(ctx, &res, req.KeepRunning, res.Attempt.Executor == ExecutorRunc)
	}
	if a.Lease != nil && req.Token != 0 && req.Token != a.Lease.Token {
		return res, staleToken(a.AttemptID, req.Token, a.Lease.Token)
	}
	if a.State != journal.AttemptActive || a.Runtime == nil {
		return res, fmt.Errorf("suspend: attempt %s is %s: %w", a.AttemptID, a.State, journal.ErrFailedPrecondition)
	}
	baseID, err := cas.ParseID(base)
	if err != nil {
		return res, err
	}
	if !f.claimSeal(a.AttemptID) {
		return res, fmt.Errorf("suspend: attempt %s is sealing: %w", a.AttemptID, journal.ErrFailedPrecondition)
	}
	defer f.unclaimSeal(a.AttemptID)
	// A GC session: what the seal stores or re-uses, and the base, stay
	// until the node that names them is committed.
	leave := f.store.Enter(baseID)
	defer leave()
	ctx = f.remoteSession(ctx)

	// Quiesce: the attempt stops being active before anything is read.
	from := journal.AttemptActive
	if a.Executor != ExecutorNone {
		if err := f.setAttemptState(ctx, ci, a.AttemptID, journal.AttemptActive, journal.AttemptQuiescing); err != nil {
			return res, fmt.Errorf("suspend: %w", err)
		}
		from = journal.AttemptQuiescing
	}
	// unquiesce puts the attempt back as it was after a failed seal.
	unquiesce := func() {
		if from != journal.AttemptQuiescing {
			return
		}
		if err := f.setAttemptState(context.WithoutCancel(ctx), ci, a.AttemptID, journal.AttemptQuiescing, journal.AttemptActive); err != nil {
			f.log.Error("roll back quiesce", "attempt_id", a.AttemptID, "err", err)
		}
	}
	if err := failpoint.Inject(fpSealQuiesced); err != nil {
		return res, err
	}
	// A container's processes stop for the seal: the delta no longer
	// changes under the walk (a consistent checkpoint of a live sandbox).
	d, err := runtimeData(a.Runtime)
	if err != nil {
		unquiesce()
		return res, fmt.Errorf("suspend: %w", err)
	}
	var exclude []string
	if a.Executor == ExecutorRunc && f.exec != nil {
		exclude = executor.Footprint()
		if err := f.exec.Freeze(ctx, a.AttemptID); err != nil {
			unquiesce()
			return res, fmt.Errorf("suspend: freeze: %w", err)
		}
		defer func() {
			// Thaw a container that keeps running, or that goes on after a
			// failed seal; a released one was stopped instead.
			if info, err := f.exec.State(context.WithoutCancel(ctx), a.AttemptID); err == nil && info.Status == executor.StatusPaused {
				if err := f.exec.Thaw(context.WithoutCancel(ctx), a.AttemptID); err != nil {
					f.log.Error("thaw after seal", "attempt_id", a.AttemptID, "err", err)
				}
			}
		}()
	}
	env, _ := json.Marshal(map[string]any{"executor": a.Executor, "container": d.Container.provenance(), "base_root_id": base})
	start := time.Now()
	sealed, err := ingest.Upper(ctx, f.store, baseID, delta.Layout{Dir: a.Runtime.PrivateDelta}.Upper(),
		ingest.Options{Logger: f.log, Exclude: exclude})
	if err == nil {
		f.returnMemory(sealed.Stats)
		err = failpoint.Inject(fpSealWritten)
	}
	// Release with the seal: unmount now, while a failed commit can still
	// mount the delta again. A busy root (a shell inside it) is released
	// after the commit instead, as a runc attempt's is (its container must
	// stop first, which cannot be undone).
	release := false
	// From the unmount to the commit (or the mount again), an activation
	// replay must not mount this attempt: hold its lock (lockAttempt).
	unlockAttempt := func() {}
	if err == nil && !req.KeepRunning && a.Executor == ExecutorNone {
		unlockAttempt = f.lockAttempt(a.AttemptID)
		if err = failpoint.Inject(fpSealReleased); err == nil {
			if uerr := f.unmountAttempt(a.Attempt, a.Runtime); uerr == nil {
				release = true
			} else {
				f.log.Info("seal: root busy, releasing after the commit", "attempt_id", a.AttemptID, "err", uerr)
			}
		}
	}
	if err == nil {
		err = f.mutate(ctx, OpSuspend, req, &res, func(tx journal.Tx, ci CallInfo) (any, error) {
			return commitSeal(tx, ci, f.ids, req, from, release, sealed.Root.String(), env)
		})
	}
	if err != nil {
		// Nothing was published: the attempt goes back to active with its
		// delta intact (mounted again if the release unmounted it), so the
		// caller can retry the seal.
		// (An error after the commit point leaves it released: a replay
		// returns the result.)
		if v, verr := f.attemptView(context.WithoutCancel(ctx), a.AttemptID); release && verr == nil && v.State == journal.AttemptActive {
			if merr := f.ensureMounted(context.WithoutCancel(ctx), a.Attempt, ""); merr != nil {
				f.log.Error("mount again after a failed seal", "attempt_id", a.AttemptID, "err", merr)
				f.failAttemptLocked(context.WithoutCancel(ctx), a.AttemptID, merr)
			}
		}
		unlockAttempt()
		unquiesce()
		return SuspendResult{}, fmt.Errorf("suspend: %w", err)
	}
	f.log.Info("sealed", "attempt_id", a.AttemptID, "node_id", res.Node.NodeID, "root_id", res.Node.RootID,
		"files", sealed.Files, "new_objects", sealed.NewObjects, "ms", time.Since(start).Milliseconds())
	if release {
		// Released in the commit: what the result says is current.
		f.deleteDelta(a.AttemptID)
		unlockAttempt()
		f.attemptEnded(ctx, a.AttemptID)
		return res, nil
	}
	unlockAttempt()
	return res, f.finishSuspend(ctx, &res, req.KeepRunning, a.Executor == ExecutorRunc)
}

// claimSeal marks attempt id as being sealed by this process; false if it
// already is.
func (f *Fabric) claimSeal(id string) bool {
	f.sealMu.Lock()
	defer f.sealMu.Unlock()
	if f.sealing[id] {
		return false
	}
	if f.sealing == nil {
		f.sealing = map[string]bool{}
	}
	f.sealing[id] = true
	return true
}

func (f *Fabric) unclaimSeal(id string) {
	f.sealMu.Lock()
	defer f.sealMu.Unlock()
	delete(f.sealing, id)
}

func (f *Fabric) isSealing(id string) bool {
	f.sealMu.Lock()
	defer f.sealMu.Unlock()
	return f.sealing[id]
}

// commitSeal publishes a seal: the node (a draft sealed in place, or a new
// child) and the attempt's new state, in the caller's transaction. The
// attempt is in state from: quiescing, or active if it was quiesced only
// in memory (the transition is recorded here). With release, the attempt,
// already unmounted, is also released in the same batch.
func commitSeal(tx journal.Tx, ci CallInfo, ids *journal.IDGen, req SuspendRequest, from journal.AttemptState, release bool, root string, env json.RawMessage) (SuspendResult, error) {
	a, err := journal.GetAttempt(tx, req.AttemptID)
	if err != nil {
		return SuspendResult{}, err
	}
	if a.State != from {
		return SuspendResult{}, fmt.Errorf("attempt %s is %s, not %s: %w", a.AttemptID, a.State, from, journal.ErrFailedPrecondition)
	}
	if from == journal.AttemptActive {
		if err := a.Transition(journal.AttemptQuiescing); err != nil {
			return SuspendResult{}, err
		}
		if err := journal.UpdateAttempt(tx, a); err != nil {
			return SuspendResult{}, err
		}
		if err := event(tx, ci, a.Event(journal.EventAttemptState), map[string]any{"from": from, "to": a.State}); err != nil {
			return SuspendResult{}, err
		}
	}
	n, err := journal.GetNode(tx, a.NodeID)
	if err != nil {
		return SuspendResult{}, err
	}
	state := req.LogicalState
	if state == nil {
		state = n.LogicalState
	}
	prov := journal.Provenance{Op: "seal", AttemptID: a.AttemptID, Executor: a.Executor, Environment: env,
		IdempotencyKey: ci.IdempotencyKey, TraceID: ci.TraceID}
	var out journal.Node
	if n.Status == journal.NodeDraft && a.ResultNodeID == "" {
		from := n.Status
		n.RootID, n.LogicalState, n.Provenance = root, state, prov
		if err := n.Transition(journal.NodeSealed); err != nil {
			return SuspendResult{}, err
		}
		if err := journal.UpdateNode(tx, n); err != nil {
			return SuspendResult{}, err
		}
		if err := event(tx, ci, n.Event(journal.EventNodeState), map[string]any{"from": from, "to": n.Status, "attempt_id": a.AttemptID}); err != nil {
			return SuspendResult{}, err
		}
		out = n
	} else {
		parent := a.NodeID
		if a.ResultNodeID != "" {
			parent = a.ResultNodeID
		}
		p, err := journal.GetNode(tx, parent)
		if err != nil {
			return SuspendResult{}, err
		}
		if p.Status == journal.NodeDraft {
			return SuspendResult{}, fmt.Errorf("parent %s is still a draft: %w", parent, journal.ErrFailedPrecondition)
		}
		id, err := ids.New(journal.KindNode)
		if err != nil {
			return SuspendResult{}, err
		}
		out = journal.Node{NodeID: id, GroupID: a.GroupID, Parents: []string{parent}, RootID: root,
			LogicalState: state, Status: journal.NodeSealed, Provenance: prov, CreatedAt: tx.Now()}
		if err := journal.CreateNode(tx, out); err != nil {
			return SuspendResult{}, err
		}
		ev := out.Event("node.sealed")
		ev.AttemptID = a.AttemptID
		if err := event(tx, ci, ev, map[string]any{"parent": parent}); err != nil {
			return SuspendResult{}, err
		}
	}
	quiesced := a.State
	to := journal.AttemptSealed
	if req.KeepRunning {
		to = journal.AttemptActive
	}
	if err := a.Transition(to); err != nil {
		return SuspendResult{}, err
	}
	a.ResultNodeID = out.NodeID
	if err := journal.UpdateAttempt(tx, a); err != nil {
		return SuspendResult{}, err
	}
	ev := a.Event(journal.EventAttemptState)
	ev.RootID = root
	if err := event(tx, ci, ev, map[string]any{"from": quiesced, "to": to, "result_node_id": out.NodeID}); err != nil {
		return SuspendResult{}, err
	}
	if release {
		if err := releaseInTx(tx, ci, a.AttemptID, journal.AttemptReleased, ""); err != nil {
			return SuspendResult{}, err
		}
		if a, err = journal.GetAttempt(tx, a.AttemptID); err != nil {
			return SuspendResult{}, err
		}
	}
	return SuspendResult{Node: out, Attempt: AttemptView{Attempt: a}}, nil
}

// finishSuspend releases a sealed attempt (unless it keeps running) and
// refreshes the attempt view in res. It is idempotent: a replay or a
// recovery after a crash completes what the first run left.
//
// The seal has committed: with container (a runc attempt, whose stopped
// container cannot hold its root; see unmountRoot) a failed release is
// logged and the suspend still succeeds, with the attempt sealed and not
// yet released (release, a replay or Recover finishes it). Without one, a
// busy root is the caller's own process inside it, and the caller is told.
func (f *Fabric) finishSuspend(ctx context.Context, res *SuspendResult, keepRunning, container bool) error {
	if !keepRunning {
		if err := failpoint.Inject(fpSealReleased); err != nil {
			return err
		}
		if err := f.releaseSealed(ctx, res.Attempt.AttemptID); err != nil {
			if !container {
				return fmt.Errorf("suspend: release: %w", err)
			}
			f.log.Error("suspend: sealed, but the release failed: the attempt stays sealed until released",
				"attempt_id", res.Attempt.AttemptID, "node_id", res.Node.NodeID, "err", err)
		}
	}
	v, err := f.attemptView(ctx, res.Attempt.AttemptID)
	if err != nil {
		return err
	}
	res.Attempt = v
	return nil
}

// releaseSealed unmounts a sealed attempt and marks it released.
func (f *Fabric) releaseSealed(ctx context.Context, attemptID string) error {
	defer f.lockAttempt(attemptID)()
	a, err := f.attemptView(ctx, attemptID)
	if err != nil {
		return err
	}
	if a.State != journal.AttemptSealed {
		return nil
	}
	if err := f.unmountAttempt(a.Attempt, a.Runtime); err != nil {
		return err
	}
	if err := f.journal.Update(ctx, func(tx journal.Tx) error {
		return releaseInTx(tx, f.callInfo(ctx), attemptID, journal.AttemptReleased, "")
	}); err != nil {
		return err
	}
	f.deleteDelta(attemptID)
	f.attemptEnded(ctx, attemptID)
	return nil
}

// setAttemptState moves an attempt from one state to another, failing with
// ErrFailedPrecondition if it is not in from.
func (f *Fabric) setAttemptState(ctx context.Context, ci CallInfo, attemptID string, from, to journal.AttemptState) error {
	return f.journal.Update(ctx, func(tx journal.Tx) error {
		a, err := journal.GetAttempt(tx, attemptID)
		if err != nil {
			return err
		}
		if a.State != from {
			return fmt.Errorf("attempt %s is %s, not %s: %w", attemptID, a.State, from, journal.ErrFailedPrecondition)
		}
		if err := a.Transition(to); err != nil {
			return err
		}
		if err := journal.UpdateAttempt(tx, a); err != nil {
			return err
		}
		return event(tx, ci, a.Event(journal.EventAttemptState), map[string]any{"from": from, "to": to})
	})
}
