package tier

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/esf-dev/esf/cas"
)

// TestQueueDropsUnfinishedAdds: an add that never returned leaves at most
// a hidden temporary behind (internal/atomicfile's, or the ".tmp-" one of
// earlier versions); reopening the queue removes it and keeps every entry
// whose add returned.
func TestQueueDropsUnfinishedAdds(t *testing.T) {
	dir := t.TempDir()
	q, err := openQueue(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.add([]cas.ID{cas.Sum([]byte("a")), cas.Sum([]byte("b"))}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{".00000000000000000001-1-1.tmp-123", ".tmp-00000000000000000002-1-2"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("not an id\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	q, err = openQueue(dir)
	if err != nil {
		t.Fatalf("reopen with unfinished adds: %v", err)
	}
	if st := q.status(); st.Files != 1 {
		t.Errorf("reopened queue holds %d files, want the one add that returned", st.Files)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("queue directory holds %q, want one file", names)
	}
}
