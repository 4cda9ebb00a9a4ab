package crashtest

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/esf-dev/esf/fabric"
	"github.com/esf-dev/esf/journal"
	"github.com/esf-dev/esf/journal/failpoint"
)

// TestFR03_MutationsAreAtomicUnderCrash kills esfd with SIGKILL at every
// failpoint of every mutating operation but suspend (see
// TestFR03_SealIsAtomicUnderCrash): after a restart each is absent or
// complete, never partial; a replay of its key performs it once or returns
// the committed result; the event log holds exactly the committed
// transitions.
func TestFR03_MutationsAreAtomicUnderCrash(t *testing.T) {
	requireRoot(t)
	t.Parallel() // its cases share the -parallel slots with the other FR-03 test's
	start := time.Now()
	var m matrix
	t.Cleanup(func() {
		m.log(t, fmt.Sprintf("FR-03 mutations matrix (%v; template %v; time in all cases so far: %v)", time.Since(start).Round(time.Second), buildTime(pebbleMode).Round(time.Millisecond), timing))
	})
	template(t, pebbleMode)
	for _, spec := range mutationSpecs() {
		t.Run(spec.name, func(t *testing.T) {
			t.Parallel()
			runSpec(t, pebbleMode, spec, &m)
		})
	}
}

func mutationSpecs() []*opSpec {
	return []*opSpec{createGroupSpec(), forkSpec(), promoteSpec(), evaluateSpec(), pruneSpec(), mergeSpec(),
		activateSpec(), mountRWSpec(), releaseSpec(), renewSpec(), retrySpec()}
}

// TestFR03_EveryMutationHasACrashCase keeps the harness complete: every
// operation that declares failpoints has a spec above or in seal_test.go.
func TestFR03_EveryMutationHasACrashCase(t *testing.T) {
	covered := map[string]bool{}
	for _, s := range append(mutationSpecs(), sealSpecs()...) {
		covered[s.op] = true
	}
	for _, name := range failpoint.Names() {
		rest, ok := strings.CutPrefix(name, "fabric.")
		if !ok {
			continue
		}
		op, _, _ := strings.Cut(rest, ".")
		if !covered[op] {
			t.Errorf("failpoint %s: operation %q has no crash case in crashtest", name, op)
		}
	}
}

func createGroupSpec() *opSpec {
	return &opSpec{
		name: "create_group", op: fabric.OpCreateGroup, storedReply: true,
		request: func(c *caseRun) (string, any) {
			return "/v1/groups", fabric.CreateGroupRequest{RootID: c.g.RootID}
		},
		classify: func(c *caseRun, before, after *snapshot) (outcome, error) {
			groups, nodes := newIDs(before.groups, after.groups), newIDs(before.nodes, after.nodes)
			if err := firstErr(unchanged("group", before.groups, after.groups), unchanged("node", before.nodes, after.nodes)); err != nil {
				return "", err
			}
			switch {
			case len(groups) == 0 && len(nodes) == 0:
				return c.agree(false, after)
			case len(groups) != 1 || len(nodes) != 1:
				return "", fmt.Errorf("%d new groups and %d new nodes, want 1 and 1", len(groups), len(nodes))
			}
			g, n := after.groups[groups[0]], after.nodes[nodes[0]]
			if g.RootNodeID != n.NodeID || g.CanonicalNodeID != n.NodeID || g.Generation != 1 {
				return "", fmt.Errorf("new group %+v does not have its new node %s as root and canonical at generation 1", g, n.NodeID)
			}
			if n.GroupID != g.GroupID || n.Status != journal.NodeSealed || n.RootID != c.g.RootID || len(n.Parents) != 0 {
				return "", fmt.Errorf("new root node %+v is not a sealed parentless node of root %s", n, c.g.RootID)
			}
			if err := c.wantKeyEvents(after, journal.EventGroupCreated, journal.EventNodeCreated); err != nil {
				return "", err
			}
			c.pre["group"], c.pre["node"] = g.GroupID, n.NodeID
			return c.agree(true, after)
		},
		recovered: func(c *caseRun, o outcome) {
			if o == absent {
				return
			}
			if g := c.inspectGroup(c.pre["group"]); g.CanonicalNodeID != c.pre["node"] || g.Generation != 1 || g.Nodes != 1 {
				c.t.Errorf("inspect of the new group: %+v", g)
			}
			if n := c.inspectNode(c.pre["node"]); n.Status != journal.NodeSealed || n.RootID != c.g.RootID {
				c.t.Errorf("inspect of the new root node: %+v", n.Node)
			}
		},
	}
}

func forkSpec() *opSpec { return forkSpecN("fork", 5) }

// forkSpecN forks n children of A1 in one operation.
func forkSpecN(name string, n int) *opSpec {
	return &opSpec{
		name: name, op: fabric.OpFork, storedReply: true,
		request: func(c *caseRun) (string, any) {
			return "/v1/fork", fabric.ForkRequest{NodeID: c.g.A1, N: n}
		},
		classify: func(c *caseRun, before, after *snapshot) (outcome, error) {
			if err := unchanged("node", before.nodes, after.nodes); err != nil {
				return "", err
			}
			kids := newIDs(before.nodes, after.nodes)
			parent := after.nodes[c.g.A1]
			for _, id := range kids {
				k := after.nodes[id]
				if k.Status != journal.NodeDraft || !slices.Equal(k.Parents, []string{c.g.A1}) || k.RootID != parent.RootID || k.GroupID != parent.GroupID {
					return "", fmt.Errorf("new node %+v is not a draft child of %s at its root %s", k, c.g.A1, parent.RootID)
				}
			}
			switch len(kids) {
			case 0:
				if err := c.wantKeyEvents(after); err != nil {
					return "", err
				}
				return c.agree(false, after)
			case n:
				if err := c.wantKeyEvents(after, repeat(journal.EventNodeForked, n)...); err != nil {
					return "", err
				}
				return c.agree(true, after)
			}
			return "", fmt.Errorf("%d new children, want 0 or %d", len(kids), n)
		},
		recovered: func(c *caseRun, o outcome) {
			p := c.inspectNode(c.g.A1)
			want := map[outcome]int{absent: 0, complete: n}[o]
			if len(p.Children) != want {
				c.t.Errorf("inspect %s after a crash that left the fork %s: %d children, want %d", c.g.A1, o, len(p.Children), want)
			}
			for _, id := range p.Children {
				if k := c.inspectNode(id); k.Status != journal.NodeDraft || k.RootID != p.RootID || !slices.Equal(k.Ancestry, append([]string{c.g.A1}, p.Ancestry...)) {
					c.t.Errorf("inspect of child %s: %+v", id, k)
				}
			}
			var tree struct {
				Nodes []journal.Node `json:"nodes"`
			}
			c.get("/v1/tree/"+c.g.Group, &tree)
			if base := len(c.before.nodes); len(tree.Nodes) != base+want {
				c.t.Errorf("tree of %s lists %d nodes, want %d", c.g.Group, len(tree.Nodes), base+want)
			}
		},
	}
}

func promoteSpec() *opSpec {
	return &opSpec{
		name: "promote", op: fabric.OpPromote, storedReply: true,
		request: func(c *caseRun) (string, any) {
			return "/v1/promote", fabric.PromoteRequest{GroupID: c.g.Group, NodeID: c.g.A, ExpectedGeneration: 1}
		},
		classify: func(c *caseRun, before, after *snapshot) (outcome, error) {
			if err := firstErr(unchanged("group", before.groups, after.groups, c.g.Group), unchanged("node", before.nodes, after.nodes)); err != nil {
				return "", err
			}
			g := after.groups[c.g.Group]
			switch {
			case g.Generation == 1 && g.CanonicalNodeID == c.g.R:
				if err := c.wantKeyEvents(after); err != nil {
					return "", err
				}
				return c.agree(false, after)
			case g.Generation == 2 && g.CanonicalNodeID == c.g.A:
				if err := c.wantKeyEvents(after, journal.EventGroupPromoted); err != nil {
					return "", err
				}
				return c.agree(true, after)
			}
			return "", fmt.Errorf("group at generation %d with canonical %s; want 1 and %s, or 2 and %s", g.Generation, g.CanonicalNodeID, c.g.R, c.g.A)
		},
		recovered: func(c *caseRun, o outcome) {
			g := c.inspectGroup(c.g.Group)
			want := map[outcome]uint64{absent: 1, complete: 2}[o]
			if g.Generation != want {
				c.t.Errorf("inspect of the group after a %s promote: generation %d, want %d", o, g.Generation, want)
			}
		},
	}
}

const reward = 0.75

func evaluateSpec() *opSpec {
	return &opSpec{
		name: "evaluate+backprop", op: fabric.OpEvaluate, storedReply: true,
		request: func(c *caseRun) (string, any) {
			return "/v1/evaluate", fabric.EvaluateRequest{Target: c.g.A1, Evaluator: "crashtest@1", Reward: reward,
				Verdict: "pass", Evidence: []string{c.g.Evidence}, Backprop: true}
		},
		classify: func(c *caseRun, before, after *snapshot) (outcome, error) {
			path := []string{c.g.A1, c.g.A, c.g.R} // the node and its ancestors
			if err := unchanged("node", before.nodes, after.nodes, path...); err != nil {
				return "", err
			}
			evals := newIDs(before.evals, after.evals)
			var add uint64
			switch len(evals) {
			case 0:
			case 1:
				e := after.evals[evals[0]]
				if e.NodeID != c.g.A1 || e.Reward != reward || !e.Backprop || !slices.Equal(e.Evidence, []string{c.g.Evidence}) {
					return "", fmt.Errorf("new evaluation %+v", e)
				}
				add = 1
			default:
				return "", fmt.Errorf("%d new evaluations, want 0 or 1", len(evals))
			}
			for _, id := range path {
				b, a := before.nodes[id], after.nodes[id]
				if a.Visits != b.Visits+add || math.Abs(a.Value-(b.Value+float64(add)*reward)) > 1e-9 {
					return "", fmt.Errorf("%d new evaluations, but node %s went from %d visits / %g to %d / %g", add, id, b.Visits, b.Value, a.Visits, a.Value)
				}
			}
			if add == 0 {
				if err := c.wantKeyEvents(after); err != nil {
					return "", err
				}
				return c.agree(false, after)
			}
			if err := c.wantKeyEvents(after, append(repeat(journal.EventNodeBackprop, len(path)), journal.EventEvaluationCreated)...); err != nil {
				return "", err
			}
			return c.agree(true, after)
		},
		recovered: func(c *caseRun, o outcome) {
			n := c.inspectNode(c.g.A1)
			want := map[outcome]int{absent: 0, complete: 1}[o]
			if len(n.Evaluations) != want || n.Visits != uint64(want) {
				c.t.Errorf("inspect %s after a %s evaluate: %d evaluations, %d visits", c.g.A1, o, len(n.Evaluations), n.Visits)
			}
		},
	}
}

func pruneSpec() *opSpec {
	return &opSpec{
		name: "prune", op: fabric.OpPrune, storedReply: true,
		request: func(c *caseRun) (string, any) { return "/v1/prune", fabric.PruneRequest{NodeID: c.g.B} },
		classify: func(c *caseRun, before, after *snapshot) (outcome, error) {
			sub := []string{c.g.B, c.g.B1, c.g.B2}
			if err := unchanged("node", before.nodes, after.nodes, sub...); err != nil {
				return "", err
			}
			pruned := 0
			for _, id := range sub {
				b, a := before.nodes[id], after.nodes[id]
				if a.Status == journal.NodePruned {
					pruned++
					b.Status = a.Status
				}
				if !nodesEqual(a, b) {
					return "", fmt.Errorf("node %s changed beyond its status: %+v -> %+v", id, before.nodes[id], a)
				}
			}
			switch pruned {
			case 0:
				if err := c.wantKeyEvents(after); err != nil {
					return "", err
				}
				return c.agree(false, after)
			case len(sub):
				if err := c.wantKeyEvents(after, repeat(journal.EventNodeState, len(sub))...); err != nil {
					return "", err
				}
				return c.agree(true, after)
			}
			return "", fmt.Errorf("%d of the %d nodes of the subtree pruned", pruned, len(sub))
		},
		recovered: func(c *caseRun, o outcome) {
			for _, id := range []string{c.g.B, c.g.B1, c.g.B2} {
				if n := c.inspectNode(id); (n.Status == journal.NodePruned) != (o == complete) {
					c.t.Errorf("inspect %s after a %s prune: %s", id, o, n.Status)
				}
			}
		},
	}
}

func mergeSpec() *opSpec {
	return &opSpec{
		name: "merge+promote", op: fabric.OpMerge, storedReply: true,
		request: func(c *caseRun) (string, any) {
			return "/v1/merge", fabric.MergeRequest{Nodes: []string{c.g.A, c.g.B}, Promote: true, ExpectedGeneration: 1}
		},
		classify: func(c *caseRun, before, after *snapshot) (outcome, error) {
			if err := firstErr(unchanged("group", before.groups, after.groups, c.g.Group), unchanged("node", before.nodes, after.nodes)); err != nil {
				return "", err
			}
			g, kids := after.groups[c.g.Group], newIDs(before.nodes, after.nodes)
			switch {
			case len(kids) == 0 && g.Generation == 1 && g.CanonicalNodeID == c.g.R:
				if err := c.wantKeyEvents(after); err != nil {
					return "", err
				}
				return c.agree(false, after)
			case len(kids) == 1 && g.Generation == 2 && g.CanonicalNodeID == kids[0]:
				n := after.nodes[kids[0]]
				if n.Status != journal.NodeSealed || !slices.Equal(n.Parents, []string{c.g.A, c.g.B}) {
					return "", fmt.Errorf("merged node %+v", n)
				}
				if err := c.wantKeyEvents(after, "node.merged", journal.EventGroupPromoted); err != nil {
					return "", err
				}
				c.pre["root_id"] = n.RootID
				return c.agree(true, after)
			}
			return "", fmt.Errorf("%d new nodes, group at generation %d with canonical %s: want none and 1, or the merged node and 2", len(kids), g.Generation, g.CanonicalNodeID)
		},
		recovered: func(c *caseRun, o outcome) {
			if o == absent {
				return
			}
			// The merge holds both sides' sealed files over the fixture.
			c.seq++
			to := filepath.Join(c.dir, fmt.Sprintf("export-%d", c.seq))
			c.mustDo("/v1/export", map[string]string{"id": c.pre["root_id"], "to": to}, nil)
			for _, n := range []string{c.g.A, c.g.B} {
				if b, err := os.ReadFile(filepath.Join(to, "sealed-"+n+".txt")); err != nil || string(b) != n {
					c.t.Errorf("merged root lacks %s's change: %q, %v", n, b, err)
				}
			}
		},
	}
}

func nodesEqual(a, b journal.Node) bool {
	return fmt.Sprintf("%+v", a) == fmt.Sprintf("%+v", b)
}

// attemptOutcome classifies an operation that creates one attempt on node
// (activate, retry, mount --rw): none, or one with its lease, in one batch.
func attemptOutcome(c *caseRun, before, after *snapshot, node, retryOf string) (outcome, error) {
	if err := firstErr(unchanged("node", before.nodes, after.nodes), unchanged("lease", before.leases, after.leases),
		unchanged("attempt", before.attempts, after.attempts)); err != nil {
		return "", err
	}
	var mine []journal.Attempt
	for _, id := range newIDs(before.attempts, after.attempts) {
		mine = append(mine, after.attempts[id])
	}
	switch len(mine) {
	case 0:
		if len(newIDs(before.leases, after.leases)) != 0 {
			return "", fmt.Errorf("a new lease without a new attempt")
		}
		if err := c.wantKeyEvents(after); err != nil {
			return "", err
		}
		return c.agree(false, after)
	case 1:
	default:
		return "", fmt.Errorf("%d new attempts, want 0 or 1", len(mine))
	}
	a := mine[0]
	if a.NodeID != node || a.RetryOf != retryOf {
		return "", fmt.Errorf("new attempt %+v, want one on %s retrying %q", a, node, retryOf)
	}
	c.pre["attempt"] = a.AttemptID
	// Once committed, recovery may have failed it (its lease freed); before
	// that it is active with its lease.
	switch a.State {
	case journal.AttemptActive:
		if _, ok := after.leases[a.LeaseID]; !ok {
			return "", fmt.Errorf("active attempt %s without its lease", a.AttemptID)
		}
	case journal.AttemptFailed:
	default:
		return "", fmt.Errorf("new attempt is %s", a.State)
	}
	return c.agree(true, after)
}

// checkAttemptRecovered is the activate invariant after a restart: the
// attempt (if the crash left one) is either active with a mounted, usable
// root, or failed with its lease freed and nothing mounted; never a lease
// without a mount. rootWant, if set, is where its root must be.
func checkAttemptRecovered(c *caseRun, o outcome, rootWant string) {
	if o == absent {
		return
	}
	a := c.inspectAttempt(c.pre["attempt"])
	switch a.State {
	case journal.AttemptActive:
		if a.Lease == nil {
			c.t.Errorf("active attempt %s has no lease", a.AttemptID)
		}
		checkUsable(c, a, rootWant)
	case journal.AttemptFailed:
		c.note("recovery failed the attempt: %s", a.Error)
		if a.Lease != nil {
			c.t.Errorf("failed attempt %s still holds lease %s", a.AttemptID, a.Lease.LeaseID)
		}
		if a.Root != "" {
			if _, ok := mountedAt(a.Root); ok {
				c.t.Errorf("failed attempt %s is still mounted at %s", a.AttemptID, a.Root)
			}
		}
	default:
		c.t.Errorf("after recovery attempt %s is %s", a.AttemptID, a.State)
	}
}

// checkUsable asserts an active attempt's root is an overlay that shows
// its node's tree, and that no other overlay of it is mounted.
func checkUsable(c *caseRun, a fabric.AttemptView, rootWant string) {
	c.t.Helper()
	if a.Root == "" {
		c.t.Errorf("active attempt %s holds lease %v but reports no root (no runtime record)", a.AttemptID, a.LeaseID)
		return
	}
	if rootWant != "" && a.Root != rootWant {
		c.t.Errorf("attempt %s is rooted at %s, want %s", a.AttemptID, a.Root, rootWant)
	}
	if fstype, ok := mountedAt(a.Root); !ok || fstype != "overlay" {
		c.t.Errorf("active attempt %s: nothing (or %q) mounted at its root %s", a.AttemptID, fstype, a.Root)
		return
	}
	if b, err := os.ReadFile(filepath.Join(a.Root, "keep/untouched.txt")); err != nil || string(b) != "never changed\n" {
		c.t.Errorf("active attempt %s: its root is not usable: %q, %v", a.AttemptID, b, err)
	}
	// One delta, one mount: a second overlay on the same upper dir is
	// undefined behaviour in overlayfs (with index=off it mounts anyway).
	var on []string
	for _, m := range mountsUnder(c.dir) {
		if m.fstype == "overlay" && strings.Contains(m.super, "upperdir="+filepath.Join(c.state, "attempts", a.AttemptID)+"/") {
			on = append(on, m.point)
		}
	}
	if len(on) != 1 {
		c.t.Errorf("attempt %s's delta is mounted %d times, want once: %v", a.AttemptID, len(on), on)
	}
}

func activateSpec() *opSpec {
	return &opSpec{
		name: "activate", op: fabric.OpActivate,
		request: func(c *caseRun) (string, any) { return "/v1/activate", fabric.ActivateRequest{NodeID: c.g.C} },
		classify: func(c *caseRun, before, after *snapshot) (outcome, error) {
			return attemptOutcome(c, before, after, c.g.C, "")
		},
		recovered: func(c *caseRun, o outcome) { checkAttemptRecovered(c, o, "") },
		replayed:  func(c *caseRun, r *reply) { replayedAttempt(c, r, "") },
	}
}

// replayedAttempt checks the reply of a replayed activation: the same
// attempt, active and usable unless recovery had failed it.
func replayedAttempt(c *caseRun, r *reply, rootWant string) {
	var a fabric.AttemptView
	if err := json.Unmarshal(r.body, &a); err != nil {
		c.t.Fatalf("replay reply: %v", err)
	}
	if id := c.pre["attempt"]; id != "" && a.AttemptID != id {
		c.t.Errorf("replay returned attempt %s, the crash left %s", a.AttemptID, id)
	}
	c.pre["attempt"] = a.AttemptID
	cur := c.inspectAttempt(a.AttemptID)
	switch cur.State {
	case journal.AttemptActive:
		checkUsable(c, cur, rootWant)
	case journal.AttemptFailed:
	default:
		c.t.Errorf("after the replay attempt %s is %s", a.AttemptID, cur.State)
	}
}

func mountRWSpec() *opSpec {
	rw := func(c *caseRun) string { return filepath.Join(c.dir, "rw") }
	return &opSpec{
		name: "mount-rw", op: fabric.OpActivate,
		request: func(c *caseRun) (string, any) {
			if err := os.MkdirAll(rw(c), 0o755); err != nil {
				c.t.Fatal(err)
			}
			return "/v1/mount", fabric.MountRequest{NodeID: c.g.C, Dir: rw(c), RW: true}
		},
		classify: func(c *caseRun, before, after *snapshot) (outcome, error) {
			return attemptOutcome(c, before, after, c.g.C, "")
		},
		recovered: func(c *caseRun, o outcome) { checkAttemptRecovered(c, o, rw(c)) },
		replayed: func(c *caseRun, r *reply) {
			var res fabric.MountResult
			if err := json.Unmarshal(r.body, &res); err != nil || res.Attempt == nil {
				c.t.Fatalf("replay reply %s: %v", r, err)
			}
			b, _ := json.Marshal(res.Attempt)
			replayedAttempt(c, &reply{status: r.status, body: b}, rw(c))
		},
	}
}

// activated is a prepared attempt on node C with a file in its root.
func activated(c *caseRun) fabric.AttemptView {
	var a fabric.AttemptView
	c.mustDo("/v1/activate", fabric.ActivateRequest{NodeID: c.g.C}, &a)
	if err := os.WriteFile(filepath.Join(a.Root, "work.txt"), []byte("work of "+a.AttemptID), 0o644); err != nil {
		c.t.Fatal(err)
	}
	c.pre["attempt"], c.pre["root"] = a.AttemptID, a.Root
	return a
}

// checkWork asserts an active attempt still shows the file prepared in it.
func checkWork(c *caseRun, a fabric.AttemptView) {
	c.t.Helper()
	checkUsable(c, a, c.pre["root"])
	if b, err := os.ReadFile(filepath.Join(a.Root, "work.txt")); err != nil || string(b) != "work of "+a.AttemptID {
		c.t.Errorf("attempt %s lost its delta: work.txt %q, %v", a.AttemptID, b, err)
	}
}

func releaseSpec() *opSpec {
	return &opSpec{
		name: "release", op: fabric.OpRelease,
		prepare: func(c *caseRun) { activated(c) },
		request: func(c *caseRun) (string, any) {
			return "/v1/release", fabric.ReleaseRequest{AttemptID: c.pre["attempt"]}
		},
		classify: func(c *caseRun, before, after *snapshot) (outcome, error) {
			id := c.pre["attempt"]
			if err := firstErr(unchanged("node", before.nodes, after.nodes), unchanged("attempt", before.attempts, after.attempts, id)); err != nil {
				return "", err
			}
			a := after.attempts[id]
			switch a.State {
			case journal.AttemptActive:
				if err := c.wantKeyEvents(after); err != nil {
					return "", err
				}
				return c.agree(false, after)
			case journal.AttemptReleased:
				if err := c.wantKeyEvents(after, journal.EventLeaseReleased, journal.EventAttemptState); err != nil {
					return "", err
				}
				return c.agree(true, after)
			case journal.AttemptFailed:
				// Not the operation's doing: recovery found the delta
				// already deleted (see recovered).
				return "", fmt.Errorf("attempt %s is failed (%s): the release deleted its delta but did not commit", id, a.Error)
			}
			return "", fmt.Errorf("attempt %s is %s", id, a.State)
		},
		recovered: func(c *caseRun, o outcome) {
			a := c.inspectAttempt(c.pre["attempt"])
			switch {
			case o == absent && a.State == journal.AttemptActive:
				checkWork(c, a)
			case o == complete && a.State == journal.AttemptReleased:
				if a.Lease != nil {
					c.t.Errorf("released attempt holds lease %s", a.Lease.LeaseID)
				}
				if _, ok := mountedAt(c.pre["root"]); ok {
					c.t.Errorf("released attempt still mounted at %s", c.pre["root"])
				}
			default:
				c.t.Errorf("after a crash that left the release %s the attempt is %s (%s): want it still active and usable, or released", o, a.State, a.Error)
			}
		},
		replayed: func(c *caseRun, r *reply) {
			if a := c.inspectAttempt(c.pre["attempt"]); a.State != journal.AttemptReleased || a.Lease != nil {
				c.t.Errorf("after the replay the attempt is %s with lease %v", a.State, a.Lease)
			}
			if _, ok := mountedAt(c.pre["root"]); ok {
				c.t.Errorf("released attempt still mounted at %s", c.pre["root"])
			}
		},
	}
}

const renewTTL = int64(time.Hour / time.Millisecond)

func renewSpec() *opSpec {
	return &opSpec{
		name: "renew", op: fabric.OpRenew, storedReply: true,
		prepare: func(c *caseRun) {
			a := activated(c)
			c.pre["lease"] = a.Lease.LeaseID
			c.pre["token"] = fmt.Sprint(a.Lease.Token)
		},
		request: func(c *caseRun) (string, any) {
			var token uint64
			fmt.Sscan(c.pre["token"], &token)
			return "/v1/renew", fabric.RenewRequest{LeaseID: c.pre["lease"], Token: token, TTLMillis: renewTTL}
		},
		classify: func(c *caseRun, before, after *snapshot) (outcome, error) {
			id := c.pre["lease"]
			if err := firstErr(unchanged("lease", before.leases, after.leases, id), unchanged("attempt", before.attempts, after.attempts)); err != nil {
				return "", err
			}
			b, a := before.leases[id], after.leases[id]
			switch {
			case a.LeaseID == "":
				return "", fmt.Errorf("lease %s vanished", id)
			case a.ExpiresAt.Equal(b.ExpiresAt) && a.TTLMillis == b.TTLMillis:
				if err := c.wantKeyEvents(after); err != nil {
					return "", err
				}
				return c.agree(false, after)
			case a.TTLMillis == renewTTL && a.ExpiresAt.After(b.ExpiresAt) && a.Token == b.Token:
				if err := c.wantKeyEvents(after, journal.EventLeaseRenewed); err != nil {
					return "", err
				}
				return c.agree(true, after)
			}
			return "", fmt.Errorf("lease %s went from %+v to %+v", id, b, a)
		},
		recovered: func(c *caseRun, o outcome) {
			a := c.inspectAttempt(c.pre["attempt"])
			if a.State != journal.AttemptActive {
				c.t.Fatalf("attempt %s is %s after the restart", a.AttemptID, a.State)
			}
			checkWork(c, a)
		},
	}
}

func retrySpec() *opSpec {
	return &opSpec{
		name: "retry", op: fabric.OpRetry,
		prepare: func(c *caseRun) {
			a := activated(c)
			c.mustDo("/v1/release", fabric.ReleaseRequest{AttemptID: a.AttemptID}, nil)
			c.pre["retried"] = a.AttemptID
			delete(c.pre, "attempt")
		},
		request: func(c *caseRun) (string, any) {
			return "/v1/retry", fabric.RetryRequest{AttemptID: c.pre["retried"]}
		},
		classify: func(c *caseRun, before, after *snapshot) (outcome, error) {
			return attemptOutcome(c, before, after, c.g.C, c.pre["retried"])
		},
		recovered: func(c *caseRun, o outcome) { checkAttemptRecovered(c, o, "") },
		replayed:  func(c *caseRun, r *reply) { replayedAttempt(c, r, "") },
	}
}
