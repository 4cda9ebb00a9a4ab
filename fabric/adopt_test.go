package fabric

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/journal"
)

// bigContent is 3 MiB of random bytes: a file the seal streams (over 1 MiB).
func bigContent(seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, 3<<20)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// netBindCap is a security.capability value (VFS_CAP_REVISION_2,
// effective): CAP_NET_BIND_SERVICE permitted.
var netBindCap = []byte{0x01, 0, 0, 0x02, 0x00, 0x04, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}

// activateBig activates node and writes bigContent(seed) with mode to
// big.bin in the attempt's root: a file a seal that releases the attempt
// adopts. It returns the attempt, the content and the file's path.
func activateBig(t *testing.T, f *Fabric, node string, seed uint64, mode os.FileMode) (AttemptView, []byte, string) {
	t.Helper()
	a, err := f.Activate(context.Background(), ActivateRequest{NodeID: node})
	if err != nil {
		t.Fatal(err)
	}
	big := bigContent(seed)
	p := filepath.Join(a.Root, "big.bin")
	if err := os.WriteFile(p, big, mode); err != nil {
		t.Fatal(err)
	}
	return a, big, p
}

func upperPath(f *Fabric, attemptID, rel string) string {
	return filepath.Join(f.attemptDir(attemptID), "delta", "upper", rel)
}

func inode(t *testing.T, p string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// TestSealAdoptsLargeFiles: a seal that releases the attempt hands a large
// file of its delta to the store (the object is the upper file's inode, no
// copy) and the sealed tree exports it whole; with --keep-running the file
// is copied and stays the attempt's, writable.
func TestSealAdoptsLargeFiles(t *testing.T) {
	f, _ := openCounted(t)
	ctx := context.Background()
	g := newGroup(t, f, map[string]string{"a": "1"})

	a, big, _ := activateBig(t, f, g.Node.NodeID, 1, 0o640)
	before := inode(t, upperPath(f, a.AttemptID, "big.bin"))
	res, err := f.Suspend(ctx, SuspendRequest{AttemptID: a.AttemptID})
	if err != nil {
		t.Fatal(err)
	}
	obj := inode(t, f.local.Path(cas.Sum(big)))
	if obj.Ino != before.Ino || obj.Dev != before.Dev {
		t.Errorf("the object of big.bin is inode %d, the upper file was %d: copied, not adopted", obj.Ino, before.Ino)
	}
	if obj.Mode&0o7777 != 0o444 {
		t.Errorf("adopted object mode %o, want 444", obj.Mode&0o7777)
	}
	out := filepath.Join(t.TempDir(), "out")
	if _, _, err := f.ExportDir(ctx, res.Node.NodeID, out); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(out, "big.bin")); err != nil || !bytes.Equal(b, big) {
		t.Fatalf("exported big.bin: %d bytes, %v", len(b), err)
	}
	if st := inode(t, filepath.Join(out, "big.bin")); st.Mode&0o7777 != 0o640 {
		t.Errorf("exported big.bin mode %o, want 640", st.Mode&0o7777)
	}

	// Keep running: the attempt goes on writing its file.
	k, big2, p := activateBig(t, f, g.Node.NodeID, 2, 0o600)
	if _, err := f.Suspend(ctx, SuspendRequest{AttemptID: k.AttemptID, KeepRunning: true}); err != nil {
		t.Fatal(err)
	}
	up := inode(t, upperPath(f, k.AttemptID, "big.bin"))
	obj2 := inode(t, f.local.Path(cas.Sum(big2)))
	if up.Ino == obj2.Ino || up.Nlink != 1 || up.Mode&0o7777 != 0o600 {
		t.Errorf("after a keep-running seal the upper file is inode %d (object %d), %d links, mode %o: want its own, 600",
			up.Ino, obj2.Ino, up.Nlink, up.Mode&0o7777)
	}
	if err := os.WriteFile(p, []byte("changed"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Release(ctx, ReleaseRequest{AttemptID: k.AttemptID}); err != nil {
		t.Fatal(err)
	}
}

// TestFailedSealCommitUnsharesAdoptedFiles: a seal whose commit fails after
// it handed a large file to the store mounts the delta again with the file
// as it was (its own inode, mode, owner, xattrs and times), so writes of the
// attempt cannot reach the object; a retry seals the file.
func TestFailedSealCommitUnsharesAdoptedFiles(t *testing.T) {
	f, c := openCounted(t)
	ctx := context.Background()
	g := newGroup(t, f, map[string]string{"a": "1"})
	a, big, p := activateBig(t, f, g.Node.NodeID, 3, 0o640)
	if err := unix.Setxattr(p, "user.esf.test", []byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, 1234, 5678); err != nil {
		t.Fatal(err)
	}
	// A file capability (after the chown, which clears it): the store's
	// chown clears it too, so only the adoption log can give it back.
	if err := unix.Setxattr(p, "security.capability", netBindCap, 0); err != nil {
		t.Fatal(err)
	}
	was := inode(t, upperPath(f, a.AttemptID, "big.bin"))
	c.failNextCommit()
	if _, err := f.Suspend(ctx, SuspendRequest{AttemptID: a.AttemptID}); !errors.Is(err, errInjected) {
		t.Fatalf("suspend with a failing commit: %v", err)
	}
	v, err := f.attemptView(ctx, a.AttemptID)
	if err != nil || v.State != journal.AttemptActive {
		t.Fatalf("after the failed seal: %s, %v; want active", v.State, err)
	}
	id := cas.Sum(big)
	obj := inode(t, f.local.Path(id))
	if obj.Ino != was.Ino {
		t.Fatalf("the failed seal's object is inode %d, not the upper file's %d: nothing was adopted, the test proves nothing", obj.Ino, was.Ino)
	}
	now := inode(t, upperPath(f, a.AttemptID, "big.bin"))
	if now.Ino == obj.Ino || now.Nlink != 1 {
		t.Errorf("after the remount the upper file still shares inode %d with the object (%d links)", now.Ino, now.Nlink)
	}
	if now.Mode != was.Mode || now.Uid != was.Uid || now.Gid != was.Gid || now.Mtim != was.Mtim {
		t.Errorf("upper file after the remount: mode %o uid %d gid %d mtime %v, want %o %d %d %v",
			now.Mode, now.Uid, now.Gid, now.Mtim, was.Mode, was.Uid, was.Gid, was.Mtim)
	}
	buf := make([]byte, 8)
	if n, err := unix.Getxattr(p, "user.esf.test", buf); err != nil || string(buf[:n]) != "x" {
		t.Errorf("xattr after the remount: %q, %v", buf[:n], err)
	}
	capBuf := make([]byte, 64)
	if n, err := unix.Getxattr(p, "security.capability", capBuf); err != nil || !bytes.Equal(capBuf[:n], netBindCap) {
		t.Errorf("security.capability after the remount: %x, %v; want %x", capBuf[:max(n, 0)], err, netBindCap)
	}
	if b, err := os.ReadFile(p); err != nil || !bytes.Equal(b, big) {
		t.Fatalf("big.bin after the remount: %d bytes, %v", len(b), err)
	}
	// The attempt writes its file: the object stays whole.
	if err := os.WriteFile(p, []byte("rewritten"), 0o640); err != nil {
		t.Fatal(err)
	}
	rc, err := f.local.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("object after the attempt rewrote its file: %d bytes, %v", len(got), err)
	}
	res, err := f.Suspend(ctx, SuspendRequest{AttemptID: a.AttemptID})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out")
	if _, _, err := f.ExportDir(ctx, res.Node.NodeID, out); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(out, "big.bin")); err != nil || string(b) != "rewritten" {
		t.Fatalf("sealed big.bin: %q, %v", b, err)
	}
}
