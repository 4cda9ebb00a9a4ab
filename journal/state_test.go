package journal

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var rewrite = flag.Bool("rewrite", false, "rewrite golden files in testdata/")

// golden compares got with testdata/name, or rewrites it under -rewrite.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *rewrite {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -rewrite to create it)", err)
	}
	if string(want) != got {
		t.Errorf("%s differs from the golden file (run with -rewrite if the change is intended)\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

// table renders a from × to matrix: "ok" where can(from, to), "-" elsewhere.
func table[S ~string](title string, states []S, can func(from, to S) bool) string {
	var b strings.Builder
	line := func(cells ...string) {
		var l strings.Builder
		for _, c := range cells {
			fmt.Fprintf(&l, "%-11s", c)
		}
		b.WriteString(strings.TrimRight(l.String(), " ") + "\n")
	}
	b.WriteString(title + " (row: from, column: to)\n")
	header := []string{""}
	for _, to := range states {
		header = append(header, string(to))
	}
	line(header...)
	for _, from := range states {
		row := []string{string(from)}
		for _, to := range states {
			cell := "-"
			if can(from, to) {
				cell = "ok"
			}
			row = append(row, cell)
		}
		line(row...)
	}
	return b.String()
}

// TestTransitionTables pins both state machines, every pair, to a golden
// file, and checks that Transition agrees with the table it prints.
func TestTransitionTables(t *testing.T) {
	nodeCan := func(from, to NodeStatus) bool {
		n := Node{NodeID: "node_x", Status: from}
		err := n.Transition(to)
		if (err == nil) != from.CanTransition(to) {
			t.Errorf("node %s → %s: Transition says %v, table says %v", from, to, err, from.CanTransition(to))
		}
		if err != nil && (!errors.Is(err, ErrFailedPrecondition) || n.Status != from) {
			t.Errorf("node %s → %s: %v, status now %s; want ErrFailedPrecondition and no change", from, to, err, n.Status)
		}
		return err == nil
	}
	attemptCan := func(from, to AttemptState) bool {
		a := Attempt{AttemptID: "att_x", State: from}
		err := a.Transition(to)
		if (err == nil) != from.CanTransition(to) {
			t.Errorf("attempt %s → %s: Transition says %v, table says %v", from, to, err, from.CanTransition(to))
		}
		if err != nil && (!errors.Is(err, ErrFailedPrecondition) || a.State != from) {
			t.Errorf("attempt %s → %s: %v, state now %s; want ErrFailedPrecondition and no change", from, to, err, a.State)
		}
		return err == nil
	}
	got := table("node status", NodeStatuses, nodeCan) + "\n" + table("attempt state", AttemptStates, attemptCan)
	golden(t, "transitions.golden", got)
}

func TestTransitionUnknownTarget(t *testing.T) {
	n := Node{NodeID: "node_x", Status: NodeDraft}
	if err := n.Transition("zombie"); !errors.Is(err, ErrInvalidArgument) || n.Status != NodeDraft {
		t.Errorf("node → unknown: %v", err)
	}
	a := Attempt{AttemptID: "att_x", State: AttemptQueued}
	if err := a.Transition("zombie"); !errors.Is(err, ErrInvalidArgument) || a.State != AttemptQueued {
		t.Errorf("attempt → unknown: %v", err)
	}
	// A record read with an unknown status can go nowhere.
	odd := Node{NodeID: "node_x", Status: "zombie"}
	if err := odd.Transition(NodePruned); !errors.Is(err, ErrFailedPrecondition) {
		t.Errorf("unknown → pruned: %v", err)
	}
}

func TestAttemptLive(t *testing.T) {
	live := map[AttemptState]bool{AttemptQueued: true, AttemptActive: true, AttemptQuiescing: true}
	for _, s := range AttemptStates {
		if s.Live() != live[s] {
			t.Errorf("%s.Live() = %v", s, s.Live())
		}
		// Final states have no way out but release; released has none.
		if !s.Live() && s != AttemptReleased && !s.CanTransition(AttemptReleased) {
			t.Errorf("%s cannot be released", s)
		}
	}
}
