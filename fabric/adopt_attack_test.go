package fabric

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
)

// TestSealAdoptedObjectNotOwnedByWriter: a large file that a host user
// owns in an attempt's root becomes, by adoption, an inode of the store.
// The store's directories are world-searchable, so if the object kept the
// user's ownership, the user could chmod it writable and change the bytes
// of every tree that shares the object. The object must be the store's.
func TestSealAdoptedObjectNotOwnedByWriter(t *testing.T) {
	f, _ := openCounted(t)
	ctx := context.Background()
	g := newGroup(t, f, map[string]string{"a": "1"})
	a, big, p := activateBig(t, f, g.Node.NodeID, 11, 0o644)
	if err := os.Chown(p, 1234, 5678); err != nil {
		t.Fatal(err)
	}
	was := inode(t, upperPath(f, a.AttemptID, "big.bin"))
	if _, err := f.Suspend(ctx, SuspendRequest{AttemptID: a.AttemptID}); err != nil {
		t.Fatal(err)
	}
	obj := inode(t, f.local.Path(cas.Sum(big)))
	if obj.Ino != was.Ino {
		t.Skip("not adopted: nothing to prove")
	}
	if int(obj.Uid) != os.Geteuid() || int(obj.Gid) != os.Getegid() {
		t.Errorf("adopted object owned by %d:%d (the writer's), want the store's %d:%d: the writer can make it writable",
			obj.Uid, obj.Gid, os.Geteuid(), os.Getegid())
	}
}

// TestSealAdoptMappedWriter: a process that mapped a file of the root
// shared and writable, then closed it, does not keep the root busy, so the
// seal's unmount succeeds; if the seal then adopted that file, the
// process's writes through its mapping would change the stored object.
func TestSealAdoptMappedWriter(t *testing.T) {
	f, _ := openCounted(t)
	ctx := context.Background()
	g := newGroup(t, f, map[string]string{"a": "1"})
	a, big, p := activateBig(t, f, g.Node.NodeID, 12, 0o644)
	fd, err := unix.Open(p, unix.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(fd, 0, len(big), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	unix.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(m) })
	// The mapping keeps the root busy: the seal copies, and its release
	// after the commit may fail; either way the object must stay whole.
	if _, err := f.Suspend(ctx, SuspendRequest{AttemptID: a.AttemptID}); err != nil {
		t.Logf("suspend with a mapped file: %v", err)
	}
	id := cas.Sum(big)
	copy(m, "changed after the seal")
	if err := unix.Msync(m, unix.MS_SYNC); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(f.local.Path(id))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, big) {
		t.Fatalf("object %s changed after the seal by a writer's mapping: it holds bytes that do not hash to its id", id)
	}
}

// TestSealAdoptBindMountWriter: a descriptor open for writing through
// another mount of the attempt's overlay (a bind mount; a mount namespace's
// copy is the same) does not keep the root busy, so the seal's unmount
// succeeds; the file must then be copied, not adopted, or the writer
// changes the stored object after it was hashed.
func TestSealAdoptBindMountWriter(t *testing.T) {
	f, _ := openCounted(t)
	ctx := context.Background()
	g := newGroup(t, f, map[string]string{"a": "1"})
	a, big, _ := activateBig(t, f, g.Node.NodeID, 13, 0o644)
	bind := t.TempDir()
	if err := unix.Mount(a.Root, bind, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(filepath.Join(bind, "big.bin"), unix.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd); unix.Unmount(bind, unix.MNT_DETACH) })
	if _, err := f.Suspend(ctx, SuspendRequest{AttemptID: a.AttemptID}); err != nil {
		t.Logf("suspend: %v", err)
	}
	id := cas.Sum(big)
	if _, err := unix.Pwrite(fd, []byte("changed after the seal"), 0); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(f.local.Path(id))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, big) {
		t.Fatalf("object %s changed after the seal through a bind mount's open fd", id)
	}
}
