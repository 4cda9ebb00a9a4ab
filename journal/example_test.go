package journal_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/esf-dev/esf/journal"
	"github.com/esf-dev/esf/journal/mem"
)

// A fork as fabric composes it: one idempotent Update that checks the
// parent, writes the child with its indexes, and appends the event.
func ExampleDoIdempotent() {
	ctx := context.Background()
	s := mem.New(mem.Options{})
	defer s.Close()
	root := strings.Repeat("ab", 32)
	_ = s.Update(ctx, func(tx journal.Tx) error {
		if err := journal.CreateGroup(tx, journal.Group{GroupID: "grp_demo", RootNodeID: "node_root", CanonicalNodeID: "node_root", Generation: 1}); err != nil {
			return err
		}
		return journal.CreateNode(tx, journal.Node{NodeID: "node_root", GroupID: "grp_demo", RootID: root, Status: journal.NodeSealed, Provenance: journal.Provenance{Op: "create_group"}})
	})

	type forkRequest struct {
		Parent       string          `json:"parent"`
		LogicalState json.RawMessage `json:"logical_state,omitempty"`
	}
	fork := func(key string, req forkRequest) {
		res, replayed, err := journal.DoIdempotent(ctx, s, key, "fork", req, func(tx journal.Tx) (any, error) {
			p, err := journal.GetNode(tx, req.Parent)
			if err != nil {
				return nil, err
			}
			if p.Status != journal.NodeSealed {
				return nil, fmt.Errorf("fork %s: node is %s: %w", p.NodeID, p.Status, journal.ErrFailedPrecondition)
			}
			child := journal.Node{NodeID: "node_child", GroupID: p.GroupID, Parents: []string{p.NodeID}, RootID: p.RootID,
				LogicalState: req.LogicalState, Status: journal.NodeDraft, Provenance: journal.Provenance{Op: "fork", IdempotencyKey: key}}
			if err := journal.CreateNode(tx, child); err != nil {
				return nil, err
			}
			if err := tx.AppendEvent(child.Event(journal.EventNodeForked)); err != nil {
				return nil, err
			}
			return map[string]string{"node_id": child.NodeID}, nil
		})
		fmt.Printf("result=%s replayed=%v err=%v\n", res, replayed, err)
	}
	fork("k1", forkRequest{Parent: "node_root", LogicalState: json.RawMessage(`{"step": 1}`)})
	fork("k1", forkRequest{Parent: "node_root", LogicalState: json.RawMessage(`{"step":1}`)}) // same request: replay
	fork("k1", forkRequest{Parent: "node_root"})                                              // same key, other request
	fork("k2", forkRequest{Parent: "node_child"})                                             // a draft cannot be forked

	// Output:
	// result={"node_id":"node_child"} replayed=false err=<nil>
	// result={"node_id":"node_child"} replayed=true err=<nil>
	// result= replayed=false err=idempotency key "k1" was first used for a different fork request: conflict
	// result= replayed=false err=fork node_child: node is draft: failed precondition
}
