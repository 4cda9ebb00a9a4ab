package fusefs

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/local"
	"github.com/esf-dev/esf/internal/testenv"
)

// POSIX ACL tags and the xattr they live in (linux/posix_acl_xattr.h).
const (
	aclUserObj  = 0x01
	aclUser     = 0x02
	aclGroupObj = 0x04
	aclGroup    = 0x08
	aclMask     = 0x10
	aclOther    = 0x20
	aclAccess   = "system.posix_acl_access"
	aclDefault  = "system.posix_acl_default"
)

type aclEntry struct {
	tag, perm uint16
	id        uint32
}

// aclXattr encodes an ACL as the kernel stores it in its xattr: version 2,
// then (tag, perm, id) per entry, sorted by tag and id.
func aclXattr(es ...aclEntry) []byte {
	b := binary.LittleEndian.AppendUint32(nil, 2)
	for _, e := range es {
		id := e.id
		if e.tag != aclUser && e.tag != aclGroup {
			id = ^uint32(0)
		}
		b = binary.LittleEndian.AppendUint16(b, e.tag)
		b = binary.LittleEndian.AppendUint16(b, e.perm)
		b = binary.LittleEndian.AppendUint32(b, id)
	}
	return b
}

func errnoOf(err error) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) || err == nil {
		return e
	}
	return syscall.EIO
}

// Unprivileged ids the access tests run as; nobody on the machine needs
// to have them.
const (
	testUID = 4242
	testGID = 4242
)

// ACLs the access tests use: one grants testUID rw on a 0660 root file,
// one denies it read on a 0644 file, one grants group testGID+1 r-x on a
// 0750 directory.
var (
	aclGrantUser = aclXattr(aclEntry{aclUserObj, 6, 0}, aclEntry{aclUser, 6, testUID}, aclEntry{aclGroupObj, 4, 0},
		aclEntry{aclMask, 6, 0}, aclEntry{aclOther, 0, 0})
	aclDenyUser = aclXattr(aclEntry{aclUserObj, 6, 0}, aclEntry{aclUser, 0, testUID}, aclEntry{aclGroupObj, 4, 0},
		aclEntry{aclMask, 4, 0}, aclEntry{aclOther, 4, 0})
	aclGrantGroupDir = aclXattr(aclEntry{aclUserObj, 7, 0}, aclEntry{aclGroupObj, 5, 0}, aclEntry{aclGroup, 5, testGID + 1},
		aclEntry{aclMask, 5, 0}, aclEntry{aclOther, 0, 0})
)

// buildTree stores a tree of the entries by path ("" is the root) and
// returns its root.
func buildTree(t *testing.T, st interface {
	cas.Getter
	cas.Putter
}, entries map[string]cas.Entry) cas.ID {
	t.Helper()
	ctx := context.Background()
	b := cas.NewBuilder(st, cas.ZeroID)
	for p, e := range entries {
		if err := b.Put(ctx, p, e, ""); err != nil {
			t.Fatal(err)
		}
	}
	root, err := b.Write(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// Mode 0000 is a mode like any other: go-fuse would show it as 0644 (files)
// or 0755 (directories) unless told not to, which opened /etc/shadow-like
// files to every user of an attempt.
func TestProjectionKeepsModeZero(t *testing.T) {
	testenv.Require(t, "root", "fuse")
	st := newCountingStore()
	root := buildTree(t, st, map[string]cas.Entry{
		"":              {Type: cas.TypeDir, Attr: cas.Attr{Mode: 0o755}},
		"shadow":        {Type: cas.TypeFile, Size: 6, ID: st.blob(t, "secret")},
		"closed":        {Type: cas.TypeDir},
		"closed/inside": {Type: cas.TypeFile, Attr: cas.Attr{Mode: 0o644}, Size: 6, ID: st.blob(t, "secret")},
		"fifo":          {Type: cas.TypeFIFO},
	})
	_, mnt := mount(t, st, root)
	for name, typ := range map[string]uint32{"shadow": unix.S_IFREG, "closed": unix.S_IFDIR, "fifo": unix.S_IFIFO} {
		var s unix.Stat_t
		if err := unix.Lstat(filepath.Join(mnt, name), &s); err != nil {
			t.Fatal(err)
		}
		if s.Mode != typ {
			t.Errorf("%s: mode %o, want %o", name, s.Mode, typ)
		}
	}
	shadow, closed := filepath.Join(mnt, "shadow"), filepath.Join(mnt, "closed")
	got := probeAs(t, testUID, testGID, nil, []string{shadow, closed, filepath.Join(closed, "inside")})
	if a := got[shadow]; a.R != syscall.EACCES || a.Read != syscall.EACCES {
		t.Errorf("unprivileged user on a 0000 file: %v, want read denied", a)
	}
	if a := got[closed]; a.X != syscall.EACCES || a.Read != syscall.EACCES {
		t.Errorf("unprivileged user on a 0000 directory: %v, want search and list denied", a)
	}
	if a := got[filepath.Join(closed, "inside")]; a.Read != syscall.EACCES {
		t.Errorf("unprivileged user below a 0000 directory: %v, want denied", a)
	}
}

// The kernel enforces POSIX ACLs on the projection: a user an ACL grants
// more than the mode bits may read, and one it grants less may not.
func TestProjectionEnforcesACLs(t *testing.T) {
	testenv.Require(t, "root", "fuse")
	st := newCountingStore()
	root := buildTree(t, st, map[string]cas.Entry{
		"": {Type: cas.TypeDir, Attr: cas.Attr{Mode: 0o755}},
		"granted": {Type: cas.TypeFile, Attr: cas.Attr{Mode: 0o660, Xattrs: []cas.Xattr{{Name: aclAccess, Value: aclGrantUser}}},
			Size: 2, ID: st.blob(t, "ok")},
		"denied": {Type: cas.TypeFile, Attr: cas.Attr{Mode: 0o644, Xattrs: []cas.Xattr{{Name: aclAccess, Value: aclDenyUser}}},
			Size: 2, ID: st.blob(t, "no")},
		"group-dir": {Type: cas.TypeDir, Attr: cas.Attr{Mode: 0o750, Xattrs: []cas.Xattr{{Name: aclAccess, Value: aclGrantGroupDir}}}},
	})
	_, mnt := mount(t, st, root)
	granted, denied, dir := filepath.Join(mnt, "granted"), filepath.Join(mnt, "denied"), filepath.Join(mnt, "group-dir")
	got := probeAs(t, testUID, testGID, []uint32{testGID + 1}, []string{granted, denied, dir})
	if a := got[granted]; a.R != 0 || a.Read != 0 {
		t.Errorf("user granted rw by an ACL on a 0660 root file: %v, want read allowed", a)
	}
	if a := got[denied]; a.R != syscall.EACCES || a.Read != syscall.EACCES {
		t.Errorf("user denied by an ACL on a 0644 file: %v, want read denied", a)
	}
	if a := got[dir]; a.X != 0 || a.Read != 0 {
		t.Errorf("group granted r-x by a directory's ACL: %v, want list and search allowed", a)
	}
	// The ACL still reads back as stored.
	v := make([]byte, 256)
	n, err := unix.Getxattr(granted, aclAccess, v)
	if err != nil || !bytes.Equal(v[:n], aclGrantUser) {
		t.Errorf("getxattr %s = %x, %v; want %x", aclAccess, v[:max(n, 0)], err, aclGrantUser)
	}
}

// sparseStores are the two ways the projection serves content: through a
// store that names files (passthrough) and through one that does not.
func sparseStores(t *testing.T) map[string]interface {
	cas.Getter
	cas.Putter
} {
	lst, err := local.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]interface {
		cas.Getter
		cas.Putter
	}{"passthrough": lst, "served": newCountingStore()}
}

// A sparse file shows its real allocation and its holes: st_blocks counts
// only the blocks that hold data, and SEEK_DATA/SEEK_HOLE find the holes
// the tree records (which overlayfs's copy-up relies on to skip them).
func TestProjectionSparseFile(t *testing.T) {
	testenv.Require(t, "root", "fuse")
	ctx := context.Background()
	const size = 8<<20 + 1
	content := make([]byte, size)
	copy(content[1<<20:], "data at 1 MiB")
	content[size-1] = 'x'
	holes := []cas.Hole{{Off: 0, Len: 1 << 20}, {Off: 1<<20 + 4096, Len: 7<<20 - 4096}}
	for name, st := range sparseStores(t) {
		t.Run(name, func(t *testing.T) {
			info, _, err := st.Put(ctx, bytes.NewReader(content))
			if err != nil {
				t.Fatal(err)
			}
			must := func(err error) {
				t.Helper()
				if err != nil {
					t.Fatal(err)
				}
			}
			root := buildTree(t, st, map[string]cas.Entry{
				"sparse": {Type: cas.TypeFile, Attr: cas.Attr{Mode: 0o644}, Size: size, ID: info.ID, Holes: holes},
				"dense":  {Type: cas.TypeFile, Attr: cas.Attr{Mode: 0o644}, Size: size, ID: info.ID},
			})
			_, mnt := mount(t, st, root)

			var s unix.Stat_t
			must(unix.Stat(filepath.Join(mnt, "sparse"), &s))
			if s.Size != size || s.Blocks != 2*8 {
				t.Errorf("sparse: size %d blocks %d, want %d and 16 (two 4 KiB blocks of data)", s.Size, s.Blocks, size)
			}
			must(unix.Stat(filepath.Join(mnt, "dense"), &s))
			if want := int64((size + 4095) / 4096 * 8); s.Blocks != want {
				t.Errorf("dense: blocks %d, want %d", s.Blocks, want)
			}

			f, err := os.Open(filepath.Join(mnt, "sparse"))
			must(err)
			defer f.Close()
			fd := int(f.Fd())
			for _, tc := range []struct {
				off         int64
				whence, res int
				want        int64
			}{
				{0, unix.SEEK_DATA, 0, 1 << 20},
				{0, unix.SEEK_HOLE, 0, 0},
				{1 << 20, unix.SEEK_HOLE, 0, 1<<20 + 4096},
				{1<<20 + 4096, unix.SEEK_DATA, 0, size - 1},
				{size - 1, unix.SEEK_HOLE, 0, size},
				{size, unix.SEEK_DATA, int(unix.ENXIO), 0},
			} {
				got, err := unix.Seek(fd, tc.off, tc.whence)
				if errnoOf(err) != syscall.Errno(tc.res) || (err == nil && got != tc.want) {
					t.Errorf("lseek(%d, %d) = %d, %v; want %d, errno %d", tc.off, tc.whence, got, err, tc.want, tc.res)
				}
			}
			// The bytes are the blob's, holes read as zeros.
			got, err := os.ReadFile(filepath.Join(mnt, "sparse"))
			if err != nil || !bytes.Equal(got, content) {
				t.Errorf("read sparse: %d bytes, %v", len(got), err)
			}
		})
	}
}

// A tree whose holes cover data (made by hand: importers check) would make
// SEEK_DATA hide that data from every copy; the open fails instead.
func TestProjectionRefusesHolesOverData(t *testing.T) {
	testenv.Require(t, "root", "fuse")
	st := newCountingStore()
	content := make([]byte, 1<<20)
	content[500_000] = 1
	id := st.blob(t, string(content))
	entry := func(holes ...cas.Hole) cas.Entry {
		return cas.Entry{Type: cas.TypeFile, Attr: cas.Attr{Mode: 0o644}, Size: 1 << 20, ID: id, Holes: holes}
	}
	root := buildTree(t, st, map[string]cas.Entry{
		"lying":  entry(cas.Hole{Off: 4096, Len: 1<<20 - 4096}),
		"honest": entry(cas.Hole{Off: 4096, Len: 400_000}),
	})
	_, mnt := mount(t, st, root)
	if _, err := os.ReadFile(filepath.Join(mnt, "lying")); !isErrno(err, syscall.EIO) {
		t.Errorf("open of a file whose holes hold data: %v, want EIO", err)
	}
	if got, err := os.ReadFile(filepath.Join(mnt, "honest")); err != nil || !bytes.Equal(got, content) {
		t.Errorf("read honest: %d bytes, %v", len(got), err)
	}
}
