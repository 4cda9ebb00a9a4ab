package fusefs

import (
	"strings"
	"testing"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// READDIRPLUS with handle 0, called on the bridge as the kernel would and
// as it never does: a reply too small for one entry makes no node, a
// reply from the middle of a listing makes exactly the nodes it carries,
// and one forget each leaves none; a non-directory lists nothing.
func TestHandlelessReadDirPlusDirect(t *testing.T) {
	store := newCountingStore()
	root, _ := buildDirs(t, store, 1, 1000, true)
	f, err := New(Options{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	w := &handlelessDirs{RawFileSystem: fs.NewNodeFS(f, &fs.Options{FirstAutomaticIno: 1 << 63}), fsys: f}
	w.noOpendir.Store(true)
	lookup := func(parent uint64, name string) uint64 {
		t.Helper()
		var out fuse.EntryOut
		if st := w.Lookup(nil, &fuse.InHeader{NodeId: parent}, name, &out); st != fuse.OK {
			t.Fatalf("lookup %s: %v", name, st)
		}
		return out.NodeId
	}
	id := lookup(lookup(lookup(lookup(1, "roots"), root.String()), "d00"), "sub")
	node := f.GetChild("roots").GetChild(root.String()).GetChild("d00").GetChild("sub")
	read := func(nodeID, off uint64, size int) (uint64, fuse.Status) {
		out := fuse.NewDirEntryList(make([]byte, size), off)
		st := w.ReadDirPlus(nil, &fuse.ReadIn{InHeader: fuse.InHeader{NodeId: nodeID}, Offset: off, Size: uint32(size)}, out)
		return out.Offset - off, st
	}
	if n, st := read(id, 0, 64); st != fuse.OK || n != 0 || len(node.Children()) != 0 {
		t.Errorf("a reply too small for one entry: %v, %d entries, %d nodes made", st, n, len(node.Children()))
	}
	n, st := read(id, 500, 8192)
	if st != fuse.OK || n == 0 {
		t.Fatalf("from the middle: %v, %d entries", st, n)
	}
	kids := node.Children()
	if uint64(len(kids)) != n {
		t.Errorf("%d entries returned, %d nodes made", n, len(kids))
	}
	pad := strings.Repeat("n", 150)
	for i := range n {
		if kids["f"+pad5(500+int(i))+pad] == nil {
			t.Errorf("entry %d after offset 500 not among the nodes made", i)
		}
	}
	if n, st := read(id, 1000, 8192); st != fuse.OK || n != 0 {
		t.Errorf("at the end: %v, %d entries", st, n)
	}
	if n, st := read(id, 1<<40, 8192); st != fuse.OK || n != 0 {
		t.Errorf("past the end: %v, %d entries", st, n)
	}
	// One forget for the listing's lookup and one for ours: no node stays.
	var leaf uint64
	for name := range kids {
		leaf = lookup(id, name)
		w.Forget(leaf, 2)
	}
	if n := len(node.Children()); n != 0 {
		t.Errorf("%d nodes left after every lookup was forgotten", n)
	}
	leaf = lookup(id, "f00007"+pad)
	if n, st := read(leaf, 0, 8192); n != 0 {
		t.Errorf("a file listed %d entries (%v)", n, st)
	}
}
