package ingest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/local"
)

// largeTree writes n files over smallFileMax, each distinct, and returns
// their contents by name.
func largeTree(t *testing.T, root string, n int) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for i := range n {
		b := make([]byte, smallFileMax+1+i*4099)
		rand.NewChaCha8([32]byte{byte(i + 1)}).Read(b)
		name := fmt.Sprintf("f%d.bin", i)
		writeFile(t, filepath.Join(root, name), b, 0o644)
		out[name] = b
	}
	return out
}

// Which road each large file takes shows in the store's counters: hashing
// first asks Has before any Put; streaming Puts without asking. The root
// tree costs one Has and, when new, one Put. One worker keeps the order of
// guesses deterministic.
func TestDirLargeFileGuess(t *testing.T) {
	const n = 3
	root := t.TempDir()
	contents := largeTree(t, root, n)
	ctx := context.Background()
	st := newStore()
	var first Result
	for _, tc := range []struct {
		name       string
		newContent bool
		fresh      bool // into an empty store
		// want store counters
		has, put, created int
	}{
		// Guessing stored, the first file is hashed first and found new;
		// the others stream.
		{name: "FirstImport", fresh: true, has: 1 + 1, put: n + 1, created: n + 1},
		// Everything is stored: every file is hashed first, nothing is put.
		{name: "Reimport", has: n + 1, put: 0, created: 0},
		// Guessing new, the first file is put and found stored (a temp file
		// discarded, no object created); the others are hashed first.
		{name: "ReimportNewContent", newContent: true, has: n - 1 + 1, put: 1, created: 0},
		// Guessing new from the start: no Has for any file.
		{name: "FirstImportNewContent", newContent: true, fresh: true, has: 1, put: n + 1, created: n + 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.fresh {
				st = newStore()
			}
			st.ResetStats()
			res, err := Dir(ctx, st, root, Options{Workers: 1, NewContent: tc.newContent})
			if err != nil {
				t.Fatal(err)
			}
			s := st.Stats()
			if s.Has != tc.has || s.Put != tc.put || s.Created != tc.created {
				t.Fatalf("store saw Has %d, Put %d, Created %d; want %d, %d, %d", s.Has, s.Put, s.Created, tc.has, tc.put, tc.created)
			}
			if int(res.NewObjects) != tc.created {
				t.Fatalf("NewObjects %d, want %d", res.NewObjects, tc.created)
			}
			if first.Root.IsZero() {
				first = res
			} else if res.Root != first.Root {
				t.Fatalf("root %s, first import %s: the road taken changed the tree", res.Root.Short(), first.Root.Short())
			}
			entries := flatten(t, st, res.Root)
			for name, want := range contents {
				e := entries[name]
				if e.ID != cas.Sum(want) || e.Size != int64(len(want)) {
					t.Fatalf("%s: entry %s/%d, want the hash of its %d bytes", name, e.ID.Short(), e.Size, len(want))
				}
				if got := blobOf(t, st, e.ID); string(got) != string(want) {
					t.Fatalf("%s: stored bytes differ", name)
				}
			}
		})
	}
}

// On the disk store, a re-import that guesses wrong discards its temp file:
// no temp file stays, no object is added and the stored copy is the same
// inode, not a rewrite.
func TestDirNewContentReimportKeepsStoredCopy(t *testing.T) {
	noLeaks(t)
	root := t.TempDir()
	contents := largeTree(t, root, 2)
	st, err := local.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	inodes := func() map[cas.ID]uint64 {
		out := map[cas.ID]uint64{}
		for _, b := range contents {
			id := cas.Sum(b)
			var s unix.Stat_t
			if err := unix.Lstat(st.Path(id), &s); err != nil {
				t.Fatalf("object %s: %v", id.Short(), err)
			}
			out[id] = s.Ino
		}
		return out
	}
	first, err := Dir(ctx, st, root, Options{NewContent: true})
	if err != nil {
		t.Fatal(err)
	}
	if first.NewObjects != 3 { // two files and the root tree
		t.Fatalf("first import: %d new objects, want 3", first.NewObjects)
	}
	before := inodes()
	second, err := Dir(ctx, st, root, Options{NewContent: true})
	if err != nil {
		t.Fatal(err)
	}
	if second.Root != first.Root || second.NewObjects != 0 || second.NewBytes != 0 {
		t.Fatalf("re-import: root %s (first %s), %d new objects, %d new bytes", second.Root.Short(), first.Root.Short(), second.NewObjects, second.NewBytes)
	}
	after := inodes()
	for id, ino := range before {
		if after[id] != ino {
			t.Fatalf("object %s was rewritten (inode %d, then %d)", id.Short(), ino, after[id])
		}
	}
	left, err := os.ReadDir(filepath.Join(st.Dir(), "tmp"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range left {
		// A batch's redo records (second links of the objects it
		// published, see cas/local) stay until a later flush.
		if fi, err := e.Info(); err == nil && strings.HasPrefix(e.Name(), "pub-") && fi.Sys().(*syscall.Stat_t).Nlink == 2 {
			continue
		}
		t.Fatalf("temp file %s left by the re-import", e.Name())
	}
}
