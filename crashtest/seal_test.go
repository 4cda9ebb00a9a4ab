package crashtest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/esf-dev/esf/fabric"
	"github.com/esf-dev/esf/journal"
)

// TestFR03_SealIsAtomicUnderCrash kills esfd with SIGKILL at every
// boundary of suspend (its own failpoints: quiesced, trees written, before
// the release; the commit's before-update and after-commit; and each
// journal Update on the way): after a restart either no new node exists and
// the attempt is active again with its delta intact, or exactly one
// complete node exists whose export equals the tree the attempt saw, and
// the attempt is sealed and released (or still active with keep_running).
func TestFR03_SealIsAtomicUnderCrash(t *testing.T) {
	requireRoot(t)
	t.Parallel() // its cases share the -parallel slots with the other FR-03 test's
	start := time.Now()
	var m matrix
	t.Cleanup(func() {
		m.log(t, fmt.Sprintf("FR-03 seal matrix (%v; template %v; time in all cases so far: %v)", time.Since(start).Round(time.Second), buildTime(pebbleMode).Round(time.Millisecond), timing))
	})
	template(t, pebbleMode)
	for _, spec := range sealSpecs() {
		t.Run(spec.name, func(t *testing.T) {
			t.Parallel()
			runSpec(t, pebbleMode, spec, &m)
		})
	}
}

func sealSpecs() []*opSpec {
	return []*opSpec{
		suspendSpec("suspend-child", false, false),
		suspendSpec("suspend-draft", true, false),
		suspendSpec("suspend-keep-running", false, true),
		smallSuspendSpec("suspend-small", false),
		smallSuspendSpec("suspend-small-keep-running", true),
	}
}

// smallSuspendSpec is suspendSpec on a child with small changes only: the
// one-flush seal, whose objects only their redo records in the journal make
// durable until the store is flushed (loseUnflushedSealObjects).
func smallSuspendSpec(name string, keepRunning bool) *opSpec {
	s := suspendSpec(name, false, keepRunning)
	s.write = writeSmallChanges
	return s
}

// suspendSpec seals an attempt on a sealed node (a new child) or on a
// draft (the draft itself becomes sealed), optionally keeping it running.
func suspendSpec(name string, draft, keepRunning bool) *opSpec {
	node := func(c *caseRun) string {
		if draft {
			return c.g.D
		}
		return c.g.A1
	}
	spec := &opSpec{
		name: name, op: fabric.OpSuspend, afterCrash: loseUnflushedSealObjects, write: writeChanges,
		prepare: func(c *caseRun) {
			var a fabric.AttemptView
			c.mustDo("/v1/activate", fabric.ActivateRequest{NodeID: node(c)}, &a)
			if err := c.spec.write(a.Root, c.key); err != nil {
				c.t.Fatal(err)
			}
			saw, err := manifest(a.Root)
			if err != nil {
				c.t.Fatal(err)
			}
			c.saw = saw
			c.pre["attempt"], c.pre["root"] = a.AttemptID, a.Root
		},
		request: func(c *caseRun) (string, any) {
			return "/v1/suspend", fabric.SuspendRequest{AttemptID: c.pre["attempt"], KeepRunning: keepRunning}
		},
		classify: func(c *caseRun, before, after *snapshot) (outcome, error) {
			id := c.pre["attempt"]
			a := after.attempts[id]
			base := before.nodes[node(c)]
			mayChange := []string{}
			if draft {
				mayChange = append(mayChange, base.NodeID)
			}
			if err := unchanged("node", before.nodes, after.nodes, mayChange...); err != nil {
				return "", err
			}
			kids := newIDs(before.nodes, after.nodes)
			var sealed *journal.Node
			switch {
			case draft && len(kids) != 0:
				return "", fmt.Errorf("sealing a draft made %d new nodes", len(kids))
			case draft && after.nodes[base.NodeID].Status != journal.NodeDraft:
				n := after.nodes[base.NodeID]
				sealed = &n
			case !draft && len(kids) == 1:
				n := after.nodes[kids[0]]
				if !slices.Equal(n.Parents, []string{base.NodeID}) {
					return "", fmt.Errorf("new node %s has parents %v, want [%s]", n.NodeID, n.Parents, base.NodeID)
				}
				sealed = &n
			case len(kids) > 1:
				return "", fmt.Errorf("%d new nodes, want 0 or 1", len(kids))
			}
			var sealEvents []string
			for _, ev := range after.events {
				if ev.IdempotencyKey == c.key && (ev.Type == "node.sealed" || ev.Type == journal.EventNodeState) {
					sealEvents = append(sealEvents, ev.Type)
				}
			}
			if sealed == nil {
				if draft && after.nodes[base.NodeID].RootID != base.RootID {
					return "", fmt.Errorf("draft %s still a draft but its root changed", base.NodeID)
				}
				if a.ResultNodeID != "" || (a.State != journal.AttemptActive && a.State != journal.AttemptQuiescing) {
					return "", fmt.Errorf("no node sealed, but attempt %s is %s with result %q", id, a.State, a.ResultNodeID)
				}
				if len(sealEvents) != 0 {
					return "", fmt.Errorf("no node sealed, but events %v under the key", sealEvents)
				}
				if _, ok := after.leases[a.LeaseID]; !ok {
					return "", fmt.Errorf("attempt %s is %s without its lease", id, a.State)
				}
				return c.agree(false, after)
			}
			n := *sealed
			if n.Status != journal.NodeSealed || n.RootID == base.RootID || n.Provenance.AttemptID != id || n.GroupID != base.GroupID {
				return "", fmt.Errorf("sealed node %+v: want sealed by %s with a new root", n, id)
			}
			if a.ResultNodeID != n.NodeID {
				return "", fmt.Errorf("node %s sealed but attempt %s names result %q", n.NodeID, id, a.ResultNodeID)
			}
			wantStates := []journal.AttemptState{journal.AttemptSealed, journal.AttemptReleased}
			if keepRunning {
				wantStates = []journal.AttemptState{journal.AttemptActive}
			}
			if !slices.Contains(wantStates, a.State) {
				return "", fmt.Errorf("node %s sealed but attempt %s is %s, want one of %v", n.NodeID, id, a.State, wantStates)
			}
			if len(sealEvents) != 1 {
				return "", fmt.Errorf("one node sealed, but %d seal events under the key", len(sealEvents))
			}
			c.pre["node"], c.pre["root_id"] = n.NodeID, n.RootID
			return c.agree(true, after)
		},
		recovered: func(c *caseRun, o outcome) {
			a := c.inspectAttempt(c.pre["attempt"])
			if o == complete {
				c.checkExport(c.pre["root_id"])
			}
			switch {
			case o == absent || keepRunning:
				if a.State != journal.AttemptActive {
					c.t.Errorf("after a crash that left the seal %s the attempt is %s (%s), want active", o, a.State, a.Error)
					return
				}
				c.checkRootSaw(a)
			default:
				checkReleased(c, a)
			}
		},
		replayed: func(c *caseRun, r *reply) {
			var res fabric.SuspendResult
			if err := json.Unmarshal(r.body, &res); err != nil {
				c.t.Fatalf("replay reply: %v", err)
			}
			if id := c.pre["node"]; id != "" && res.Node.NodeID != id {
				c.t.Errorf("replay returned node %s, the crash committed %s", res.Node.NodeID, id)
			}
			c.checkExport(res.Node.RootID)
			a := c.inspectAttempt(c.pre["attempt"])
			if keepRunning {
				c.checkRootSaw(a)
			} else {
				checkReleased(c, a)
			}
		},
	}
	return spec
}

// checkExport exports a sealed root and compares it with what the attempt
// saw before the seal.
func (c *caseRun) checkExport(rootID string) {
	c.t.Helper()
	c.seq++
	to := filepath.Join(c.dir, fmt.Sprintf("export-%d", c.seq))
	c.mustDo("/v1/export", map[string]string{"id": rootID, "to": to}, nil)
	got, err := manifest(to)
	if err != nil {
		c.t.Fatal(err)
	}
	if d := diffManifests(c.saw, got); d != "" {
		c.t.Errorf("the export of sealed root %s differs from the tree the attempt saw:\n%s", rootID, d)
	}
}

// checkRootSaw asserts a live attempt still shows exactly its delta.
func (c *caseRun) checkRootSaw(a fabric.AttemptView) {
	c.t.Helper()
	checkUsable(c, a, c.pre["root"])
	got, err := manifest(a.Root)
	if err != nil {
		c.t.Errorf("attempt root: %v", err)
		return
	}
	if d := diffManifests(c.saw, got); d != "" {
		c.t.Errorf("attempt %s's root changed across the crash:\n%s", a.AttemptID, d)
	}
}

func checkReleased(c *caseRun, a fabric.AttemptView) {
	c.t.Helper()
	if a.State != journal.AttemptReleased || a.Lease != nil {
		c.t.Errorf("attempt %s is %s with lease %v, want released without one", a.AttemptID, a.State, a.Lease)
	}
	if _, ok := mountedAt(c.pre["root"]); ok {
		c.t.Errorf("released attempt %s is still mounted at %s", a.AttemptID, c.pre["root"])
	}
}

// storeRedoPrefix is the journal prefix of the seals' redo records
// (fabric/storeredo.go).
const storeRedoPrefix = "store-redo/"

// loseUnflushedSealObjects does to the store what a machine crash may do
// to the objects of a one-flush seal, which only their redo records in
// the journal made durable (fabric/storeredo.go) and a SIGKILL leaves
// whole in the page cache: each recorded object loses its link (and its
// redo name under tmp/) or its bytes. Then, with records left, esfd is
// started with a crash armed in Open's replay (every object rewritten,
// no record deleted yet) and must die there; the restart that follows
// must replay them again. The export of the sealed root after the
// restart (recovered, replayed) proves the objects came back.
func loseUnflushedSealObjects(c *caseRun, crash *snapshot) {
	t := c.t
	if len(crash.storeRedo) == 0 {
		return
	}
	store := filepath.Join(c.state, "cas")
	tmp, err := os.ReadDir(filepath.Join(store, "tmp"))
	if err != nil {
		t.Fatal(err)
	}
	i, lost := 0, 0
	for id := range crash.storeRedo {
		for _, e := range tmp {
			if strings.HasPrefix(e.Name(), "pub-"+id) {
				if err := os.Remove(filepath.Join(store, "tmp", e.Name())); err != nil {
					t.Fatal(err)
				}
			}
		}
		p := filepath.Join(store, "objects", id[:2], id[2:])
		if _, err := os.Lstat(p); err != nil {
			continue // never linked: the crash came before the publication
		}
		if i++; i%2 == 1 {
			err = os.Remove(p)
		} else {
			err = os.WriteFile(p, []byte("bytes a machine crash lost"), 0o444)
		}
		if err != nil {
			t.Fatal(err)
		}
		lost++
	}
	t.Logf("%d redo records: %d published objects lost or damaged, tmp/pub- names removed; next start killed in the replay", len(crash.storeRedo), lost)
	d, err := startDaemon(c.state, c.socket, "esfd.open.after-redo-replay=crash@1", c.mode.args(c.prefix))
	if err == nil {
		d.kill()
		t.Fatalf("esfd started with %d redo records past a crash armed in their replay", len(crash.storeRedo))
	}
	if !strings.Contains(err.Error(), "signal: killed") {
		t.Fatalf("esfd with a crash armed in the redo replay: %v, want killed", err)
	}
}
