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
// unmount that lets the release join the seal's commit, which comes before
// the objects are stored; otherwise between that commit and the release's
// own).
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
// leaves an active attempt whose delta Recover mounts again. It is
// unmounted before its upper directory is read, so the seal may hand the
// delta's large files to the store instead of copying them (no one can
// write them any more; ingest.Options.Adopt): should the seal not commit,
// the next mount gives the delta its own copies back (delta.Unshare).
func (f *Fabric) Suspend(ctx context.Context, req SuspendRequest) (SuspendResult, error) {
	if err := journal.CheckID(journal.KindAttempt, req.AttemptID); err != nil {
		return SuspendResult{}, fmt.Errorf("suspend: %w", err)
	}
	if err := checkJSON("logical_state", req.LogicalState); err != nil {
		return SuspendResult{}, err
	}
	ci := f.callInfo(ctx)
	ctx = WithCallInfo(ctx, ci) // one key for the whole operation
	s, replay, err := f.readSeal(ctx, ci, req)
	if err != nil {
		return SuspendResult{}, err
	}
	if replay != nil {
		// A replay returns the first result without sealing again, and
		// finishes what the first run may have left.
		return *replay, f.finishSuspend(ctx, replay, req.KeepRunning, replay.Attempt.Executor == ExecutorRunc)
	}
	if !f.claimSeal(s.a.AttemptID) {
		return SuspendResult{}, fmt.Errorf("suspend: attempt %s is sealing: %w", s.a.AttemptID, journal.ErrFailedPrecondition)
	}
	defer f.unclaimSeal(s.a.AttemptID)
	// A GC session: what the seal stores or re-uses, and the base, stay
	// until the node that names them is committed.
	leave := f.store.Enter(s.baseID)
	defer leave()
	ctx = f.remoteSession(ctx)
	if err := f.quiesce(ctx, s); err != nil {
		return SuspendResult{}, err
	}
	thaw, err := f.freezeForSeal(ctx, s)
	if err != nil {
		s.unquiesce(ctx, f)
		return SuspendResult{}, err
	}
	defer thaw()
	start := time.Now()
	err = f.releaseBeforeCommit(s)
	// A small batch's objects become durable with the commit (one flush,
	// storeredo.go): published only once it is known.
	sealCtx, deferred := f.sealDeferral(ctx)
	var sealed ingest.Result
	if err == nil {
		sealed, err = f.sealUpper(sealCtx, s)
	}
	if err == nil {
		err = f.mutate(ctx, OpSuspend, req, &s.res, func(tx journal.Tx, ci CallInfo) (any, error) {
			res, err := commitSeal(tx, ci, f.ids, req, s.from, s.release, sealed.Root.String(), s.env())
			if err != nil {
				return nil, err
			}
			return res, putStoreRedo(tx, deferred)
		})
	}
	f.settleDeferral(ctx, deferred)
	if err == nil {
		err = failpoint.Inject(fpSealPublished)
	}
	if err != nil {
		f.abortSeal(ctx, s)
		return SuspendResult{}, fmt.Errorf("suspend: %w", err)
	}
	f.log.Info("sealed", "attempt_id", s.a.AttemptID, "node_id", s.res.Node.NodeID, "root_id", s.res.Node.RootID,
		"files", sealed.Files, "new_objects", sealed.NewObjects, "ms", time.Since(start).Milliseconds())
	if s.release {
		// Released in the commit: what the result says is current.
		f.deleteDelta(s.a.AttemptID)
		s.unlockAttempt()
		f.attemptEnded(ctx, s.a.AttemptID)
		return s.res, nil
	}
	s.unlockAttempt()
	return s.res, f.finishSuspend(ctx, &s.res, req.KeepRunning, s.a.Executor == ExecutorRunc)
}

// sealOp is one Suspend as it passes through its phases: readSeal finds
// the attempt, its base root and runtime record; quiesce stops it being
// active; freezeForSeal stops its container; releaseBeforeCommit unmounts
// an attempt that is released with the seal; sealUpper stores the upper
// directory as a tree over the base; the commit publishes it all, or
// abortSeal puts the attempt back.
type sealOp struct {
	req    SuspendRequest
	ci     CallInfo
	a      *AttemptView
	base   string // the attempt's base root (the overlay's lower)
	baseID cas.ID
	d      rtData
	// from is the state the commit moves the attempt from: quiescing, or
	// active for one quiesced only in memory (no executor).
	from journal.AttemptState
	// release: the attempt was unmounted to be released in the seal's
	// commit. unlockAttempt ends the attempt lock held from that unmount
	// to the commit (or the mount again); a no-op when not held.
	release       bool
	unlockAttempt func()
	res           SuspendResult
}

// readSeal reads what a seal of req.AttemptID needs and checks that the
// attempt can be sealed; on a replay of the call's key it returns the
// first result instead.
func (f *Fabric) readSeal(ctx context.Context, ci CallInfo, req SuspendRequest) (*sealOp, *SuspendResult, error) {
	s := &sealOp{req: req, ci: ci, unlockAttempt: func() {}}
	var prev []byte
	err := f.journal.View(ctx, func(r journal.Reader) error {
		b, found, err := journal.CheckIdempotency(r, s.ci.IdempotencyKey, OpSuspend, req)
		if err != nil || found {
			prev = b
			return err
		}
		if s.a, err = attemptView(r, req.AttemptID); err != nil {
			return err
		}
		n, err := journal.GetNode(r, s.a.NodeID)
		if err != nil {
			return err
		}
		if s.a.Runtime != nil {
			s.base, err = baseRoot(n, s.a.Runtime)
		}
		return err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("suspend: %w", err)
	}
	if prev != nil {
		var res SuspendResult
		if err := json.Unmarshal(prev, &res); err != nil {
			return nil, nil, err
		}
		return nil, &res, nil
	}
	a := s.a
	if a.Lease != nil && req.Token != 0 && req.Token != a.Lease.Token {
		return nil, nil, staleToken(a.AttemptID, req.Token, a.Lease.Token)
	}
	if a.State != journal.AttemptActive || a.Runtime == nil {
		return nil, nil, fmt.Errorf("suspend: attempt %s is %s: %w", a.AttemptID, a.State, journal.ErrFailedPrecondition)
	}
	if s.baseID, err = cas.ParseID(s.base); err != nil {
		return nil, nil, err
	}
	if s.d, err = runtimeData(a.Runtime); err != nil {
		return nil, nil, fmt.Errorf("suspend: %w", err)
	}
	return s, nil, nil
}

// quiesce makes the attempt stop being active before anything is read:
// in the journal for one that can run work (exec then refuses it), in
// memory (the seal claim) for one without an executor.
func (f *Fabric) quiesce(ctx context.Context, s *sealOp) error {
	s.from = journal.AttemptActive
	if s.a.Executor != ExecutorNone {
		if err := f.setAttemptState(ctx, s.ci, s.a.AttemptID, journal.AttemptActive, journal.AttemptQuiescing); err != nil {
			return fmt.Errorf("suspend: %w", err)
		}
		s.from = journal.AttemptQuiescing
	}
	return failpoint.Inject(fpSealQuiesced)
}

// unquiesce puts the attempt back as it was after a failed seal.
func (s *sealOp) unquiesce(ctx context.Context, f *Fabric) {
	if s.from != journal.AttemptQuiescing {
		return
	}
	if err := f.setAttemptState(context.WithoutCancel(ctx), s.ci, s.a.AttemptID, journal.AttemptQuiescing, journal.AttemptActive); err != nil {
		f.log.Error("roll back quiesce", "attempt_id", s.a.AttemptID, "err", err)
	}
}

// freezeForSeal stops a container's processes for the seal, so the delta
// no longer changes under the walk (a consistent checkpoint of a live
// sandbox). thaw lets a container that is still paused run again: one
// that keeps running, or goes on after a failed seal (a released one was
// stopped instead).
func (f *Fabric) freezeForSeal(ctx context.Context, s *sealOp) (thaw func(), err error) {
	if s.a.Executor != ExecutorRunc || f.exec == nil {
		return func() {}, nil
	}
	id := s.a.AttemptID
	if err := f.exec.Freeze(ctx, id); err != nil {
		return nil, fmt.Errorf("suspend: freeze: %w", err)
	}
	return func() {
		if info, err := f.exec.State(context.WithoutCancel(ctx), id); err == nil && info.Status == executor.StatusPaused {
			if err := f.exec.Thaw(context.WithoutCancel(ctx), id); err != nil {
				f.log.Error("thaw after seal", "attempt_id", id, "err", err)
			}
		}
	}, nil
}

// sealUpper stores the attempt's upper directory as a tree over its base,
// skipping a container's footprint.
func (f *Fabric) sealUpper(ctx context.Context, s *sealOp) (ingest.Result, error) {
	var exclude []string
	if s.a.Executor == ExecutorRunc && f.exec != nil {
		exclude = executor.Footprint()
	}
	l := delta.Layout{Dir: s.a.Runtime.PrivateDelta, Root: s.a.Runtime.Mount}
	opts := ingest.Options{Logger: f.log, Exclude: exclude}
	if s.release {
		// Unmounted for good unless the seal fails, and then the next
		// mount gives the delta its files back (delta.Unshare): its large
		// files become objects without a copy.
		opts.Adopt = l.NoteAdopted
	}
	sealed, err := f.mounter.Seal(ctx, f.store, s.baseID, l, opts)
	if err != nil {
		return sealed, err
	}
	f.returnMemory(sealed.Stats)
	return sealed, failpoint.Inject(fpSealWritten)
}

// env is the seal's provenance of the environment the tree was made in.
func (s *sealOp) env() json.RawMessage {
	b, _ := json.Marshal(map[string]any{"executor": s.a.Executor, "container": s.d.Container.provenance(), "base_root_id": s.base})
	return b
}

// releaseBeforeCommit unmounts an attempt without an executor that is
// released with the seal now, while a failed commit can still mount the
// delta again, so the release joins the seal's commit. A busy root (a
// shell inside it) is released after the commit instead, as a runc
// attempt's is (its container must stop first, which cannot be undone).
// From the unmount to the commit (or the mount again), an activation
// replay must not mount this attempt: the attempt's lock is held
// (s.unlockAttempt).
func (f *Fabric) releaseBeforeCommit(s *sealOp) error {
	if s.req.KeepRunning || s.a.Executor != ExecutorNone {
		return nil
	}
	s.unlockAttempt = f.lockAttempt(s.a.AttemptID)
	if err := failpoint.Inject(fpSealReleased); err != nil {
		return err
	}
	if err := f.unmountAttempt(s.a.Attempt, s.a.Runtime); err != nil {
		f.log.Info("seal: root busy, releasing after the commit", "attempt_id", s.a.AttemptID, "err", err)
		return nil
	}
	s.release = true
	return nil
}

// abortSeal undoes a seal that published nothing: the attempt goes back to
// active with its delta intact (mounted again if the release unmounted
// it), so the caller can retry the seal. (An error after the commit point
// leaves it released: a replay returns the result.)
func (f *Fabric) abortSeal(ctx context.Context, s *sealOp) {
	ctx = context.WithoutCancel(ctx)
	if v, verr := f.attemptView(ctx, s.a.AttemptID); s.release && verr == nil && v.State == journal.AttemptActive {
		if merr := f.ensureMounted(ctx, s.a.Attempt, ""); merr != nil {
			f.log.Error("mount again after a failed seal", "attempt_id", s.a.AttemptID, "err", merr)
			f.failAttemptLocked(ctx, s.a.AttemptID, merr)
		}
	}
	s.unlockAttempt()
	s.unquiesce(ctx, f)
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
