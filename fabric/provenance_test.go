package fabric

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/esf-dev/esf/journal"
)

// TestFR10_ExportProvenanceValidates: an export's provenance names the
// root, parents, environment, attempt and evaluations, validates against
// the graph and the store, and any changed byte or id is detected.
func TestFR10_ExportProvenanceValidates(t *testing.T) {
	requireMounts(t)
	f := openGraph(t)
	ctx := context.Background()
	g := newGroup(t, f, map[string]string{"src/main.go": "package main", "README": "hi"})
	kid, err := f.Fork(ctx, ForkRequest{NodeID: g.Node.NodeID})
	if err != nil {
		t.Fatal(err)
	}
	a, err := f.Activate(ctx, ActivateRequest{NodeID: kid.Nodes[0].NodeID})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(a.Root, "src/fix.go"), []byte("package main // fixed"), 0o644); err != nil {
		t.Fatal(err)
	}
	sealed, err := f.Suspend(ctx, SuspendRequest{AttemptID: a.AttemptID})
	if err != nil {
		t.Fatal(err)
	}
	ev, _, err := f.store.Put(ctx, strings.NewReader("ok 12 tests"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Evaluate(ctx, EvaluateRequest{Target: sealed.Node.NodeID, Evaluator: "go-test@1.26",
		Reward: 1, Verdict: "pass", Evidence: []string{ev.ID.String()}}); err != nil {
		t.Fatal(err)
	}

	dest := filepath.Join(t.TempDir(), "out")
	res, err := f.Export(ctx, ExportRequest{ID: sealed.Node.NodeID, To: dest})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(dest + ".provenance.json")
	if err != nil {
		t.Fatal(err)
	}
	rec := res.Record
	if rec.RootID != sealed.Node.RootID || rec.NodeID != sealed.Node.NodeID || len(rec.Ancestry) != 1 ||
		rec.Attempt == nil || rec.Attempt.AttemptID != a.AttemptID || rec.Origin.Executor != ExecutorNone ||
		len(rec.Evaluations) != 1 || rec.Evaluations[0].EvaluatorVersion != "1.26" {
		t.Fatalf("record lacks provenance: %+v", rec)
	}
	rep, err := f.VerifyProvenance(ctx, raw)
	if err != nil || !rep.Valid {
		t.Fatalf("fresh record: %+v, %v", rep, err)
	}

	// A changed byte anywhere breaks the MAC.
	tampered := bytes.Replace(raw, []byte(`"pass"`), []byte(`"fail"`), 1)
	if rep, err := f.VerifyProvenance(ctx, tampered); err != nil || rep.Valid {
		t.Fatalf("tampered verdict accepted: %+v %v", rep, err)
	}
	// A changed id with a recomputed MAC (as by someone holding the key)
	// is still caught by the graph and the store.
	forge := func(mutate func(*ProvenanceRecord)) ProvenanceReport {
		t.Helper()
		var r ProvenanceRecord
		if err := json.Unmarshal(raw, &r); err != nil {
			t.Fatal(err)
		}
		mutate(&r)
		r.MAC, _ = f.provenanceMAC(r)
		b, _ := json.Marshal(r)
		rep, err := f.VerifyProvenance(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	for name, mutate := range map[string]func(*ProvenanceRecord){
		"root":     func(r *ProvenanceRecord) { r.RootID = g.Node.RootID },
		"parent":   func(r *ProvenanceRecord) { r.Parents = []string{kid.Nodes[0].NodeID, g.Node.NodeID} },
		"reward":   func(r *ProvenanceRecord) { r.Evaluations[0].Reward = 0.5 },
		"evidence": func(r *ProvenanceRecord) { r.Evaluations[0].Evidence = []string{strings.Repeat("ab", 32)} },
		"attempt":  func(r *ProvenanceRecord) { r.Attempt.Executor = "runc" },
	} {
		if rep := forge(mutate); rep.Valid {
			t.Errorf("forged %s accepted", name)
		}
	}
	if rep := forge(func(*ProvenanceRecord) {}); !rep.Valid {
		t.Errorf("re-MAC'd unchanged record rejected: %+v", rep.Problems)
	}
	if _, err := f.VerifyProvenance(ctx, []byte("{not json")); !errors.Is(err, journal.ErrInvalidArgument) {
		t.Errorf("garbage record: %v", err)
	}
	// An artifact export carries the same provenance with its path.
	art := filepath.Join(t.TempDir(), "art")
	ares, err := f.Export(ctx, ExportRequest{ID: sealed.Node.NodeID, To: art, Artifact: "src"})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(art, "fix.go")); err != nil || string(b) != "package main // fixed" {
		t.Fatalf("artifact export: %q %v", b, err)
	}
	if ares.Record.Export.Artifact != "src" {
		t.Fatalf("artifact record: %+v", ares.Record.Export)
	}
}
