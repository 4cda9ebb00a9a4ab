package fabric

import (
	"context"
	"errors"
	"testing"

	"github.com/esf-dev/esf/journal"
)

// TestFrontRecords: a front door's records are put, listed in id order
// (its own only), replaced, deleted, and survive the fabric's restart;
// malformed names are refused.
func TestFrontRecords(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	f, err := Open(ctx, testOptions(t, Options{StateDir: dir}))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct{ door, id, v string }{{"e2b", "b", "2"}, {"e2b", "a", "1"}, {"other", "a", "x"}, {"e2b", "b", "3"}} {
		if err := f.PutFrontRecord(ctx, r.door, r.id, []byte(r.v)); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.DeleteFrontRecord(ctx, "e2b", "missing"); err != nil {
		t.Fatalf("delete a missing record: %v", err)
	}
	for _, bad := range [][2]string{{"", "a"}, {"e2b", ""}, {"e2b", "a/b"}, {"e/2b", "a"}} {
		if err := f.PutFrontRecord(ctx, bad[0], bad[1], nil); !errors.Is(err, journal.ErrInvalidArgument) {
			t.Fatalf("put %q: %v", bad, err)
		}
	}
	f.StopAll(ctx)
	f.Close()
	if f, err = Open(ctx, testOptions(t, Options{StateDir: dir})); err != nil {
		t.Fatal(err)
	}
	defer func() {
		f.StopAll(ctx)
		f.Close()
	}()
	list := func() string {
		t.Helper()
		var got string
		if err := f.FrontRecords(ctx, "e2b", func(id string, v []byte) error {
			got += id + "=" + string(v) + ";"
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := list(); got != "a=1;b=3;" {
		t.Fatalf("records after a restart: %q", got)
	}
	if err := f.DeleteFrontRecord(ctx, "e2b", "a"); err != nil {
		t.Fatal(err)
	}
	if got := list(); got != "b=3;" {
		t.Fatalf("after a delete: %q", got)
	}
}
