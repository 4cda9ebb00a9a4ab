package tier_test

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/local"
	"github.com/esf-dev/esf/cas/tier"
	"github.com/esf-dev/esf/internal/s3test"
)

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Async durability: with the remote refusing uploads, writes are still
// acknowledged (queued durably); the queue survives the tier's end, and a
// new tier on the same cache and queue uploads everything once the remote
// takes it.
func TestAsyncQueueSurvivesRestart(t *testing.T) {
	ctx := context.Background()
	srv := s3test.Start(t)
	e := newEnv(t, srv, "")
	p := s3test.StartProxy(t, srv)
	dir := t.TempDir()
	qdir := filepath.Join(dir, "queue")
	open := func() *tier.Store {
		l, err := local.Open(filepath.Join(dir, "cas"), nil)
		if err != nil {
			t.Fatal(err)
		}
		ts, err := tier.New(tier.Options{Local: l, Remote: e.store(t, p.Endpoint), QueueDir: qdir})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ts.Close() })
		return ts
	}
	p.Set(always(http.MethodPut, s3test.Fault{Kind: s3test.Status, Status: 503}))
	a := open()
	var ids []cas.ID
	b := a.NewBatch()
	for i := range 20 {
		blob := bytes.Repeat([]byte{byte(i)}, 1000+i)
		info, _, err := b.Put(ctx, bytes.NewReader(blob))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, info.ID)
	}
	if err := b.Commit(ctx); err != nil {
		t.Fatalf("async commit with the remote refusing uploads: %v", err)
	}
	big := bytes.Repeat([]byte("big"), 200<<10)
	if _, _, err := a.Put(ctx, bytes.NewReader(big)); err != nil {
		t.Fatal(err)
	}
	ids = append(ids, cas.Sum(big))
	if st := a.QueueStatus(); st.Objects != len(ids) || st.Files != 2 {
		t.Fatalf("queue = %+v, want %d objects in 2 files", st, len(ids))
	}
	waitFor(t, "a failed upload", func() bool { return a.QueueStatus().LastError != "" })
	a.Close()
	for _, id := range ids {
		if ok, _ := e.remote.Has(ctx, id); ok {
			t.Fatalf("object %s reached the remote through a proxy refusing uploads", id.Short())
		}
	}
	if ents, _ := os.ReadDir(qdir); len(ents) != 2 {
		t.Fatalf("queue dir holds %d files after the tier closed, want 2", len(ents))
	}

	p.Set(nil)
	b2 := open()
	waitFor(t, "the queue to drain", func() bool { return b2.QueueStatus().Objects == 0 })
	for _, id := range ids {
		if ok, err := e.remote.Has(ctx, id); !ok || err != nil {
			t.Fatalf("queued object %s not in the remote after the restart: %v", id.Short(), err)
		}
	}
	if ents, _ := os.ReadDir(qdir); len(ents) != 0 {
		t.Fatalf("queue dir holds %d files after draining", len(ents))
	}
}
