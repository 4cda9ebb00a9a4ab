package crashtest

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/esf-dev/esf/journal"
	jpebble "github.com/esf-dev/esf/journal/pebble"
)

// TestAuditCatchesPartialBatches proves the harness's journal audit can
// fail: each case writes a consistent graph, then removes one piece of a
// batch (a record, an index key, an event) or adds a stray one, as a torn
// commit would, and the audit must name the damage. It needs no root.
func TestAuditCatchesPartialBatches(t *testing.T) {
	const root = "0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f"
	ids := journal.NewIDGen(nil, nil)
	id := func(k journal.Kind) string {
		s, err := ids.New(k)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	g, r, kid, att, lease := id(journal.KindGroup), id(journal.KindNode), id(journal.KindNode), id(journal.KindAttempt), id(journal.KindLease)

	// consistent writes a group with a root node, one forked draft and an
	// active attempt with its lease, each with its events, as fabric does.
	consistent := func(tx journal.Tx) error {
		grp := journal.Group{GroupID: g, RootNodeID: r, CanonicalNodeID: r, Generation: 1}
		rn := journal.Node{NodeID: r, GroupID: g, RootID: root, Status: journal.NodeSealed, Provenance: journal.Provenance{Op: "create_group"}}
		kn := journal.Node{NodeID: kid, GroupID: g, Parents: []string{r}, RootID: root, Status: journal.NodeDraft, Provenance: journal.Provenance{Op: "fork"}}
		a := journal.Attempt{AttemptID: att, NodeID: kid, GroupID: g, Executor: "none", LeaseID: lease, State: journal.AttemptActive}
		l := journal.Lease{LeaseID: lease, AttemptID: att, NodeID: kid, GroupID: g, Token: 1, TTLMillis: 60000, ExpiresAt: tx.Now().Add(60000 * 1e6)}
		tok, err := journal.NextFencingToken(tx)
		if err != nil || tok != 1 {
			return err
		}
		for _, step := range []func() error{
			func() error { return journal.CreateGroup(tx, grp) },
			func() error { return journal.CreateNode(tx, rn) },
			func() error { return journal.CreateNode(tx, kn) },
			func() error { return journal.CreateAttempt(tx, a) },
			func() error { return journal.CreateLease(tx, l) },
		} {
			if err := step(); err != nil {
				return err
			}
		}
		for _, ev := range []journal.Event{
			grp.Event(journal.EventGroupCreated), rn.Event(journal.EventNodeCreated), kn.Event(journal.EventNodeForked),
			a.Event(journal.EventAttemptCreated), l.Event(journal.EventLeaseAcquired),
		} {
			if err := tx.AppendEvent(ev); err != nil {
				return err
			}
		}
		return nil
	}
	tests := []struct {
		name   string
		damage func(tx journal.Tx) error
		want   string // a fragment of the complaint; "" for none
	}{
		{"consistent", nil, ""},
		{"node without its group index", func(tx journal.Tx) error {
			return tx.Delete([]byte(idx("group-nodes", g, kid)))
		}, "index key idx/group-nodes/"},
		{"child index of a missing node", func(tx journal.Tx) error {
			return tx.Put([]byte(idx("children", r, id(journal.KindNode))), nil)
		}, "child missing"},
		{"lease without its attempt's state", func(tx journal.Tx) error {
			a, err := journal.GetAttempt(tx, att)
			if err != nil {
				return err
			}
			a.State = journal.AttemptReleased
			return journal.UpdateAttempt(tx, a)
		}, "is released but its lease"},
		{"attempt without its lease", func(tx journal.Tx) error { return journal.DeleteLease(tx, lease) }, "without its lease"},
		{"state change without its event", func(tx journal.Tx) error {
			n, err := journal.GetNode(tx, kid)
			if err != nil {
				return err
			}
			n.Status = journal.NodePruned
			return journal.UpdateNode(tx, n)
		}, "but its events leave it draft"},
		{"event of an uncommitted node", func(tx journal.Tx) error {
			return tx.AppendEvent(journal.Event{Type: journal.EventNodeForked, GroupID: g, NodeID: id(journal.KindNode)})
		}, "names missing node"},
		{"backprop without its event", func(tx journal.Tx) error {
			n, err := journal.GetNode(tx, r)
			if err != nil {
				return err
			}
			n.Visits++
			return journal.UpdateNode(tx, n)
		}, "1 visits and 0 backprop events"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			state := t.TempDir()
			s, err := jpebble.Open(filepath.Join(state, "journal"), jpebble.Options{})
			if err != nil {
				t.Fatal(err)
			}
			err = s.Update(context.Background(), func(tx journal.Tx) error {
				if err := consistent(tx); err != nil {
					return err
				}
				if tt.damage != nil {
					return tt.damage(tx)
				}
				return nil
			})
			if cerr := s.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				t.Fatal(err)
			}
			snap, err := readJournal(state, filepath.Join(t.TempDir(), "copy"))
			if err != nil {
				t.Fatal(err)
			}
			bad := strings.Join(snap.audit(), "\n")
			switch {
			case tt.want == "" && bad != "":
				t.Errorf("a consistent journal fails the audit:\n%s", bad)
			case tt.want != "" && !strings.Contains(bad, tt.want):
				t.Errorf("audit missed the damage (want %q), said:\n%s", tt.want, bad)
			}
		})
	}
}
