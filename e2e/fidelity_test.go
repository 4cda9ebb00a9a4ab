package e2e

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// POSIX ACL xattr encoding (linux/posix_acl_xattr.h): version 2, then
// (tag, perm, id) per entry, sorted by tag and id.
func aclValue(entries ...[3]uint32) []byte {
	b := binary.LittleEndian.AppendUint32(nil, 2)
	for _, e := range entries {
		b = binary.LittleEndian.AppendUint16(b, uint16(e[0]))
		b = binary.LittleEndian.AppendUint16(b, uint16(e[1]))
		b = binary.LittleEndian.AppendUint32(b, e[2])
	}
	return b
}

const noID = ^uint32(0)

// imageTree writes an image-like tree: a 0000 /etc/shadow, files and a
// directory with POSIX ACLs (access and default), and a 100 MiB sparse
// disk image with two 1 MiB data extents.
func imageTree(t *testing.T) (root, sparse string) {
	t.Helper()
	root = filepath.Join(t.TempDir(), "image")
	for _, d := range []string{"etc", "srv/shared", "var/lib"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(rel, content string, mode uint32) {
		p := filepath.Join(root, rel)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := unix.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	write("etc/shadow", "root:*:19000:0:99999:7:::\n", 0)
	write("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n", 0o644)
	write("srv/shared/report", "shared through an ACL\n", 0o640)
	setxattr := func(rel, name string, v []byte) {
		if err := unix.Lsetxattr(filepath.Join(root, rel), name, v, 0); err != nil {
			t.Fatalf("setxattr %s %s: %v", rel, name, err)
		}
	}
	// user::rw- user:1000:rw- group::r-- mask::rw- other::---
	setxattr("srv/shared/report", "system.posix_acl_access",
		aclValue([3]uint32{0x01, 6, noID}, [3]uint32{0x02, 6, 1000}, [3]uint32{0x04, 4, noID}, [3]uint32{0x10, 6, noID}, [3]uint32{0x20, 0, noID}))
	// user::rwx group::r-x group:1000:rwx mask::rwx other::---, and the same by default
	dirACL := aclValue([3]uint32{0x01, 7, noID}, [3]uint32{0x04, 5, noID}, [3]uint32{0x08, 7, 1000}, [3]uint32{0x10, 7, noID}, [3]uint32{0x20, 0, noID})
	setxattr("srv/shared", "system.posix_acl_access", dirACL)
	setxattr("srv/shared", "system.posix_acl_default", dirACL)

	sparse = filepath.Join(root, "var/lib/disk.img")
	f, err := os.Create(sparse)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = byte(i*7 + 1)
	}
	for _, off := range []int64{0, 50 << 20} {
		if _, err := f.WriteAt(chunk, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Truncate(100 << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	return root, sparse
}

func blocks(t *testing.T, p string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks
}

// TestSealedExportKeepsShadowACLsAndHoles: an image with a 0000
// /etc/shadow, POSIX ACLs and a sparse file goes through a group, an
// attempt that copies each of those files up (chown to the same owner
// changes nothing but moves them to the upper directory), a seal and an
// export to a directory: the sealed root is the imported root, the export
// equals the source tree (modes, owners, times, ACL xattrs, sizes,
// content), and the sparse file takes no more than twice the source's
// disk space.
func TestSealedExportKeepsShadowACLsAndHoles(t *testing.T) {
	requireFUSE(t)
	src, sparse := imageTree(t)
	srcBlocks := blocks(t, sparse)
	if srcBlocks > 8<<10 {
		t.Fatalf("the test directory's filesystem keeps no holes (%d blocks)", srcBlocks)
	}
	d := startDaemon(t)
	g := createGroup(t, d, src)
	a := activate(t, d, fork(t, d, g.Node.NodeID, 1)[0])
	for _, rel := range []string{"etc/shadow", "srv/shared/report", "srv/shared", "var/lib/disk.img"} {
		if err := os.Lchown(filepath.Join(a.Root, rel), 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	s := suspend(t, d, a.AttemptID)
	// The copies changed nothing, so the seal must name the very tree the
	// import did: the same modes, ACLs and holes, byte for byte.
	if s.Node.RootID != g.Node.RootID {
		t.Errorf("sealing copied-up, unchanged files gave root %s, want the imported %s", s.Node.RootID, g.Node.RootID)
	}
	dest := filepath.Join(t.TempDir(), "export")
	d.mustCtl(nil, "export", s.Node.RootID, "--to", dest)
	compareTrees(t, src, dest)
	got := blocks(t, filepath.Join(dest, "var/lib/disk.img"))
	t.Logf("sparse file: %d KiB on disk in the source, %d KiB in the export", srcBlocks/2, got/2)
	if got > 2*srcBlocks {
		t.Errorf("exported sparse file takes %s blocks, more than twice the source's %d", strconv.FormatInt(got, 10), srcBlocks)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dest, "etc/shadow"), &st); err != nil || st.Mode&0o7777 != 0 {
		t.Errorf("exported /etc/shadow mode %o, %v; want 0000", st.Mode&0o7777, err)
	}
}
