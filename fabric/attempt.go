package fabric

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/esf-dev/esf/delta"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/executor"
	"github.com/esf-dev/esf/journal"
	"github.com/esf-dev/esf/mounter"
)

// Attempts: activate leases a node and mounts a private writable delta on
// its root; release unmounts and deletes it; leases expire unless renewed.
// One journal commit records an activation (attempt, lease and runtime
// record), and the default root is mounted while it flushes; recovery
// reconciles the journal and the mounts after a crash (see Recover): a
// mount of an attempt the journal does not know is removed, an attempt
// whose delta survives is mounted again, one whose delta is gone fails.

// Operation names of the attempt lifecycle.
const (
	OpActivate = "activate"
	OpSuspend  = "suspend"
	OpRelease  = "release"
	OpRenew    = "renew"
	OpRetry    = "retry"
)

// Executors.
const (
	ExecutorNone = "none"
)

// DefaultLeaseTTL is the lease an activation takes when it names none.
const DefaultLeaseTTL = 10 * time.Minute

// ActivateRequest leases a node for one attempt.
type ActivateRequest struct {
	NodeID string `json:"node_id"`
	// Worker pins the attempt to that worker of the graph (the API
	// forwards the call to it); empty lets the API place it.
	Worker   string `json:"worker,omitempty"`
	Executor string `json:"executor,omitempty"` // "none" (default)
	// TTLMillis is the lease's time to live; DefaultLeaseTTL when zero.
	TTLMillis int64 `json:"ttl_ms,omitempty"`
	// Root, if set, is where the writable root is mounted (esfctl mount
	// --rw); it must be an empty directory. Default: under the state dir.
	Root string `json:"root,omitempty"`
	// RetryOf names the failed attempt this one retries.
	RetryOf string `json:"retry_of,omitempty"`
	// MemoryBytes is the attempt's memory limit, reserved against the
	// daemon's memory quota. When zero: the daemon's default memory limit
	// for a runc attempt, else DefaultAttemptMemory when a memory quota is
	// set. A runc attempt's cgroup gets the same number.
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	// DiskBytes limits the bytes (data and metadata, so also the number
	// of files) the attempt's delta may hold: writes past it fail inside
	// with EDQUOT. Default: the daemon's DefaultDiskBytes.
	DiskBytes int64 `json:"disk_bytes,omitempty"`
	// NoQueue refuses with quota_exceeded instead of queueing when the
	// daemon is at capacity.
	NoQueue bool `json:"no_queue,omitempty"`
	// For runc attempts: the container's limits (zero: the daemon's
	// defaults, Options.DefaultLimits) and defaults for execs.
	Pids    int64    `json:"pids,omitempty"`
	CPUs    float64  `json:"cpus,omitempty"`
	Env     []string `json:"env,omitempty"`
	Workdir string   `json:"workdir,omitempty"`
	User    string   `json:"user,omitempty"` // UID[:GID]
	// CapAdd gives the container capabilities dropped by default
	// (executor.DroppedCapabilities); anything else is invalid_argument.
	CapAdd []string `json:"cap_add,omitempty"`
	// Labels are kept on the attempt record (journal.Attempt.Labels) and
	// so in the provenance of the nodes it seals.
	Labels map[string]string `json:"labels,omitempty"`
}

// Activate creates an active attempt on a draft or sealed node with a fresh
// lease and mounts its writable root. The root starts with no payload of its
// own: an empty upper directory over the node's projected root.
func (f *Fabric) Activate(ctx context.Context, req ActivateRequest) (AttemptView, error) {
	return f.activate(ctx, OpActivate, req)
}

// activation is one activation as it passes through its phases:
// checkActivation resolves the request and its defaults, admit reserves
// quota (and starts the early mount), commitActivation records the
// attempt, and bringUp mounts the root and starts the container.
type activation struct {
	op  string
	req ActivateRequest // Executor and Root resolved
	// mem is the attempt's memory limit: the quota's reservation and, for
	// a container, its cgroup's limit (one number, decided before either
	// is made).
	mem       int64
	disk      int64 // the delta's limit; 0: none
	ttl       time.Duration
	container *ContainerConfig // runc only
	boot      string           // this boot (delta.BootID)
	// admitted: the quota let the attempt start now (mem reserved);
	// otherwise it is queued.
	admitted bool
	pre      *premount // the default root mounted during the commit, or nil
}

func (f *Fabric) activate(ctx context.Context, op string, req ActivateRequest) (AttemptView, error) {
	act, err := f.checkActivation(ctx, op, req)
	if err != nil {
		return AttemptView{}, err
	}
	if err := f.admit(ctx, act); err != nil {
		return AttemptView{}, err
	}
	av, err := f.commitActivation(ctx, act)
	if err != nil {
		act.unreserve(f)
		return AttemptView{}, err
	}
	return f.bringUp(ctx, act, av.Attempt)
}

// unreserve gives back an admitted activation's memory reservation.
func (act *activation) unreserve(f *Fabric) {
	if act.admitted {
		f.quota.unreserve(act.mem)
	}
}

// checkActivation checks req and resolves its defaults (executor, memory,
// container limits, ttl, disk) into an activation; it changes nothing.
func (f *Fabric) checkActivation(ctx context.Context, op string, req ActivateRequest) (*activation, error) {
	if req.Worker != "" && req.Worker != f.worker {
		return nil, fmt.Errorf("activate: pinned to worker %s, this is %s: %w", req.Worker, f.worker, errdefs.ErrFailedPrecondition)
	}
	if req.Executor == "" {
		req.Executor = ExecutorNone
	}
	act := &activation{op: op, mem: req.MemoryBytes}
	if act.mem < 0 {
		return nil, fmt.Errorf("activate: negative memory: %w", journal.ErrInvalidArgument)
	}
	if act.mem == 0 && req.Executor == ExecutorRunc {
		act.mem = f.opts.DefaultLimits.MemoryBytes
	}
	if act.mem == 0 && f.quota.maxMem > 0 {
		act.mem = DefaultAttemptMemory
	}
	switch req.Executor {
	case ExecutorNone:
	case ExecutorRunc:
		if f.exec == nil {
			return nil, fmt.Errorf("activate: this daemon has no runc executor: %w", journal.ErrUnsupported)
		}
		limits := executor.Limits{MemoryBytes: act.mem, Pids: req.Pids, CPUs: req.CPUs}
		if limits.Pids == 0 {
			limits.Pids = f.opts.DefaultLimits.Pids
		}
		if limits.CPUs == 0 {
			limits.CPUs = f.opts.DefaultLimits.CPUs
		}
		act.container = &ContainerConfig{Env: req.Env, Workdir: req.Workdir, User: req.User, Network: "none", Mounts: f.opts.ContainerMounts,
			Limits: limits, CapAdd: req.CapAdd}
		if _, err := act.container.spec("/"); err != nil {
			return nil, fmt.Errorf("activate: %w", err)
		}
	case ExecutorWASI:
		if f.wasm == nil {
			return nil, fmt.Errorf("activate: this daemon has no WASI runtime: %w", journal.ErrUnsupported)
		}
	default:
		return nil, fmt.Errorf("activate: executor %q: %w", req.Executor, journal.ErrUnsupported)
	}
	if err := journal.CheckID(journal.KindNode, req.NodeID); err != nil {
		return nil, fmt.Errorf("activate: %w", err)
	}
	if req.TTLMillis < 0 {
		return nil, fmt.Errorf("activate: negative ttl: %w", journal.ErrInvalidArgument)
	}
	if req.Root != "" {
		abs, err := filepath.Abs(req.Root)
		if err != nil {
			return nil, fmt.Errorf("activate: %w", err)
		}
		req.Root = abs
		// A replay finds its directory mounted (by its first run): check
		// the directory only for a new request.
		if !f.isReplay(ctx, op, req) {
			if _, err := checkMountDir(f.mounter, abs); err != nil {
				return nil, fmt.Errorf("activate: %w", err)
			}
		}
	}
	act.ttl = time.Duration(req.TTLMillis) * time.Millisecond
	if act.ttl == 0 {
		act.ttl = DefaultLeaseTTL
	}
	if f.quota.maxMem > 0 && act.mem > f.quota.maxMem {
		return nil, fmt.Errorf("activate: %d bytes of memory can never fit the daemon's %d: %w", act.mem, f.quota.maxMem, journal.ErrInvalidArgument)
	}
	act.disk = req.DiskBytes
	switch {
	case act.disk < 0:
		return nil, fmt.Errorf("activate: negative disk limit: %w", journal.ErrInvalidArgument)
	case act.disk > 0 && f.opts.DefaultDiskBytes <= 0:
		return nil, fmt.Errorf("activate: this daemon does not limit disk use (esfd --default-disk): %w", journal.ErrUnsupported)
	case act.disk > 0 && act.disk < minDisk:
		return nil, fmt.Errorf("activate: disk limit %d below the minimum of %d: %w", act.disk, minDisk, journal.ErrInvalidArgument)
	case act.disk == 0:
		act.disk = f.opts.DefaultDiskBytes
	}
	var err error
	if act.boot, err = delta.BootID(); err != nil {
		return nil, fmt.Errorf("activate: %w", err)
	}
	act.req = req
	return act, nil
}

// admit reserves the activation's memory if the quota lets it start now
// (else it will queue, or is refused with NoQueue) and, for an admitted
// one with the default root, starts mounting that root while the commit
// flushes (see premount).
func (f *Fabric) admit(ctx context.Context, act *activation) error {
	act.admitted = f.quota.reserve(act.mem)
	if !act.admitted && act.req.NoQueue {
		live, _ := f.quota.counts()
		return fmt.Errorf("activate: %w", quotaExceeded(live, f.quota.maxLive))
	}
	if act.admitted && act.req.Root == "" {
		act.pre = f.startPremount(ctx, act.req.NodeID, act.req.Executor, act.disk)
	}
	return nil
}

// commitActivation records the attempt (queued, or active with its lease)
// and its runtime record in one journal commit, and returns the
// committed view (or a replay's first one). It ends the early mount,
// keeping it only for the attempt it was made for.
func (f *Fabric) commitActivation(ctx context.Context, act *activation) (AttemptView, error) {
	req := act.req
	var av AttemptView
	err := f.mutate(ctx, act.op, req, &av, func(tx journal.Tx, ci CallInfo) (any, error) {
		n, err := journal.GetNode(tx, req.NodeID)
		if err != nil {
			return nil, err
		}
		if n.Status != journal.NodeDraft && n.Status != journal.NodeSealed {
			return nil, fmt.Errorf("node %s is %s; only draft or sealed nodes activate: %w", n.NodeID, n.Status, journal.ErrFailedPrecondition)
		}
		if req.RetryOf != "" {
			prev, err := journal.GetAttempt(tx, req.RetryOf)
			if err != nil {
				return nil, err
			}
			if prev.State != journal.AttemptFailed && prev.State != journal.AttemptReleased {
				return nil, fmt.Errorf("attempt %s is %s; only failed attempts are retried: %w", prev.AttemptID, prev.State, journal.ErrFailedPrecondition)
			}
			if prev.NodeID != req.NodeID {
				return nil, fmt.Errorf("retry of %s must be on its node %s: %w", prev.AttemptID, prev.NodeID, journal.ErrInvalidArgument)
			}
		}
		var aid string
		if act.pre != nil && act.pre.rootID == n.RootID {
			aid = act.pre.attemptID
		} else if aid, err = f.ids.New(journal.KindAttempt); err != nil {
			return nil, err
		}
		a := journal.Attempt{AttemptID: aid, NodeID: n.NodeID, GroupID: n.GroupID, Executor: req.Executor,
			State: journal.AttemptQueued, RetryOf: req.RetryOf, Labels: req.Labels}
		if err := journal.CreateAttempt(tx, a); err != nil {
			return nil, err
		}
		if a, err = journal.GetAttempt(tx, aid); err != nil { // with its timestamps
			return nil, err
		}
		ev := a.Event(journal.EventAttemptCreated)
		ev.RootID = n.RootID
		if err := event(tx, ci, ev, map[string]any{"executor": req.Executor, "retry_of": req.RetryOf, "queued": !act.admitted}); err != nil {
			return nil, err
		}
		if act.admitted {
			if err := startInTx(tx, ci, f.ids, &a, act.ttl.Milliseconds()); err != nil {
				return nil, err
			}
		}
		// What the start (now or when dequeued) and restarts need, with
		// where the delta and root will be, in the same batch as the
		// attempt: the mount needs no second commit, and a crash before
		// it is done leaves an attempt that Recover can place. BootID: the
		// mount happens in this boot (a queued attempt records its own
		// when it starts).
		d := rtData{TTLMillis: act.ttl.Milliseconds(), MemoryBytes: act.mem, DiskBytes: act.disk, Container: act.container, BaseRootID: n.RootID}
		if act.admitted {
			d.BootID = act.boot
		}
		l := f.layout(a, n.RootID, req.Root)
		if err := journal.PutAttemptRuntime(tx, journal.AttemptRuntime{AttemptID: aid, Worker: f.worker,
			PrivateDelta: l.Dir, Mount: l.Root, Data: d.json()}); err != nil {
			return nil, err
		}
		// The view without what only this worker knows (the runtime
		// record, the root's path): a recorded result is durable state,
		// which holds no worker-local truth (schema audit), and the
		// reply is built fresh from the journal below anyway.
		v, err := attemptView(tx, aid)
		if err != nil {
			return nil, err
		}
		return v.portable(), nil
	})
	if act.pre != nil {
		// Keep the early mount only for the attempt it was made for: not
		// for a failed commit, nor a replay's earlier attempt.
		a := av.Attempt
		f.endPremount(act.pre, err == nil && a.AttemptID == act.pre.attemptID && a.State == journal.AttemptActive)
	}
	return av, err
}

// bringUp acts on committed attempt a as it is now: it queues it, binds
// its memory reservation, mounts its root (usually mounted already by the
// early mount) and starts its container; a failure of the mount or the
// container fails the attempt. A replay returns the first result, so the
// attempt is read again, under its lock, which a failure or release holds
// from its unmount to its commit: a replay racing one must not mount (or
// start a container in) an attempt that is ending. (Not even the early
// mount's attempt is sure to be current: a replay may have failed it
// already.)
func (f *Fabric) bringUp(ctx context.Context, act *activation, a journal.Attempt) (AttemptView, error) {
	defer f.lockAttempt(a.AttemptID)()
	cur, err := f.attemptView(ctx, a.AttemptID)
	if err != nil {
		act.unreserve(f)
		return AttemptView{}, err
	}
	switch {
	case cur.State == journal.AttemptQueued:
		act.unreserve(f)
		f.quota.enqueue(cur.AttemptID, act.mem)
		return cur, nil
	case !cur.State.Live():
		act.unreserve(f)
		return cur, nil
	case act.admitted:
		f.quota.bind(cur.AttemptID, act.mem)
	}
	a = cur.Attempt
	// Usually mounted already (premount); otherwise (a custom root, a
	// replay of an attempt whose mount went away, a failed early mount)
	// it is mounted now.
	d, err := runtimeData(cur.Runtime)
	if err != nil {
		f.failAttemptLocked(context.WithoutCancel(ctx), a.AttemptID, err)
		return AttemptView{}, fmt.Errorf("activate: %w", err)
	}
	var recorded bool
	if d.BaseRootID != "" {
		recorded, err = f.mountDelta(ctx, a, d.BaseRootID, cur.Runtime, act.req.Root)
	} else {
		err = f.ensureMounted(ctx, a, act.req.Root)
	}
	if err != nil {
		f.failAttemptLocked(context.WithoutCancel(ctx), a.AttemptID, err)
		return AttemptView{}, fmt.Errorf("activate: %w", err)
	}
	if err := f.startContainer(ctx, a); err != nil {
		f.failAttemptLocked(context.WithoutCancel(ctx), a.AttemptID, err)
		return AttemptView{}, fmt.Errorf("activate: %w", err)
	}
	if !recorded && a.Executor != ExecutorRunc {
		// The mount changed nothing in the journal (the activation's
		// commit wrote the runtime record it needed): cur is current.
		return cur, nil
	}
	return f.attemptView(ctx, a.AttemptID)
}

// premount is an activation's writable root mounted while the journal
// commit that records the attempt flushes: the mount costs about as much
// as the flush and needs none of its results but the attempt id, which is
// drawn first. A crash between the two leaves a mounted delta of an
// attempt the journal does not know, which Recover unmounts and deletes
// like any delta of an ended attempt.
type premount struct {
	attemptID, rootID string
	done              chan error // the mount's outcome, once
}

// startPremount draws an attempt id and starts mounting the default root
// of an attempt on node over its root; nil if the node cannot be
// activated (the commit will say why).
func (f *Fabric) startPremount(ctx context.Context, nodeID, executor string, disk int64) *premount {
	var n journal.Node
	if err := f.journal.View(ctx, func(r journal.Reader) error {
		var err error
		n, err = journal.GetNode(r, nodeID)
		return err
	}); err != nil || (n.Status != journal.NodeDraft && n.Status != journal.NodeSealed) {
		return nil
	}
	aid, err := f.ids.New(journal.KindAttempt)
	if err != nil {
		return nil
	}
	p := &premount{attemptID: aid, rootID: n.RootID, done: make(chan error, 1)}
	l := f.layout(journal.Attempt{AttemptID: aid, Executor: executor}, n.RootID, "")
	go func() {
		defer f.lockMount(l.Root)()
		_, _, err := f.mountLocked(context.WithoutCancel(ctx), aid, n.RootID, l, "", disk)
		p.done <- err
	}()
	return p
}

// endPremount waits for the early mount and, unless keep, undoes it. A
// kept one that failed is mounted again by the activation's mountDelta.
func (f *Fabric) endPremount(p *premount, keep bool) {
	<-p.done
	if keep {
		return
	}
	if err := f.mounter.Unmount(filepath.Join(f.attemptDir(p.attemptID), "root")); err != nil {
		f.log.Warn("undo early mount", "attempt_id", p.attemptID, "err", err)
		return // Recover sweeps it
	}
	f.deleteDelta(p.attemptID)
}

// ensurePool makes or adopts the disk pool if deltas are limited and
// returns it, or nil if there is none. A pool that cannot be made (no
// btrfs-progs; deltas made without limits still in the attempts
// directory) is logged once, and deltas are not limited.
func (f *Fabric) ensurePool() *delta.Pool {
	f.poolMu.Lock()
	defer f.poolMu.Unlock()
	if f.pool != nil || f.poolFailed || f.opts.DefaultDiskBytes <= 0 {
		return f.pool
	}
	p, err := delta.OpenPool(filepath.Join(f.stateDir, "attempts"), filepath.Join(f.stateDir, "attempts.img"))
	if err != nil {
		f.poolFailed = true
		f.log.Warn("attempts' disk use is not limited: no disk pool", "err", err)
		return nil
	}
	f.pool = p
	return p
}

// minDisk is the smallest disk limit an activation may ask for: an empty
// btrfs subvolume and the overlay's work directory take a few KiB.
const minDisk = 1 << 20

// attemptDir is the worker-local home of an attempt's delta.
func (f *Fabric) attemptDir(attemptID string) string {
	return filepath.Join(f.stateDir, "attempts", attemptID)
}

func (f *Fabric) layout(a journal.Attempt, rootID, root string) delta.Layout {
	dir := f.attemptDir(a.AttemptID)
	private := filepath.Join(dir, "root")
	if root == "" {
		root = private
	}
	l := delta.Layout{Lower: f.projection.RootPath(rootID), Dir: filepath.Join(dir, "delta"), Root: root,
		HostView: root != private}
	if a.Executor == ExecutorRunc {
		l.IDMap = f.opts.IDMap
	}
	return l
}

// ensureMounted mounts a live attempt's writable root if it is not mounted
// and records where in the attempt's runtime record.
func (f *Fabric) ensureMounted(ctx context.Context, a journal.Attempt, root string) error {
	var v *AttemptView
	var n journal.Node
	err := f.journal.View(ctx, func(r journal.Reader) error {
		var err error
		if v, err = attemptView(r, a.AttemptID); err != nil {
			return err
		}
		n, err = journal.GetNode(r, v.NodeID)
		return err
	})
	if err != nil {
		return err
	}
	base, err := baseRoot(n, v.Runtime)
	if err != nil {
		return err
	}
	_, err = f.mountDelta(ctx, v.Attempt, base, v.Runtime, root)
	return err
}

// mountDelta mounts the writable root of live attempt a over root base,
// unless it is mounted, and records the mount in the attempt's runtime
// record rt (nil if it has none) when that changes it, which it reports.
// An activation writes the record it will need in its own commit, so its
// mount commits nothing more.
func (f *Fabric) mountDelta(ctx context.Context, a journal.Attempt, base string, rt *journal.AttemptRuntime, root string) (recorded bool, err error) {
	if !a.State.Live() {
		return false, fmt.Errorf("attempt %s is %s: %w", a.AttemptID, a.State, journal.ErrFailedPrecondition)
	}
	if rt != nil && rt.Mount != "" {
		root = rt.Mount
	}
	d, err := runtimeData(rt)
	if err != nil {
		return false, err
	}
	l := f.layout(a, base, root)
	// Held until the mount is recorded, as the global lock it replaces
	// was: an unmount of this root waits for the record.
	defer f.lockMount(l.Root)()
	mounted, boot, err := f.mountLocked(ctx, a.AttemptID, base, l, d.BootID, d.DiskBytes)
	if err != nil || !mounted {
		return false, err
	}
	d.BaseRootID, d.BootID = base, boot
	if d.MemoryBytes == 0 {
		d.MemoryBytes = f.quota.memOf(a.AttemptID)
	}
	next := journal.AttemptRuntime{AttemptID: a.AttemptID, Worker: f.worker, PrivateDelta: l.Dir, Mount: l.Root, Data: d.json()}
	if rt != nil && rt.Worker == next.Worker && rt.PrivateDelta == next.PrivateDelta && rt.Mount == next.Mount && bytes.Equal(rt.Data, next.Data) {
		return false, nil
	}
	if err := f.journal.Update(ctx, func(tx journal.Tx) error { return journal.PutAttemptRuntime(tx, next) }); err != nil {
		f.mounter.Unmount(l.Root)
		return false, err
	}
	return true, nil
}

// mountLocked mounts the delta of attempt id over root base at l unless
// something is mounted at l.Root already (then mounted is false). bootID
// is the boot the delta was last mounted in, if known; boot is the
// current one. A new delta in the disk pool is made with limit disk (the
// daemon's default if 0). lockMount(l.Root) is held.
func (f *Fabric) mountLocked(ctx context.Context, id, base string, l delta.Layout, bootID string, disk int64) (mounted bool, boot string, err error) {
	if f.mounter.Mounted(l.Root) {
		return false, "", nil
	}
	if pool := f.ensurePool(); pool != nil && strings.HasPrefix(l.Dir, pool.Dir+"/") {
		if disk <= 0 {
			disk = f.opts.DefaultDiskBytes
		}
		if err := os.Mkdir(filepath.Dir(l.Dir), 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return false, "", err
		}
		if err := pool.NewDelta(l.Dir, disk); err != nil {
			return false, "", err
		}
	}
	if boot, err = delta.BootID(); err != nil {
		return false, "", err
	}
	// An upper directory that exists was mounted before (the mount went
	// away: a crash between a seal's unmount and its commit, a restart of
	// the machine, someone's umount). Being volatile, it is whole only if
	// the machine has not restarted since.
	if _, err := os.Lstat(l.Upper()); err == nil {
		if bootID != "" && bootID != boot {
			return false, "", fmt.Errorf("attempt %s: delta lost: mounted volatile before the machine restarted: %w", id, journal.ErrFailedPrecondition)
		}
		if err := f.mounter.Reclaim(l); err != nil {
			return false, "", err
		}
		// A seal that did not commit may have handed files to the store.
		if err := l.Unshare(); err != nil {
			return false, "", err
		}
	}
	// The projection is checked only when a mount fails: a live server
	// costs nothing, a dead one (ENOTCONN on the lower) is restarted.
	if !f.projection.started() {
		if err := f.projection.Ensure(ctx); err != nil {
			return false, "", err
		}
	}
	if l.LowerAttr, err = f.projection.rootAttr(base); err == nil {
		err = f.mounter.Mount(l)
	}
	if err != nil && !f.projection.alive() {
		f.log.Warn("projection not answering; restarting it", "attempt_id", id, "err", err)
		if err := f.projection.Ensure(ctx); err != nil {
			return false, "", err
		}
		if l.LowerAttr, err = f.projection.rootAttr(base); err == nil {
			err = f.mounter.Mount(l)
		}
	}
	if err != nil {
		return false, "", err
	}
	return true, boot, nil
}

func (f *Fabric) attemptView(ctx context.Context, id string) (AttemptView, error) {
	var v *AttemptView
	err := f.journal.View(ctx, func(r journal.Reader) error {
		var err error
		v, err = attemptView(r, id)
		return err
	})
	if err != nil {
		return AttemptView{}, err
	}
	return *v, nil
}

// ReleaseRequest ends an attempt.
type ReleaseRequest struct {
	AttemptID string `json:"attempt_id"`
	// Token, if set, must be the attempt's current lease token.
	Token uint64 `json:"token,omitempty"`
}

// Release unmounts a live attempt's root, deletes its delta and lease, and
// marks it released. Releasing a released attempt returns it unchanged.
func (f *Fabric) Release(ctx context.Context, req ReleaseRequest) (AttemptView, error) {
	if err := journal.CheckID(journal.KindAttempt, req.AttemptID); err != nil {
		return AttemptView{}, fmt.Errorf("release: %w", err)
	}
	// Held from the unmount to the deletion: an activation's replay
	// must not mount the root again in between.
	defer f.lockAttempt(req.AttemptID)()
	a, err := f.attemptView(ctx, req.AttemptID)
	if err != nil {
		return AttemptView{}, fmt.Errorf("release: %w", err)
	}
	if a.Lease != nil && req.Token != 0 && req.Token != a.Lease.Token {
		return AttemptView{}, staleToken(a.AttemptID, req.Token, a.Lease.Token)
	}
	if a.State == journal.AttemptQuiescing || f.isSealing(a.AttemptID) {
		return AttemptView{}, fmt.Errorf("release: attempt %s is sealing: %w", a.AttemptID, journal.ErrFailedPrecondition)
	}
	// Unmount first: if the root is busy, nothing changes in the journal.
	// The delta itself goes only after the commit, so a crash in between
	// leaves an active attempt that Recover mounts again.
	if err := f.unmountAttempt(a.Attempt, a.Runtime); err != nil {
		return AttemptView{}, fmt.Errorf("release: %w", err)
	}
	err = f.mutate(ctx, OpRelease, req, nil, func(tx journal.Tx, ci CallInfo) (any, error) {
		return nil, releaseInTx(tx, ci, req.AttemptID, journal.AttemptReleased, "")
	})
	if err != nil {
		return AttemptView{}, err
	}
	f.deleteDelta(req.AttemptID)
	f.attemptEnded(ctx, req.AttemptID)
	return f.attemptView(ctx, req.AttemptID)
}

// releaseInTx moves a live attempt to the final state `to` (released or
// failed), drops its lease and runtime record. An attempt already past
// that point is left alone.
func releaseInTx(tx journal.Tx, ci CallInfo, attemptID string, to journal.AttemptState, reason string) error {
	a, err := journal.GetAttempt(tx, attemptID)
	if err != nil {
		return err
	}
	from := a.State
	if from == to || from == journal.AttemptReleased {
		return nil
	}
	if to == journal.AttemptReleased && from.Live() && from != journal.AttemptActive && from != journal.AttemptQueued {
		return fmt.Errorf("attempt %s is %s: %w", attemptID, from, journal.ErrFailedPrecondition)
	}
	if err := a.Transition(to); err != nil {
		return err
	}
	if reason != "" {
		a.Error = reason
	}
	if a.LeaseID != "" {
		l, err := journal.GetLease(tx, a.LeaseID)
		switch {
		case err == nil:
			if err := journal.DeleteLease(tx, a.LeaseID); err != nil {
				return err
			}
			typ := journal.EventLeaseReleased
			if to == journal.AttemptFailed {
				typ = journal.EventLeaseExpired
			}
			if err := event(tx, ci, l.Event(typ), nil); err != nil {
				return err
			}
		case !isNotFound(err):
			return err
		}
	}
	if err := journal.UpdateAttempt(tx, a); err != nil {
		return err
	}
	if err := journal.DeleteAttemptRuntime(tx, attemptID); err != nil && !isNotFound(err) {
		return err
	}
	return event(tx, ci, a.Event(journal.EventAttemptState), map[string]any{"from": from, "to": to, "reason": reason})
}

// removeDelta unmounts an attempt's root and deletes its private delta.
func (f *Fabric) removeDelta(a journal.Attempt, rt *journal.AttemptRuntime) error {
	defer f.lockAttempt(a.AttemptID)()
	if err := f.unmountAttempt(a, rt); err != nil {
		return err
	}
	f.deleteDelta(a.AttemptID)
	return nil
}

// unmountAttempt stops an attempt's container and unmounts its root; the
// delta stays.
func (f *Fabric) unmountAttempt(a journal.Attempt, rt *journal.AttemptRuntime) error {
	// The container goes first: it holds the root busy.
	if err := f.stopContainer(context.Background(), a); err != nil {
		return err
	}
	root := filepath.Join(f.attemptDir(a.AttemptID), "root")
	if rt != nil && rt.Mount != "" {
		root = rt.Mount
	}
	return f.unmountRoot(a, root)
}

// deleteDelta removes an ended attempt's private directory (its delta and
// default mountpoint) off the request path: on a file system mounted with
// discard (this machine's) every freed directory block is a synchronous
// discard, ~0.4 ms, and a delta is about ten directories. The attempt has
// ended in the journal already; a crash before the deletion leaves a
// directory that Recover sweeps.
func (f *Fabric) deleteDelta(attemptID string) {
	f.reapMu.Lock()
	queued := false
	if !f.reapClosed {
		f.reaping.Add(1) // before the send: the reaper may be done first
		select {
		case f.reap <- attemptID:
			queued = true
		default: // the reaper is behind
			f.reaping.Done()
		}
	}
	f.reapMu.Unlock()
	if !queued {
		f.removeAttemptDir(attemptID)
	}
}

// reaper deletes the directories deleteDelta queues, until Close closes
// the queue.
func (f *Fabric) reaper() {
	defer f.reaperDone.Done()
	for id := range f.reap {
		f.removeAttemptDir(id)
		f.reaping.Done()
	}
}

// reapQueue is how many ended attempts' directories may wait for deletion.
const reapQueue = 256

func (f *Fabric) removeAttemptDir(attemptID string) {
	dir := f.attemptDir(attemptID)
	// Deleting would reach into the mounted root, or pull the upper
	// directory from under an overlay mounted elsewhere (a custom root);
	// Recover unmounts and deletes it.
	if f.mounter.Mounted(filepath.Join(dir, "root")) || f.mounter.UpperInUse(filepath.Join(dir, "delta")) {
		f.log.Warn("delete delta: root still mounted", "attempt_id", attemptID)
		return
	}
	if err := os.RemoveAll(dir); err != nil {
		f.log.Warn("delete delta", "attempt_id", attemptID, "err", err)
	}
}

// isReplay reports whether the call's idempotency key already holds this
// request's result.
func (f *Fabric) isReplay(ctx context.Context, op string, req any) bool {
	ci, _ := CallInfoFrom(ctx)
	if ci.IdempotencyKey == "" {
		return false
	}
	found := false
	f.journal.View(ctx, func(r journal.Reader) error {
		_, found, _ = journal.CheckIdempotency(r, ci.IdempotencyKey, op, req)
		return nil
	})
	return found
}

// attemptLock is one attempt's entry in Fabric.attemptLocks; it lives
// while someone holds or waits for it.
type attemptLock struct {
	mu   sync.Mutex
	refs int
}

// lockAttempt locks attempt id and returns its unlock. Not reentrant.
func (f *Fabric) lockAttempt(id string) (unlock func()) {
	return lockKey(&f.attemptLocksMu, f.attemptLocks, id)
}

// lockMount locks the mount point root (see Fabric.mountLocks) and
// returns its unlock. Not reentrant.
func (f *Fabric) lockMount(root string) (unlock func()) {
	f.mountsMu.RLock()
	u := lockKey(&f.mountLocksMu, f.mountLocks, filepath.Clean(root))
	return func() {
		u()
		f.mountsMu.RUnlock()
	}
}

// lockKey locks key in locks (guarded by mu) and returns its unlock.
func lockKey(mu *sync.Mutex, locks map[string]*attemptLock, key string) (unlock func()) {
	mu.Lock()
	l := locks[key]
	if l == nil {
		l = &attemptLock{}
		locks[key] = l
	}
	l.refs++
	mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(locks, key)
		}
		mu.Unlock()
	}
}

// testHookFailUnmounted, if set (by tests), runs in failAttempt between
// the unmount and the commit that ends the attempt.
var testHookFailUnmounted func(attemptID string)

// failAttempt records that a live attempt failed and cleans its delta.
func (f *Fabric) failAttempt(ctx context.Context, attemptID string, cause error) {
	defer f.lockAttempt(attemptID)()
	f.failAttemptLocked(ctx, attemptID, cause)
}

// failAttemptLocked is failAttempt with the attempt's lock held.
func (f *Fabric) failAttemptLocked(ctx context.Context, attemptID string, cause error) {
	a, err := f.attemptView(ctx, attemptID)
	if err == nil {
		err = f.unmountAttempt(a.Attempt, a.Runtime)
	}
	if err == nil && testHookFailUnmounted != nil {
		testHookFailUnmounted(attemptID)
	}
	if err == nil {
		err = f.journal.Update(ctx, func(tx journal.Tx) error {
			return releaseInTx(tx, f.callInfo(ctx), attemptID, journal.AttemptFailed, cause.Error())
		})
	}
	if err == nil {
		f.deleteDelta(attemptID)
	}
	if err != nil {
		f.log.Error("fail attempt", "attempt_id", attemptID, "cause", cause, "err", err)
		return
	}
	f.attemptEnded(ctx, attemptID)
}

// RenewRequest extends a lease.
type RenewRequest struct {
	LeaseID   string `json:"lease_id"`
	Token     uint64 `json:"token"`
	TTLMillis int64  `json:"ttl_ms,omitempty"`
}

// Renew extends a live lease by its TTL (or req.TTLMillis) from now. A
// token that is not the lease's current one is rejected with
// ErrStaleGeneration: the caller's lease was replaced.
func (f *Fabric) Renew(ctx context.Context, req RenewRequest) (journal.Lease, error) {
	var l journal.Lease
	if err := journal.CheckID(journal.KindLease, req.LeaseID); err != nil {
		return l, fmt.Errorf("renew: %w", err)
	}
	if req.TTLMillis < 0 {
		return l, fmt.Errorf("renew: negative ttl: %w", journal.ErrInvalidArgument)
	}
	err := f.mutate(ctx, OpRenew, req, &l, func(tx journal.Tx, ci CallInfo) (any, error) {
		l, err := journal.GetLease(tx, req.LeaseID)
		if err != nil {
			return nil, fmt.Errorf("lease %s (expired or released): %w", req.LeaseID, err)
		}
		if req.Token != l.Token {
			return nil, staleToken(l.AttemptID, req.Token, l.Token)
		}
		if l.Expired(tx.Now()) {
			return nil, fmt.Errorf("lease %s expired at %s: %w", l.LeaseID, l.ExpiresAt.Format(time.RFC3339Nano), journal.ErrFailedPrecondition)
		}
		if req.TTLMillis > 0 {
			l.TTLMillis = req.TTLMillis
		}
		l.ExpiresAt = tx.Now().Add(time.Duration(l.TTLMillis) * time.Millisecond)
		if err := journal.UpdateLease(tx, l); err != nil {
			return nil, err
		}
		return l, event(tx, ci, l.Event(journal.EventLeaseRenewed), map[string]any{"expires_at": l.ExpiresAt})
	})
	return l, err
}

func staleToken(attemptID string, got, want uint64) error {
	return fmt.Errorf("attempt %s: lease token %d is stale (current %d): %w", attemptID, got, want, journal.ErrStaleGeneration)
}

// ExpireLeases fails every attempt whose lease has expired, frees the lease
// and cleans the delta. esfd runs it periodically; tests call it directly
// with a controlled clock.
func (f *Fabric) ExpireLeases(ctx context.Context) (int, error) {
	var expired []string
	now := f.now()
	err := f.journal.View(ctx, func(r journal.Reader) error {
		return journal.ExpiredLeases(r, now, func(id string) error {
			expired = append(expired, id)
			return nil
		})
	})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, lid := range expired {
		var attemptID string
		err := f.journal.Update(ctx, func(tx journal.Tx) error {
			l, err := journal.GetLease(tx, lid)
			if err != nil {
				if isNotFound(err) {
					return nil // released meanwhile
				}
				return err
			}
			if !l.Expired(tx.Now()) {
				return nil // renewed meanwhile
			}
			if f.cluster != nil {
				// Another live worker's attempt is its owner's to end
				// (its sandbox is there); a dead worker's, the
				// cluster loop's.
				rt, err := journal.GetAttemptRuntime(tx, l.AttemptID)
				if err == nil && rt.Worker != f.worker {
					return nil
				}
			}
			attemptID = l.AttemptID
			return releaseInTx(tx, f.callInfo(ctx), l.AttemptID, journal.AttemptFailed, "lease expired")
		})
		if err != nil {
			return n, err
		}
		if attemptID != "" {
			n++
			f.attemptEnded(ctx, attemptID)
			a, err := f.attemptView(ctx, attemptID)
			if err == nil {
				err = f.removeDelta(a.Attempt, nil)
			}
			if err != nil {
				f.log.Error("clean expired attempt", "attempt_id", attemptID, "err", err)
			}
		}
	}
	return n, nil
}

// RetryRequest starts a new attempt where a failed one ended.
type RetryRequest struct {
	AttemptID string `json:"attempt_id"`
	TTLMillis int64  `json:"ttl_ms,omitempty"`
}

// Retry activates the failed attempt's node again as a new attempt that
// records RetryOf; the failed record is never rewritten.
func (f *Fabric) Retry(ctx context.Context, req RetryRequest) (AttemptView, error) {
	prev, err := f.attemptView(ctx, req.AttemptID)
	if err != nil {
		return AttemptView{}, fmt.Errorf("retry: %w", err)
	}
	return f.activate(ctx, OpRetry, ActivateRequest{NodeID: prev.NodeID, Executor: prev.Executor,
		TTLMillis: req.TTLMillis, RetryOf: prev.AttemptID})
}

// checkMountDir accepts an existing empty directory for a writable root.
func checkMountDir(m mounter.Mounter, dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	fi, err := os.Lstat(abs)
	if errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("mount dir %s does not exist: %w", abs, journal.ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("mount dir %s: %w", abs, err)
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("mount dir %s is not a directory: %w", abs, journal.ErrInvalidArgument)
	}
	if m.Mounted(abs) {
		return "", fmt.Errorf("mount dir %s is busy (something is mounted there): %w", abs, journal.ErrFailedPrecondition)
	}
	ents, err := os.ReadDir(abs)
	if err != nil {
		return "", err
	}
	if len(ents) > 0 {
		return "", fmt.Errorf("mount dir %s is not empty: %w", abs, journal.ErrFailedPrecondition)
	}
	return abs, nil
}
