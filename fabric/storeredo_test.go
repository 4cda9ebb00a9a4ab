package fabric

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/journal"
	fakemounter "github.com/esf-dev/esf/mounter/fake"
)

// openLocal opens a fabric on stateDir with its own stores (pebble and
// cas/local, which share a flush) and the fake mounter.
func openLocal(t *testing.T, stateDir string) *Fabric {
	t.Helper()
	f, err := Open(context.Background(), Options{StateDir: stateDir, Mounter: fakemounter.New()})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// storeRedoRecords reads the journal's redo records: object id -> bytes.
func storeRedoRecords(t *testing.T, f *Fabric) map[cas.ID][]byte {
	t.Helper()
	out := map[cas.ID][]byte{}
	if err := f.journal.View(context.Background(), func(r journal.Reader) error {
		return journal.ScanPrefix(r, []byte(prefixStoreRedo), func(k, v []byte) error {
			name, _, _ := strings.Cut(strings.TrimPrefix(string(k), prefixStoreRedo), "/")
			id, err := cas.ParseID(name)
			if err != nil {
				return err
			}
			out[id] = append([]byte(nil), v...)
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// sealOneChange activates the group's node, writes one file and seals.
func sealOneChange(t *testing.T, f *Fabric, node, name, content string) SuspendResult {
	t.Helper()
	ctx := context.Background()
	a, err := f.Activate(ctx, ActivateRequest{NodeID: node})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(a.Root, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := f.Suspend(ctx, SuspendRequest{AttemptID: a.AttemptID})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func checkExported(t *testing.T, f *Fabric, root string, want map[string]string) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "out")
	if _, _, err := f.ExportDir(context.Background(), root, out); err != nil {
		t.Fatalf("export %s: %v", root, err)
	}
	for p, c := range want {
		if b, err := os.ReadFile(filepath.Join(out, p)); err != nil || string(b) != c {
			t.Errorf("exported %s: %q %v, want %q", p, b, err, c)
		}
	}
}

// TestSealSharesTheJournalFlush: with pebble and the local store, a
// one-file seal commits its new objects' bytes in its journal transaction
// (the records), publishes them before it returns, and a flush of the
// store retires the records.
func TestSealSharesTheJournalFlush(t *testing.T) {
	f := openLocal(t, t.TempDir())
	defer f.Close()
	g := newGroup(t, f, map[string]string{"d/a": "1"})
	res := sealOneChange(t, f, g.Node.NodeID, "new.txt", "one change")
	recs := storeRedoRecords(t, f)
	root, err := cas.ParseID(res.Node.RootID)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := recs[root]; !ok || len(recs) < 2 {
		t.Fatalf("redo records %d, want the new root and blob among them", len(recs))
	}
	for id, data := range recs {
		if cas.Sum(data) != id {
			t.Errorf("record %s holds bytes of %s", id, cas.Sum(data))
		}
		if ok, err := f.local.Has(context.Background(), id); err != nil || !ok {
			t.Errorf("object %s of a committed seal is not published: %v", id, err)
		}
	}
	checkExported(t, f, res.Node.RootID, map[string]string{"d/a": "1", "new.txt": "one change"})
	if err := f.retireStoreRedo(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := len(storeRedoRecords(t, f)); n != 0 {
		t.Errorf("%d redo records after the store's flush, want 0", n)
	}
}

// TestOpenReplaysSealRedoRecords: what a machine crash can do to a seal's
// unflushed objects (links and redo names lost, bytes damaged) is undone by
// the next Open, from the records, before anything reads the store; then
// the records are gone.
func TestOpenReplaysSealRedoRecords(t *testing.T) {
	dir := t.TempDir()
	f := openLocal(t, dir)
	g := newGroup(t, f, map[string]string{"d/a": "1"})
	res := sealOneChange(t, f, g.Node.NodeID, "new.txt", "one change")
	recs := storeRedoRecords(t, f)
	if len(recs) == 0 {
		t.Fatal("no redo records")
	}
	// Close without the retirement, as a crash would.
	f.redo.mu.Lock()
	f.redo.keys, f.redo.bytes = nil, 0
	f.redo.mu.Unlock()
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	s := filepath.Join(dir, "cas")
	tmp, _ := os.ReadDir(filepath.Join(s, "tmp"))
	for _, e := range tmp {
		os.Remove(filepath.Join(s, "tmp", e.Name()))
	}
	i := 0
	for id := range recs {
		p := filepath.Join(s, "objects", id.String()[:2], id.String()[2:])
		if i%2 == 0 {
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
		} else if err := os.WriteFile(p, []byte("damaged"), 0o444); err != nil {
			t.Fatal(err)
		}
		i++
	}

	f = openLocal(t, dir)
	defer f.Close()
	checkExported(t, f, res.Node.RootID, map[string]string{"d/a": "1", "new.txt": "one change"})
	if n := len(storeRedoRecords(t, f)); n != 0 {
		t.Errorf("%d redo records after Open's replay, want 0", n)
	}
}

// TestFailedSealCommitPublishesNothing: a seal whose transaction fails
// leaves neither records nor objects of its deferred batch.
func TestFailedSealCommitPublishesNothing(t *testing.T) {
	f := openLocal(t, t.TempDir())
	defer f.Close()
	g := newGroup(t, f, map[string]string{"a": "1"})
	ctx := context.Background()
	a, err := f.Activate(ctx, ActivateRequest{NodeID: g.Node.NodeID})
	if err != nil {
		t.Fatal(err)
	}
	content := "never committed"
	if err := os.WriteFile(filepath.Join(a.Root, "b"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	_, d := f.sealDeferral(ctx)
	// The batch the seal would defer, then a transaction that fails.
	b := f.store.NewBatch()
	info, _, err := b.Put(ctx, strings.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(cas.WithDeferral(ctx, d.Deferral)); err != nil {
		t.Fatal(err)
	}
	if len(d.Objects()) != 1 {
		t.Fatalf("deferral holds %d objects, want 1", len(d.Objects()))
	}
	f.settleDeferral(ctx, d)
	if ok, _ := f.local.Has(ctx, info.ID); ok {
		t.Error("the object of an uncommitted seal was published")
	}
	if n := len(storeRedoRecords(t, f)); n != 0 {
		t.Errorf("%d redo records", n)
	}
}

// TestUnstoredObjectKeepsItsRecord: an object of a committed seal that
// neither its publication nor the fallback Redo could store keeps its
// record: a retirement (a store flush, or Close) must not delete the only
// copy of its bytes, which the next Open replays.
func TestUnstoredObjectKeepsItsRecord(t *testing.T) {
	state := t.TempDir()
	f := openLocal(t, state)
	ctx := context.Background()
	// Content whose fan-out directory does not exist yet; a file in its
	// place makes both the link and the Redo fail.
	var content string
	var id cas.ID
	for i := 0; ; i++ {
		content = "unstorable " + strconv.Itoa(i)
		id = cas.Sum([]byte(content))
		if _, err := os.Lstat(filepath.Dir(f.local.Path(id))); os.IsNotExist(err) {
			break
		}
	}
	_, d := f.sealDeferral(ctx)
	b := f.store.NewBatch()
	if _, _, err := b.Put(ctx, strings.NewReader(content)); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(cas.WithDeferral(ctx, d.Deferral)); err != nil {
		t.Fatal(err)
	}
	if err := f.journal.Update(ctx, func(tx journal.Tx) error { return putStoreRedo(tx, d) }); err != nil {
		t.Fatal(err)
	}
	fan := filepath.Dir(f.local.Path(id))
	if err := os.WriteFile(fan, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	f.settleDeferral(ctx, d)
	if ok, _ := f.local.Has(ctx, id); ok {
		t.Fatal("the object was stored despite its blocked directory")
	}
	if err := f.retireStoreRedo(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := storeRedoRecords(t, f)[id]; !ok {
		t.Fatal("the record of an object the store lacks was retired")
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(fan); err != nil {
		t.Fatal(err)
	}
	f = openLocal(t, state)
	defer f.Close()
	if ok, err := f.local.Has(ctx, id); !ok || err != nil {
		t.Fatalf("the object after Open's replay: %v %v", ok, err)
	}
}
