package journal_test

import (
	"context"
	"errors"
	"testing"

	"github.com/esf-dev/esf/journal"
	"github.com/esf-dev/esf/journal/mem"
)

// TestGroupNames: a name is unique, found by GroupByName, never changes,
// and is never shaped like an id.
func TestGroupNames(t *testing.T) {
	ctx := context.Background()
	s := mem.New(mem.Options{})
	defer s.Close()
	create := func(gid, node, name string) error {
		return s.Update(ctx, func(tx journal.Tx) error {
			return journal.CreateGroup(tx, journal.Group{GroupID: gid, RootNodeID: node, CanonicalNodeID: node, Generation: 1, Name: name})
		})
	}
	if err := create("grp_a", "node_a", "base-image.v1"); err != nil {
		t.Fatal(err)
	}
	if err := create("grp_b", "node_b", "base-image.v1"); !errors.Is(err, journal.ErrExists) {
		t.Fatalf("a taken name: %v", err)
	}
	if err := create("grp_c", "node_c", ""); err != nil {
		t.Fatalf("no name: %v", err)
	}
	for _, bad := range []string{"node_x", "grp_1", "-x", "a b", "a/b", string(make([]byte, 129))} {
		if err := journal.CheckGroupName(bad); !errors.Is(err, journal.ErrInvalidArgument) {
			t.Errorf("name %q: %v", bad, err)
		}
	}
	s.View(ctx, func(r journal.Reader) error {
		g, err := journal.GroupByName(r, "base-image.v1")
		if err != nil || g.GroupID != "grp_a" {
			t.Fatalf("by name: %+v %v", g, err)
		}
		if _, err := journal.GroupByName(r, "other"); !errors.Is(err, journal.ErrNotFound) {
			t.Fatalf("an unknown name: %v", err)
		}
		return nil
	})
	err := s.Update(ctx, func(tx journal.Tx) error {
		g, _ := journal.GetGroup(tx, "grp_a")
		g.Name = "renamed"
		return journal.UpdateGroup(tx, g)
	})
	if !errors.Is(err, journal.ErrInvalidArgument) {
		t.Fatalf("rename: %v", err)
	}
}
