package fabric

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/zeebo/blake3"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/internal/atomicfile"
	"github.com/esf-dev/esf/journal"
)

// Provenance (FR-10): every export can carry a record of where its content
// came from: the root, the node and its ancestry, the environment (source,
// executor, attempt), the group policy, and every evaluation with its
// evaluator version and evidence. Each id in it can be checked against the
// graph and the store (VerifyProvenance), and the record carries a MAC
// keyed by this daemon, so a changed byte is detected even where the graph
// cannot tell (for example a reworded verdict of a record whose node was
// pruned since).

// ProvenanceVersion is the version of the record format.
const ProvenanceVersion = 1

// ProvenanceRecord describes one export.
type ProvenanceRecord struct {
	Version     int                  `json:"version"`
	RootID      string               `json:"root_id"`
	NodeID      string               `json:"node_id,omitempty"`
	GroupID     string               `json:"group_id,omitempty"`
	Parents     []string             `json:"parents,omitempty"`
	Ancestry    []string             `json:"ancestry,omitempty"`
	Origin      *journal.Provenance  `json:"origin,omitempty"` // how the node came to be
	Policy      json.RawMessage      `json:"policy,omitempty"`
	Attempt     *journal.Attempt     `json:"attempt,omitempty"` // the attempt that sealed it
	Evaluations []journal.Evaluation `json:"evaluations,omitempty"`
	Export      ExportInfo           `json:"export"`
	// MAC is hex keyed-BLAKE3 over the record's canonical JSON without it.
	MAC string `json:"mac"`
}

// ExportInfo says what an export produced.
type ExportInfo struct {
	Format      string    `json:"format"` // dir, tar, patch
	Base        string    `json:"base,omitempty"`
	Artifact    string    `json:"artifact,omitempty"`
	Destination string    `json:"destination,omitempty"`
	ExportedAt  time.Time `json:"exported_at"`
}

// Provenance builds the record for an export of id (a node id, or a bare
// root id, whose record then holds the root alone).
func (f *Fabric) Provenance(ctx context.Context, id string, info ExportInfo) (ProvenanceRecord, error) {
	root, err := f.resolveRoot(ctx, id)
	if err != nil {
		return ProvenanceRecord{}, fmt.Errorf("provenance: %w", err)
	}
	if info.ExportedAt.IsZero() {
		info.ExportedAt = f.now().UTC()
	}
	rec := ProvenanceRecord{Version: ProvenanceVersion, RootID: root.String(), Export: info}
	if kind, err := journal.KindOf(id); err == nil && kind == journal.KindNode {
		if err := f.journal.View(ctx, func(r journal.Reader) error { return fillProvenance(r, id, &rec) }); err != nil {
			return ProvenanceRecord{}, fmt.Errorf("provenance: %w", err)
		}
	}
	rec.MAC, err = f.provenanceMAC(rec)
	return rec, err
}

func fillProvenance(r journal.Reader, nodeID string, rec *ProvenanceRecord) error {
	n, err := journal.GetNode(r, nodeID)
	if err != nil {
		return err
	}
	g, err := journal.GetGroup(r, n.GroupID)
	if err != nil {
		return err
	}
	rec.NodeID, rec.GroupID, rec.Parents, rec.Policy = n.NodeID, n.GroupID, n.Parents, g.Policy
	origin := n.Provenance
	rec.Origin = &origin
	if err := journal.Ancestors(r, nodeID, func(a journal.Node) error {
		rec.Ancestry = append(rec.Ancestry, a.NodeID)
		return nil
	}); err != nil {
		return err
	}
	if origin.AttemptID != "" {
		a, err := journal.GetAttempt(r, origin.AttemptID)
		if err != nil {
			return err
		}
		rec.Attempt = &a
	}
	evals, err := journal.EvaluationsOfNode(r, nodeID)
	if err != nil {
		return err
	}
	for _, id := range evals {
		e, err := journal.GetEvaluation(r, id)
		if err != nil {
			return err
		}
		rec.Evaluations = append(rec.Evaluations, e)
	}
	return nil
}

func (f *Fabric) provenanceMAC(rec ProvenanceRecord) (string, error) {
	rec.MAC = ""
	b, err := journal.CanonicalJSON(rec)
	if err != nil {
		return "", err
	}
	h, err := blake3.NewKeyed(f.provKey)
	if err != nil {
		return "", err
	}
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil)), nil
}

// ProvenanceProblem is one failed check of a record.
type ProvenanceProblem struct {
	Field   string `json:"field"`
	Problem string `json:"problem"`
}

// ProvenanceReport is the outcome of VerifyProvenance.
type ProvenanceReport struct {
	Valid    bool                `json:"valid"`
	Checked  int                 `json:"checked"` // ids checked against the graph and the store
	Problems []ProvenanceProblem `json:"problems,omitempty"`
}

// VerifyProvenance checks a record: its MAC, that every tree of the root is
// stored and intact, and that every id it names exists in the graph with
// the values the record states (node, parents, ancestry, attempt,
// evaluations, evidence). Problems are reported, not returned as errors; a
// record that does not parse is invalid_argument.
func (f *Fabric) VerifyProvenance(ctx context.Context, raw []byte) (ProvenanceReport, error) {
	var rec ProvenanceRecord
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rec); err != nil {
		return ProvenanceReport{}, fmt.Errorf("provenance record: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	rep := ProvenanceReport{}
	bad := func(field, format string, args ...any) {
		rep.Problems = append(rep.Problems, ProvenanceProblem{Field: field, Problem: fmt.Sprintf(format, args...)})
	}
	if rec.Version != ProvenanceVersion {
		bad("version", "version %d, want %d", rec.Version, ProvenanceVersion)
	}
	if mac, err := f.provenanceMAC(rec); err != nil || !hmac.Equal([]byte(mac), []byte(rec.MAC)) {
		bad("mac", "does not match the record: it was changed after this daemon wrote it (or another daemon wrote it)")
	}
	root, err := cas.ParseID(rec.RootID)
	if err != nil {
		bad("root_id", "%v", err)
	} else {
		rep.Checked++
		if err := verifyTrees(ctx, f.store, root); err != nil {
			bad("root_id", "%v", err)
		}
	}
	if rec.NodeID != "" {
		var want ProvenanceRecord
		err := f.journal.View(ctx, func(r journal.Reader) error { return fillProvenance(r, rec.NodeID, &want) })
		rep.Checked++
		switch {
		case err != nil:
			bad("node_id", "%v", err)
		default:
			if want.GroupID != rec.GroupID {
				bad("group_id", "graph says %s", want.GroupID)
			}
			if n, _ := f.nodeRoot(ctx, rec.NodeID); n != rec.RootID {
				bad("root_id", "node %s has root %s", rec.NodeID, n)
			}
			if !slices.Equal(want.Parents, rec.Parents) {
				bad("parents", "graph says %v", want.Parents)
			}
			if !slices.Equal(want.Ancestry, rec.Ancestry) {
				bad("ancestry", "graph says %v", want.Ancestry)
			}
			rep.Checked += len(rec.Parents) + len(rec.Ancestry)
			if !jsonEqual(want.Origin, rec.Origin) {
				bad("origin", "differs from the node's provenance")
			}
			if !jsonEqual(want.Policy, rec.Policy) {
				bad("policy", "differs from the group's policy")
			}
			if !jsonEqual(want.Attempt, rec.Attempt) {
				bad("attempt", "differs from the attempt record")
			}
			if !jsonEqual(want.Evaluations, rec.Evaluations) {
				bad("evaluations", "differ from the graph's evaluations of the node")
			}
		}
	}
	for i, e := range rec.Evaluations {
		for _, ev := range e.Evidence {
			rep.Checked++
			id, err := cas.ParseID(ev)
			if err == nil {
				_, err = cas.ReadAll(ctx, f.store, id)
			}
			if err != nil {
				bad(fmt.Sprintf("evaluations[%d].evidence", i), "%s: %v", ev, err)
			}
		}
	}
	rep.Valid = len(rep.Problems) == 0
	return rep, nil
}

func (f *Fabric) nodeRoot(ctx context.Context, nodeID string) (string, error) {
	var root string
	err := f.journal.View(ctx, func(r journal.Reader) error {
		n, err := journal.GetNode(r, nodeID)
		root = n.RootID
		return err
	})
	return root, err
}

// verifyTrees reads and verifies every tree under root and checks that
// every blob is stored (blobs are hashed by fsck, not here). Every object
// goes through Has first, which the GC tracker records: inside a session
// the walk also protects the whole tree from a running collection.
func verifyTrees(ctx context.Context, s cas.Store, root cas.ID) error {
	seen := map[cas.ID]bool{}
	var walk func(id cas.ID) error
	walk = func(id cas.ID) error {
		if seen[id] {
			return nil
		}
		seen[id] = true
		if ok, err := s.Has(ctx, id); err != nil || !ok {
			return fmt.Errorf("tree %s: %w", id, orNotFound(err))
		}
		// Scanned, not held: a directory of a million entries would
		// otherwise hold its tree (tens of megabytes) for the walk.
		var dirs []cas.ID
		err := cas.ScanTree(ctx, s, id, nil, func(e *cas.Entry) error {
			switch e.Type {
			case cas.TypeDir:
				dirs = append(dirs, e.ID)
			case cas.TypeFile:
				if ok, err := s.Has(ctx, e.ID); err != nil || !ok {
					return fmt.Errorf("blob %s of %s: %w", e.ID, e.Name, orNotFound(err))
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, d := range dirs {
			if err := walk(d); err != nil {
				return err
			}
		}
		return nil
	}
	return walk(root)
}

func jsonEqual(a, b any) bool {
	ja, err1 := journal.CanonicalJSON(a)
	jb, err2 := journal.CanonicalJSON(b)
	return err1 == nil && err2 == nil && bytes.Equal(ja, jb)
}

// provKeySize is the length of the provenance key (an HMAC-SHA256 key).
const provKeySize = 32

// loadKey reads the daemon's provenance key, creating it on first use
// (atomically and durably: a crash leaves no key or the whole key). A key
// file of any other length is corrupt and is never replaced: a new key
// would silently stop every earlier provenance record from verifying.
func loadKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	switch {
	case err == nil && len(b) == provKeySize:
		return b, nil
	case err == nil:
		return nil, fmt.Errorf("provenance key %s: %d bytes, want %d (restore it from a backup; a new key would unverify every earlier record): %w",
			path, len(b), provKeySize, errdefs.ErrCorrupt)
	case !errors.Is(err, os.ErrNotExist):
		return nil, err
	}
	key := make([]byte, provKeySize)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	if err := atomicfile.WriteFile(path, key, 0o600); err != nil {
		return nil, fmt.Errorf("provenance key: %w", err)
	}
	return key, nil
}
