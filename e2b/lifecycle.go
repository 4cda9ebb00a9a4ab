package e2b

import (
	"context"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/fabric"
)

// Pause, resume, fork and snapshots: each is a seal of the sandbox's
// attempt into a node of the graph, so `esfctl tree GROUP` shows them all.
//   - pause seals and releases (the node is the paused sandbox), resume
//     (connect) activates that node again under the same id;
//   - a snapshot seals with keep-running: the node is the snapshot's id,
//     usable as a templateID;
//   - fork seals with keep-running, forks count drafts of the node and
//     activates each: new sandboxes that share no writable delta.
// Process memory is never checkpointed: commands do not survive a pause.

type pauseRequest struct {
	Memory *bool `json:"memory"`
}

func (s *Server) pause(w http.ResponseWriter, r *http.Request) (int, any, error) {
	var req pauseRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	if req.Memory != nil && *req.Memory {
		return 0, nil, errMemory
	}
	sb, err := s.lookup(r.Context(), r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	sb.op.Lock()
	defer sb.op.Unlock()
	if err := s.pauseLocked(withStep(context.WithoutCancel(r.Context()), "pause"), sb); err != nil {
		return 0, nil, err
	}
	return http.StatusNoContent, nil, nil
}

// pauseLocked seals sb's attempt into a node and releases it. Caller holds
// sb.op.
func (s *Server) pauseLocked(ctx context.Context, sb *sandbox) error {
	s.mu.Lock()
	if s.sandboxes[sb.id] != sb {
		s.mu.Unlock()
		return notFound(sb.id)
	}
	if sb.paused != "" {
		s.mu.Unlock()
		return httpErr(http.StatusConflict, "Error pausing sandbox - sandbox '%s' is already paused", sb.id)
	}
	a, procs := sb.attempt, sb.procs
	s.mu.Unlock()
	procs.killAll()
	res, err := s.f.Suspend(ctx, fabric.SuspendRequest{AttemptID: a.AttemptID})
	if err != nil {
		return err
	}
	s.mu.Lock()
	sb.paused, sb.attempt, sb.procs = res.Node.NodeID, fabric.AttemptView{}, nil
	s.mu.Unlock()
	s.persistLogged(ctx, sb)
	return nil
}

// resume activates a paused sandbox's node again under its id (201).
// Caller holds sb.op.
func (s *Server) resume(ctx context.Context, sb *sandbox, ttl time.Duration) (int, any, error) {
	s.mu.Lock()
	node := sb.paused
	s.mu.Unlock()
	if node == "" {
		return http.StatusOK, s.reply(sb), nil
	}
	if err := s.start(ctx, sb, node, ttl); err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, s.reply(sb), nil
}

// checkpoint seals a running sandbox with keep-running and returns the
// node. Caller holds sb.op.
func (s *Server) checkpoint(ctx context.Context, sb *sandbox) (string, error) {
	s.mu.Lock()
	a, paused := sb.attempt, sb.paused
	s.mu.Unlock()
	if paused != "" {
		// A paused sandbox is its node already.
		return paused, nil
	}
	res, err := s.f.Suspend(ctx, fabric.SuspendRequest{AttemptID: a.AttemptID, KeepRunning: true})
	if err != nil {
		return "", err
	}
	return res.Node.NodeID, nil
}

type forkRequest struct {
	Timeout *int64 `json:"timeout"`
	Count   *int   `json:"count"`
}

// forkChild is one element of fork's answer.
type forkChild struct {
	Sandbox *sandboxReply `json:"sandbox,omitempty"`
	Error   *apiError     `json:"error,omitempty"`
}

func (s *Server) fork(w http.ResponseWriter, r *http.Request) (int, any, error) {
	var req forkRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	count := 1
	if req.Count != nil {
		count = *req.Count
	}
	if count < 1 || count > fabric.MaxFork {
		return 0, nil, httpErr(http.StatusBadRequest, "count %d: want 1..%d", count, fabric.MaxFork)
	}
	ttl, err := timeoutOf(req.Timeout)
	if err != nil {
		return 0, nil, err
	}
	parent, err := s.lookup(r.Context(), r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	ctx := context.WithoutCancel(r.Context())
	parent.op.Lock()
	node, err := s.checkpoint(withStep(ctx, "checkpoint"), parent)
	parent.op.Unlock()
	if err != nil {
		return 0, nil, err
	}
	drafts, err := s.f.Fork(withStep(ctx, "fork"), fabric.ForkRequest{NodeID: node, N: count})
	if err != nil {
		return 0, nil, err
	}
	out := make([]forkChild, len(drafts.Nodes))
	for i, n := range drafts.Nodes {
		child := &sandbox{id: sandboxIDFor(ctx, i), templateID: parent.templateID,
			metadata: clone(parent.metadata), env: clone(parent.env), autoPause: parent.autoPause}
		child.setToken(newToken())
		if err := s.start(withStep(ctx, "activate-"+strconv.Itoa(i)), child, n.NodeID, ttl); err != nil {
			out[i].Error = &apiError{Code: errStatus(err), Message: err.Error()}
			continue
		}
		rep := s.reply(child)
		out[i].Sandbox = &rep
	}
	return http.StatusCreated, out, nil
}

func clone(m map[string]string) map[string]string {
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

type snapshotRequest struct {
	Name string `json:"name"`
}

// snapshotInfo is E2B's snapshot record.
type snapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func (s *Server) snapshot(w http.ResponseWriter, r *http.Request) (int, any, error) {
	var req snapshotRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	sb, err := s.lookup(r.Context(), r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	sb.op.Lock()
	node, err := s.checkpoint(withStep(context.WithoutCancel(r.Context()), "snapshot"), sb)
	sb.op.Unlock()
	if err != nil {
		return 0, nil, err
	}
	info := snapshotInfo{SnapshotID: node, Names: []string{}}
	if req.Name != "" {
		info.Names = append(info.Names, req.Name)
	}
	rec := snapshotRecord{sandboxID: sb.id, names: info.Names}
	if err := s.persistSnapshot(r.Context(), node, rec); err != nil {
		return 0, nil, err
	}
	s.mu.Lock()
	s.snapshots[node] = rec
	s.mu.Unlock()
	return http.StatusCreated, info, nil
}

// snapshotRecord is what the front door remembers of a snapshot.
type snapshotRecord struct {
	sandboxID string
	names     []string
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) (int, any, error) {
	want := r.URL.Query().Get("sandboxID")
	s.mu.Lock()
	out := []snapshotInfo{}
	for node, rec := range s.snapshots {
		if want == "" || rec.sandboxID == want {
			out = append(out, snapshotInfo{SnapshotID: node, Names: rec.names})
		}
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].SnapshotID < out[j].SnapshotID })
	return http.StatusOK, out, nil
}

// deleteSnapshot prunes a snapshot's node (refused while an attempt
// leases it or a node below it).
func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) (int, any, error) {
	id := r.PathValue("id")
	s.mu.Lock()
	_, ok := s.snapshots[id]
	s.mu.Unlock()
	if !ok {
		return 0, nil, httpErr(http.StatusNotFound, "snapshot %q not found", id)
	}
	if _, err := s.f.Prune(r.Context(), fabric.PruneRequest{NodeID: id}); err != nil {
		if errdefs.CodeOf(err) == errdefs.CodeFailedPrecondition {
			return 0, nil, httpErr(http.StatusConflict, "snapshot %s is in use: %v", id, err)
		}
		return 0, nil, err
	}
	s.mu.Lock()
	delete(s.snapshots, id)
	s.mu.Unlock()
	if err := s.f.DeleteFrontRecord(context.WithoutCancel(r.Context()), frontDoor, "snap-"+id); err != nil {
		s.log.Warn("e2b: delete a snapshot's record", "snapshot", id, "err", err)
	}
	return http.StatusNoContent, nil, nil
}

// leaseSlack is how much longer than its timeout a sandbox's lease runs:
// the front door ends the sandbox at its timeout (killed, or paused with
// autoPause), and the lease is the backstop if the front door cannot (a
// daemon that stopped meanwhile).
const leaseSlack = time.Minute

// arm (re)sets sb's timer to its end. Caller holds s.mu. An expiry that
// has begun runs to its end before Close returns, so none calls the
// fabric after the front door was closed (and the fabric maybe too).
func (s *Server) arm(sb *sandbox) {
	if sb.timer != nil {
		sb.timer.Stop()
	}
	sb.timer = time.AfterFunc(time.Until(sb.endAt), func() {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return
		}
		s.wg.Add(1)
		s.mu.Unlock()
		defer s.wg.Done()
		s.expire(sb)
	})
}

// expire ends a sandbox whose timeout passed: paused with autoPause,
// else killed.
func (s *Server) expire(sb *sandbox) {
	sb.op.Lock()
	defer sb.op.Unlock()
	s.mu.Lock()
	due := s.sandboxes[sb.id] == sb && sb.paused == "" && !time.Now().Before(sb.endAt)
	s.mu.Unlock()
	if !due || s.ctx.Err() != nil {
		return
	}
	var err error
	if sb.autoPause {
		err = s.pauseLocked(s.ctx, sb)
	} else {
		err = s.killLocked(s.ctx, sb)
	}
	if err != nil {
		s.log.Warn("e2b: end a sandbox at its timeout", "sandbox", sb.id, "auto_pause", sb.autoPause, "err", err)
	} else {
		s.log.Info("e2b: sandbox timed out", "sandbox", sb.id, "paused", sb.autoPause)
	}
}
