package fabric

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/esf-dev/esf/cas/tier"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/internal/etcdtest"
	"github.com/esf-dev/esf/internal/s3test"
	"github.com/esf-dev/esf/internal/testenv"
	"github.com/esf-dev/esf/journal"
	journaletcd "github.com/esf-dev/esf/journal/etcd"
)

// hookedJournal runs after (once armed) before a commit: the moment
// between a write's last store call and its commit.
type hookedJournal struct {
	journal.Store
	mu     sync.Mutex
	before func()
}

func (h *hookedJournal) Update(ctx context.Context, fn func(tx journal.Tx) error) error {
	h.mu.Lock()
	run := h.before
	h.before = nil
	h.mu.Unlock()
	if run != nil {
		run()
	}
	return h.Store.Update(ctx, fn)
}

func (h *hookedJournal) arm(fn func()) {
	h.mu.Lock()
	h.before = fn
	h.mu.Unlock()
}

// openRemoteWorker is openWorker with a remote content store and a clock.
func openRemoteWorker(t *testing.T, c *etcdtest.Cluster, prefix, id string, remote remoteCollectorStore, now func() time.Time) (*Fabric, *hookedJournal) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := journaletcd.Open(ctx, journaletcd.Options{Endpoints: c.Endpoints(), Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	reg, err := s.Register(ctx, journaletcd.Worker{ID: id, Capacity: 8}, 30*time.Second)
	if err != nil {
		s.Close()
		t.Fatal(err)
	}
	hj := &hookedJournal{Store: s}
	f, err := Open(ctx, Options{StateDir: t.TempDir(), JournalStore: hj, Remote: remote, Now: now,
		Cluster: &Cluster{Store: s, Registration: reg, Interval: 50 * time.Millisecond}})
	if err != nil {
		reg.Close()
		s.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.StopAll(context.Background()); err != nil {
			t.Errorf("StopAll %s: %v", id, err)
		}
		reg.Close()
		f.Close()
	})
	return f, hj
}

type remoteCollectorStore interface {
	tier.Remote
	remoteCollector
}

// TestRemoteGCAcrossWorkers: two workers on one etcd journal and one
// bucket; between a write of worker B and its commit, worker A runs
// gc --remote with every key past its grace period, deleting the objects
// B's write found in the bucket (unreferenced until B commits). B's commit
// sees that a collection ran during its write and checks its objects in
// the bucket again:
//   - objects B holds in its cache (it imported them before) are uploaded
//     again and the write commits;
//   - objects B found only in the bucket (its import's dedup against A's
//     copies) are gone: the write fails unavailable, commits nothing, and
//     its retry stores them again.
//
// Either way fsck --remote finds every object B's groups reach in the
// bucket; without the protocol, B would commit groups naming deleted
// objects.
func TestRemoteGCAcrossWorkers(t *testing.T) {
	testenv.Require(t, "s3")
	ctx := context.Background()
	c := etcdtest.Start(t, etcdtest.Options{NoFsync: true})
	srv := s3test.Start(t)
	bucket := srv.Bucket(t)
	prefix := fmt.Sprintf("fab/%d", clusterPrefixes.Add(1))
	later := func() time.Time { return time.Now().Add(2 * time.Hour) } // every key is past the grace
	a, _ := openRemoteWorker(t, c, prefix, "wa", remoteStore(t, srv, bucket), later)
	b, hooked := openRemoteWorker(t, c, prefix, "wb", remoteStore(t, srv, bucket), nil)
	tree := func(seed byte) string {
		src := t.TempDir()
		for i := range 5 {
			os.WriteFile(filepath.Join(src, fmt.Sprintf("f%d", i)), bytes.Repeat([]byte{seed + byte(i)}, 1000*(i+1)), 0o644)
		}
		os.WriteFile(filepath.Join(src, "big"), bytes.Repeat([]byte{seed}, 300<<10), 0o644) // loose, not packed
		return src
	}
	var collected CollectReport
	var gcErr error
	collectBeforeCommit := func() {
		hooked.arm(func() {
			collected, gcErr = a.Collect(ctx, CollectRequest{Remote: true, RemoteGraceSeconds: 1})
		})
	}
	checkCollected := func() {
		t.Helper()
		if gcErr != nil {
			t.Fatalf("A's gc --remote: %v", gcErr)
		}
		if collected.Deleted < 7 { // five small blobs, the big one, the root tree
			t.Fatalf("A's gc --remote deleted %d objects, want the 7 of the unreferenced import: %+v", collected.Deleted, collected.Remote)
		}
	}
	checkBucket := func() {
		t.Helper()
		fr, err := b.FsckRemote(ctx)
		if err != nil || len(fr.Missing) != 0 || len(fr.Bad) != 0 {
			t.Fatalf("fsck --remote: %+v, %v", fr, err)
		}
	}

	// In B's cache: uploaded again, committed.
	cached := tree('a')
	if _, err := b.Import(ctx, ImportSource{Path: cached}); err != nil {
		t.Fatal(err)
	}
	collectBeforeCommit()
	if _, err := b.CreateGroupFrom(ctx, ImportSource{Path: cached}, CreateGroupRequest{}); err != nil {
		t.Fatalf("B's group create of cached content, collected before its commit: %v", err)
	}
	checkCollected()
	checkBucket()
	if n := b.rgc.rechecked.Load(); n < 7 {
		t.Fatalf("B checked %d objects again after the collection, want its 7", n)
	}

	// Only in the bucket: refused, then stored again by the retry.
	remote := tree('k')
	if _, err := a.Import(ctx, ImportSource{Path: remote}); err != nil {
		t.Fatal(err)
	}
	collectBeforeCommit()
	if _, err := b.CreateGroupFrom(ctx, ImportSource{Path: remote}, CreateGroupRequest{}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("B's group create of content it found in the bucket, collected before its commit: %v, want unavailable", err)
	}
	checkCollected()
	checkBucket()
	before := b.rgc.rechecked.Load()
	if _, err := b.CreateGroupFrom(ctx, ImportSource{Path: remote}, CreateGroupRequest{}); err != nil {
		t.Fatalf("the retry: %v", err)
	}
	checkBucket()
	// No collection overlapped the retry: it checked nothing again.
	if n := b.rgc.rechecked.Load(); n != before {
		t.Fatalf("a write after the collections checked %d objects again", n-before)
	}
}

// TestRemoteGCWritersWait: while the record says a live worker's
// collection runs, a write session's commit on another worker waits; once
// it ends, the write checks its objects again and commits. A fork (no
// content stored or found) does not wait.
func TestRemoteGCWritersWait(t *testing.T) {
	testenv.Require(t, "s3")
	ctx := context.Background()
	c := etcdtest.Start(t, etcdtest.Options{NoFsync: true})
	srv := s3test.Start(t)
	bucket := srv.Bucket(t)
	prefix := fmt.Sprintf("fab/%d", clusterPrefixes.Add(1))
	a, _ := openRemoteWorker(t, c, prefix, "wa", remoteStore(t, srv, bucket), nil)
	b, _ := openRemoteWorker(t, c, prefix, "wb", remoteStore(t, srv, bucket), nil)
	g := newGroup(t, b, map[string]string{"x": "x"})

	// A "runs" a collection: the record as beginRemoteGC writes it.
	st, err := a.beginRemoteGC(ctx)
	if err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "during"), []byte("written during a collection"), 0o644)
	done := make(chan error, 1)
	go func() {
		_, err := b.CreateGroupFrom(ctx, ImportSource{Path: src}, CreateGroupRequest{})
		done <- err
	}()
	waitFor(t, "B's commit to see the running collection", func() bool {
		b.rgc.mu.Lock()
		defer b.rgc.mu.Unlock()
		return b.rgc.seen.Gen == st.Gen && b.rgc.seen.Active
	})
	if _, err := b.Fork(ctx, ForkRequest{NodeID: g.Node.NodeID, N: 1}); err != nil {
		t.Fatalf("a fork during the collection: %v", err)
	}
	select {
	case err := <-done:
		t.Fatalf("B's write committed while A's collection ran: %v", err)
	default:
	}
	before := b.rgc.rechecked.Load()
	if err := a.endRemoteGC(ctx, st); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("B's write after the collection: %v", err)
	}
	if b.rgc.rechecked.Load() == before {
		t.Fatal("B's write did not check its objects again after the collection")
	}
	fr, err := b.FsckRemote(ctx)
	if err != nil || len(fr.Missing) != 0 || len(fr.Bad) != 0 {
		t.Fatalf("fsck --remote: %+v, %v", fr, err)
	}
}
