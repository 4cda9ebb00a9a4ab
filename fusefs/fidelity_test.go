package fusefs

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/local"
	"github.com/esf-dev/esf/delta"
	"github.com/esf-dev/esf/ingest"
	"github.com/esf-dev/esf/internal/testenv"
)

// The fidelity suite: the same tree as a plain directory and as a sealed
// node must look and behave the same, read-only and under overlayfs, as
// root and as unprivileged users, before and after copy-up, and again after
// a seal. The plain side is the reference: a real directory (ext4 or tmpfs),
// overlayfs over it with the options attempts use, and for the seal a copy
// of its merged view made by GNU tar (--sparse --xattrs). Everything a
// reader can observe is compared, except inode numbers, atime and ctime
// (they differ between any two copies) and a directory's st_size and
// st_blocks (its filesystem's bookkeeping: ext4 says 4096, tmpfs counts
// entries; the projection says what ext4 says). Sockets are left out at
// import (documented), so they are left out of the comparison.

// fixed times, distinct per path and with nanoseconds, so any time that
// is not carried over shows.
const fidelityEpoch = 1_700_000_000_000_000_000

func fidelityTime(i int) unix.Timespec {
	return unix.NsecToTimespec(fidelityEpoch + int64(i)*1_000_001_001)
}

// node is one path of the fixture.
type node struct {
	path     string
	typ      uint32 // S_IF*
	mode     uint32
	uid, gid int
	data     map[int64]string // file: data at offsets (the rest is holes)
	size     int64            // file: size (0: just past the last data)
	target   string           // symlink
	rdev     uint64
	link     string // hard link to this earlier path
	xattrs   map[string][]byte
}

// capNetBindService is a security.capability value (VFS_CAP_REVISION_2,
// effective) granting CAP_NET_BIND_SERVICE.
func capNetBindService() []byte {
	b := binary.LittleEndian.AppendUint32(nil, 0x02000001)
	b = binary.LittleEndian.AppendUint32(b, 1<<unix.CAP_NET_BIND_SERVICE) // permitted
	b = binary.LittleEndian.AppendUint32(b, 0)                            // inheritable
	return append(b, make([]byte, 8)...)                                  // upper 32 capabilities
}

func fidelityNodes() []node {
	const ownerUID = 1000
	dirDefault := aclXattr(aclEntry{aclUserObj, 7, 0}, aclEntry{aclUser, 6, testUID}, aclEntry{aclGroupObj, 5, 0},
		aclEntry{aclMask, 7, 0}, aclEntry{aclOther, 0, 0})
	f := func(p string, mode uint32, content string) node {
		return node{path: p, typ: unix.S_IFREG, mode: mode, data: map[int64]string{0: content}}
	}
	d := func(p string, mode uint32) node { return node{path: p, typ: unix.S_IFDIR, mode: mode} }
	withOwner := func(n node, uid, gid int) node { n.uid, n.gid = uid, gid; return n }
	withXattrs := func(n node, kv ...any) node {
		n.xattrs = map[string][]byte{}
		for i := 0; i < len(kv); i += 2 {
			v, _ := kv[i+1].([]byte)
			if s, ok := kv[i+1].(string); ok {
				v = []byte(s)
			}
			n.xattrs[kv[i].(string)] = v
		}
		return n
	}
	return []node{
		withXattrs(d("", 0o755), "user.root", "r"),
		withXattrs(d("etc", 0o755), "user.dir", "d", "trusted.dir", "t"),
		f("etc/shadow", 0o000, "root:*:19000:0:99999:7:::\n"),
		f("etc/passwd", 0o644, "root:x:0:0:root:/root:/bin/sh\n"),
		f("etc/gone", 0o644, "deleted in the attempt\n"),
		d("closed", 0o000),
		f("closed/inside", 0o644, "behind a 0000 directory\n"),
		d("sticky", 0o1777),
		withOwner(f("sticky/f", 0o644, "owned by 1000\n"), ownerUID, ownerUID),
		withOwner(d("sgid-dir", 0o2775), 0, testGID+1),
		f("suid", 0o4755, "#!/bin/sh\necho suid\n"),
		f("sgid", 0o2711, "#!/bin/sh\necho sgid\n"),
		f("sticky-file", 0o1644, "sticky\n"),
		// Its owner appends to it: a copy-up by an unprivileged task must
		// keep the trusted.* xattrs that task may not list.
		withXattrs(withOwner(f("owned", 0o640, "owned by 1000\n"), ownerUID, ownerUID), "trusted.owned", "o"),
		f("exec", 0o711, "#!/bin/sh\n"),
		{path: "empty", typ: unix.S_IFREG, mode: 0o644},
		withXattrs(f("acl-grant", 0o660, "granted by an ACL\n"), aclAccess, aclGrantUser),
		withXattrs(f("acl-deny", 0o644, "denied by an ACL\n"), aclAccess, aclDenyUser),
		withXattrs(d("acl-dir", 0o750), aclAccess, aclGrantGroupDir, aclDefault, dirDefault),
		f("acl-dir/old", 0o640, "from before\n"),
		// Each file's xattrs fit in an ext4 inode (256 bytes): more would
		// take an xattr block, which ext4 counts in st_blocks.
		withXattrs(f("xattrs", 0o644, "xattrs\n"), "user.a", "1", "user.empty", "", "trusted.t", "t"),
		withXattrs(f("capability", 0o755, "#!/bin/sh\n"), "security.capability", capNetBindService()),
		// Not the symlink that gets copied up: overlayfs gives a copy the
		// lower file's handle as trusted.overlay.origin, 4 bytes longer
		// for a FUSE lower than for ext4, which with this xattr tips the
		// copy's xattrs out of its ext4 inode (one more block).
		{path: "link", typ: unix.S_IFLNK, target: "etc/passwd"},
		{path: "dangling", typ: unix.S_IFLNK, target: "nowhere"},
		{path: "longlink", typ: unix.S_IFLNK, target: strings.Repeat("long/", 40) + "target"},
		withXattrs(node{path: "dirlink", typ: unix.S_IFLNK, target: "etc"}, "trusted.sym", "s"),
		d("sub", 0o755),
		f("hard1", 0o644, "two names\n"),
		{path: "sub/hard2", link: "hard1"},
		f("tri1", 0o600, "three names\n"),
		{path: "tri2", link: "tri1"},
		{path: "sub/tri3", link: "tri1"},
		withOwner(node{path: "fifo", typ: unix.S_IFIFO, mode: 0o620}, 0, 5),
		{path: "null", typ: unix.S_IFCHR, mode: 0o666, rdev: unix.Mkdev(1, 3)},
		withOwner(node{path: "loop", typ: unix.S_IFBLK, mode: 0o660, rdev: unix.Mkdev(7, 0)}, 0, 6),
		// Sparse files span several of overlayfs's 1 MiB copy-up chunks.
		{path: "sparse", typ: unix.S_IFREG, mode: 0o644, size: 4<<20 + 1,
			data: map[int64]string{0: "head", 5 << 19: "middle", 4 << 20: "t"}},
		{path: "sparse-end", typ: unix.S_IFREG, mode: 0o644, size: 3 << 20, data: map[int64]string{0: "only the start"}},
		{path: "all-hole", typ: unix.S_IFREG, mode: 0o644, size: 2 << 20},
		f("grow", 0o644, "grows a hole\n"),
	}
}

// buildFidelityTree creates the fixture at dir, plus a socket; it fails
// the test if the filesystem refuses any of it.
func buildFidelityTree(t *testing.T, dir string) {
	t.Helper()
	nodes := fidelityNodes()
	must := func(err error, what string) {
		t.Helper()
		if err != nil {
			t.Fatalf("fixture %s: %v", what, err)
		}
	}
	for _, n := range nodes {
		p := filepath.Join(dir, n.path)
		switch {
		case n.link != "":
			must(os.Link(filepath.Join(dir, n.link), p), n.path)
			continue
		case n.typ == unix.S_IFDIR:
			if n.path != "" {
				must(os.Mkdir(p, 0o700), n.path)
			}
		case n.typ == unix.S_IFREG:
			fh, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			must(err, n.path)
			for off, s := range n.data {
				_, err := fh.WriteAt([]byte(s), off)
				must(err, n.path)
			}
			if n.size > 0 {
				must(fh.Truncate(n.size), n.path)
			}
			must(fh.Close(), n.path)
		case n.typ == unix.S_IFLNK:
			must(os.Symlink(n.target, p), n.path)
		default:
			must(unix.Mknod(p, n.typ|0o600, int(n.rdev)), n.path)
		}
		must(os.Lchown(p, n.uid, n.gid), n.path)
		for _, name := range slices.Sorted(maps.Keys(n.xattrs)) {
			must(unix.Lsetxattr(p, name, n.xattrs[name], 0), n.path+" "+name)
		}
		if n.typ != unix.S_IFLNK {
			must(unix.Chmod(p, n.mode), n.path)
		}
	}
	l, err := net.Listen("unix", filepath.Join(dir, "sock"))
	must(err, "socket")
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	// Times last, children before their directories.
	for i := len(nodes) - 1; i >= 0; i-- {
		if nodes[i].link == "" {
			ts := fidelityTime(i)
			must(unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(dir, nodes[i].path), []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW), nodes[i].path)
		}
	}
}

// userChanges are what unprivileged users do in an attempt, some allowed
// (each copying up a lower file as that user), some refused: each runs as
// its user (sh -c script, the root as $1) on both sides, before copyUps,
// and must end the same way on both (exit status and message); ok says
// which way, so the test knows it checks what it means to.
var userChanges = []struct {
	name     string
	uid, gid uint32
	groups   []uint32
	script   string
	ok       bool
}{
	{"append to a file an ACL lets the user write", testUID, testGID, []uint32{testGID + 1}, `printf + >>"$1/acl-grant"`, true},
	{"append to a file an ACL keeps the user from", testUID, testGID, []uint32{testGID + 1}, `printf + >>"$1/acl-deny"`, false},
	{"append to a 0000 file", testUID, testGID, nil, `printf + >>"$1/etc/shadow"`, false},
	{"list a 0000 directory", testUID, testGID, nil, `ls "$1/closed"`, false},
	{"append to one's own file with trusted xattrs", 1000, 1000, nil, `printf + >>"$1/owned"`, true},
	{"delete another's file in a sticky directory", testUID, testGID, nil, `rm -f "$1/sticky/f"`, false},
	{"create in a sticky directory", testUID, testGID, nil, `printf new >"$1/sticky/by-user"`, true},
	{"rename one's own file in a sticky directory", 1000, 1000, nil, `mv "$1/sticky/f" "$1/sticky/f2"`, true},
}

// asUser runs script as uid with root as $1 and says how it ended: its
// exit status and output, root written as ROOT.
func asUser(uid, gid uint32, groups []uint32, script, root string) (ok bool, outcome string, err error) {
	cmd := exec.Command("sh", "-c", script, "sh", root)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: groups}}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		return false, "", err
	}
	return err == nil, fmt.Sprintf("exit %d: %s", cmd.ProcessState.ExitCode(), strings.ReplaceAll(string(out), root, "ROOT")), nil
}

// copyUps are the changes an attempt makes, each copying up a kind of
// lower file: every one runs on both sides, and must succeed on both.
var copyUps = []struct {
	name string
	do   func(root string) error
}{
	{"chmod a 0000 file", func(r string) error { return os.Chmod(filepath.Join(r, "etc/shadow"), 0) }},
	{"append to a sparse file", func(r string) error { return appendTo(filepath.Join(r, "sparse"), "!") }},
	{"grow a file with a hole", func(r string) error { return os.Truncate(filepath.Join(r, "grow"), 3<<20) }},
	{"chown to the same owner", func(r string) error { return os.Lchown(filepath.Join(r, "owned"), 1000, 1000) }},
	{"add an xattr", func(r string) error {
		return unix.Setxattr(filepath.Join(r, "capability"), "user.added", []byte("v"), 0)
	}},
	{"chmod setuid, setgid, sticky files", func(r string) error {
		return errors.Join(unix.Chmod(filepath.Join(r, "suid"), 0o4755),
			unix.Chmod(filepath.Join(r, "sgid"), 0o2711), unix.Chmod(filepath.Join(r, "sticky-file"), 0o1644))
	}},
	{"write one name of a hard link", func(r string) error {
		return errors.Join(appendTo(filepath.Join(r, "hard1"), "+"), appendTo(filepath.Join(r, "tri1"), "+"))
	}},
	{"touch a symlink", func(r string) error {
		ts := fidelityTime(100)
		return unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(r, "link"), []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
	}},
	{"chmod a fifo, chown a device", func(r string) error {
		return errors.Join(unix.Chmod(filepath.Join(r, "fifo"), 0o620), os.Lchown(filepath.Join(r, "loop"), 0, 6))
	}},
	{"mkdir in a 0000 directory", func(r string) error { return os.Mkdir(filepath.Join(r, "closed/new"), 0o700) }},
	{"create in a directory with a default ACL", func(r string) error {
		return os.WriteFile(filepath.Join(r, "acl-dir/new"), []byte("inherits\n"), 0o640)
	}},
	{"append to a file with an ACL", func(r string) error { return appendTo(filepath.Join(r, "acl-grant"), "+") }},
	{"chmod a sticky directory", func(r string) error { return unix.Chmod(filepath.Join(r, "sticky"), 0o1777) }},
	{"rename and delete", func(r string) error {
		return errors.Join(os.Rename(filepath.Join(r, "etc/passwd"), filepath.Join(r, "etc/passwd.old")),
			os.Remove(filepath.Join(r, "etc/gone")))
	}},
	// Writes set times to now; give every path a change touched fixed times
	// again, so that the comparison sees only what was carried over.
	{"set times", func(r string) error {
		var errs []error
		for i, p := range []string{"sparse", "grow", "hard1", "tri1", "closed/new", "closed", "acl-dir/new",
			"acl-dir", "acl-grant", "etc", "", "owned", "sticky/by-user", "sticky"} {
			ts := fidelityTime(200 + i)
			errs = append(errs, unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(r, p), []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW))
		}
		return errors.Join(errs...)
	}},
}

func appendTo(p, s string) error {
	f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(s)
	return errors.Join(err, f.Close())
}

// entryInfo is what a reader can observe of one path.
type entryInfo struct {
	Type    string
	Mode    string // permission, setuid, setgid and sticky bits
	Owner   string
	Size    int64 // not for directories
	Blocks  int64 // not for directories
	Nlink   uint64
	Mtime   int64
	Rdev    string
	Target  string
	Xattrs  string
	Content string // BLAKE3 of the bytes
	DataMap string // SEEK_DATA/SEEK_HOLE extents
	Peers   string // other names of the same inode
}

// snapshot walks root (as root) and records every path but sockets.
func snapshot(t *testing.T, root string) map[string]entryInfo {
	t.Helper()
	out := map[string]entryInfo{}
	inodes := map[[2]uint64][]string{}
	err := filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			rel = ""
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		typ := st.Mode & unix.S_IFMT
		if typ == unix.S_IFSOCK {
			return nil
		}
		e := entryInfo{
			Type:  typeName(typ),
			Mode:  fmt.Sprintf("%04o", st.Mode&0o7777),
			Owner: fmt.Sprintf("%d:%d", st.Uid, st.Gid),
			Nlink: uint64(st.Nlink),
			Mtime: st.Mtim.Nano(),
		}
		if typ != unix.S_IFDIR {
			e.Size, e.Blocks = st.Size, st.Blocks
			if st.Nlink > 1 {
				k := [2]uint64{st.Dev, st.Ino}
				inodes[k] = append(inodes[k], rel)
			}
		}
		if typ == unix.S_IFCHR || typ == unix.S_IFBLK {
			e.Rdev = fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
		}
		if typ == unix.S_IFLNK {
			e.Target, err = os.Readlink(p)
			if err != nil {
				return err
			}
		}
		if e.Xattrs, err = xattrString(p); err != nil {
			return err
		}
		if typ == unix.S_IFREG {
			if e.Content, e.DataMap, err = contentOf(p); err != nil {
				return err
			}
		}
		out[rel] = e
		return nil
	})
	if err != nil {
		t.Fatalf("snapshot %s: %v", root, err)
	}
	for _, names := range inodes {
		sort.Strings(names)
		for _, n := range names {
			e := out[n]
			e.Peers = strings.Join(slices.DeleteFunc(slices.Clone(names), func(s string) bool { return s == n }), ",")
			out[n] = e
		}
	}
	return out
}

func typeName(typ uint32) string {
	switch typ {
	case unix.S_IFREG:
		return "file"
	case unix.S_IFDIR:
		return "dir"
	case unix.S_IFLNK:
		return "symlink"
	case unix.S_IFIFO:
		return "fifo"
	case unix.S_IFCHR:
		return "chardev"
	case unix.S_IFBLK:
		return "blockdev"
	}
	return fmt.Sprintf("type %o", typ)
}

func xattrString(p string) (string, error) {
	sz, err := unix.Llistxattr(p, nil)
	if err != nil || sz == 0 {
		return "", err
	}
	buf := make([]byte, sz)
	if sz, err = unix.Llistxattr(p, buf); err != nil {
		return "", err
	}
	// The size query may count names the read then filters out
	// (overlayfs's own), so the list may come back shorter, even empty.
	names := strings.Split(strings.TrimRight(string(buf[:sz]), "\x00"), "\x00")
	sort.Strings(names)
	var parts []string
	for _, n := range names {
		if n == "" {
			continue
		}
		v := make([]byte, 64<<10)
		m, err := unix.Lgetxattr(p, n, v)
		if err != nil {
			return "", fmt.Errorf("getxattr %s %s: %w", p, n, err)
		}
		parts = append(parts, n+"="+hex.EncodeToString(v[:m]))
	}
	return strings.Join(parts, " "), nil
}

// contentOf hashes p and maps its data extents.
func contentOf(p string) (sum, extents string, err error) {
	f, err := os.Open(p)
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	h := cas.NewHasher()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", "", err
	}
	fd := int(f.Fd())
	var ext []string
	for pos := int64(0); pos < n; {
		data, err := unix.Seek(fd, pos, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break
		}
		if err != nil {
			return "", "", err
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return "", "", err
		}
		ext = append(ext, fmt.Sprintf("%d-%d", data, hole))
		pos = hole
	}
	return cas.IDFromHash(h).Short(), strings.Join(ext, ","), nil
}

// identities the access probe runs as: root, a user with a supplementary
// group that ACLs name, and the owner of some files.
var identities = []struct {
	uid, gid uint32
	groups   []uint32
}{{0, 0, nil}, {testUID, testGID, []uint32{testGID + 1}}, {1000, 1000, nil}}

// compareViews fails the test for every difference between the reference
// view want and got: what each path shows, and what each identity may do.
//
// On a read-only view (readOnly, the projection) write access is not
// compared: a read-only filesystem (the projection) refuses a write with
// EROFS before it checks permissions, a read-only bind mount of a directory
// (the reference) after. Nor are the trusted.* names the projection lists
// to an unprivileged user (their values it may not read, as on ext4): the
// kernel does not tell a FUSE server the credentials of a listxattr, so it
// cannot hide them (docs/fidelity.md); an attempt (overlayfs) hides them.
func compareViews(t *testing.T, stage, want, got string, readOnly bool) {
	t.Helper()
	ws, gs := snapshot(t, want), snapshot(t, got)
	diffs := 0
	for _, p := range slices.Sorted(maps.Keys(ws)) {
		g, ok := gs[p]
		if !ok {
			t.Errorf("%s: /%s missing", stage, p)
			diffs++
			continue
		}
		if d := fieldDiff(ws[p], g); d != "" {
			t.Errorf("%s: /%s differs: %s", stage, p, d)
			diffs++
		}
	}
	for p := range gs {
		if _, ok := ws[p]; !ok {
			t.Errorf("%s: /%s is extra", stage, p)
			diffs++
		}
	}
	paths := slices.Sorted(maps.Keys(ws))
	abs := func(root string) []string {
		out := make([]string, len(paths))
		for i, p := range paths {
			out[i] = filepath.Join(root, p)
		}
		return out
	}
	for _, id := range identities {
		// One probe process for both views.
		all := probeAs(t, id.uid, id.gid, id.groups, append(abs(want), abs(got)...))
		for _, p := range paths {
			w, g := all[filepath.Join(want, p)], all[filepath.Join(got, p)]
			if readOnly {
				w.W, g.W = 0, 0
				if id.uid != 0 {
					g.Xattrs = dropTrusted(g.Xattrs)
				}
			}
			if w != g {
				t.Errorf("%s: uid %d on /%s: %v, want %v", stage, id.uid, p, g, w)
				diffs++
			}
		}
	}
	t.Logf("%s: %d paths compared, %d differences", stage, len(ws), diffs)
}

// dropTrusted removes the trusted.* names from an access probe's list of
// xattrs, as a filesystem that knows its caller lacks CAP_SYS_ADMIN would.
// Their values must read as absent (ENODATA) all the same.
func dropTrusted(xattrs string) string {
	var keep []string
	for _, x := range strings.Fields(xattrs) {
		if !strings.HasPrefix(x, "trusted.") || !strings.HasSuffix(x, "=ENODATA") {
			keep = append(keep, x)
		}
	}
	return strings.Join(keep, " ")
}

// fieldDiff lists the fields of entryInfo that differ.
func fieldDiff(w, g entryInfo) string {
	var d []string
	wv, gv := reflect.ValueOf(w), reflect.ValueOf(g)
	for i := range wv.NumField() {
		if a, b := wv.Field(i).Interface(), gv.Field(i).Interface(); a != b {
			d = append(d, fmt.Sprintf("%s %v, want %v", strings.ToLower(wv.Type().Field(i).Name), b, a))
		}
	}
	return strings.Join(d, "; ")
}

// roBind shows dir read-only at a new path other users can reach, so a
// plain directory can be compared with the (read-only) projection.
func roBind(t *testing.T, dir string) string {
	t.Helper()
	mnt := filepath.Join(sharedTempDir(t), "ro")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	testenv.ReadOnlyBind(t, dir, mnt)
	return mnt
}

// overlayOn mounts an attempt-style overlay (delta.Mount) with lower as its
// lower layer.
func overlayOn(t *testing.T, lower string) delta.Layout {
	t.Helper()
	dir := sharedTempDir(t)
	l := delta.Layout{Lower: lower, Dir: filepath.Join(dir, "delta"), Root: filepath.Join(dir, "root")}
	if err := delta.Mount(l); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := delta.Remove(l); err != nil {
			t.Errorf("remove overlay %s: %v", l.Root, err)
		}
	})
	// The probe must reach the merged root.
	if err := os.Chmod(filepath.Dir(l.Root), 0o755); err != nil {
		t.Fatal(err)
	}
	return l
}

// tarCopy copies src to a new directory with GNU tar, keeping holes,
// xattrs (ACLs and capabilities among them), owners, modes, devices and
// hard links: what a seal of a plain overlay would be.
func tarCopy(t *testing.T, src string) string {
	t.Helper()
	dst := filepath.Join(sharedTempDir(t), "copy")
	if err := os.Mkdir(dst, 0o700); err != nil {
		t.Fatal(err)
	}
	script := `tar --format=posix --sparse --xattrs --xattrs-include='*' --numeric-owner -C "$1" -cf - . |
tar --xattrs --xattrs-include='*' --numeric-owner --same-owner --same-permissions -C "$2" -xf -`
	if out, err := exec.Command("sh", "-c", script, "sh", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("tar copy: %v: %s", err, out)
	}
	return dst
}

func TestFidelity(t *testing.T) {
	testenv.Require(t, "root", "fuse", "overlay", "cmd:tar")
	ctx := context.Background()
	work := sharedTempDir(t)
	src := filepath.Join(work, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	buildFidelityTree(t, src)

	st, err := local.Open(filepath.Join(work, "cas"), nil)
	if err != nil {
		t.Fatal(err)
	}
	imported, err := ingest.Dir(ctx, st, src, ingest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(imported.Skipped, []string{"sock"}) {
		t.Fatalf("import skipped %v, want the socket alone", imported.Skipped)
	}
	f, err := New(Options{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	mnt := filepath.Join(work, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	srv, err := Mount(mnt, f)
	if err != nil {
		t.Fatal(err)
	}
	// Registered first, so it runs after every overlay above it is gone.
	t.Cleanup(func() {
		if err := srv.Unmount(); err != nil {
			t.Errorf("unmount projection: %v", err)
		}
	})
	project := func(root cas.ID) string { return filepath.Join(mnt, "roots", root.String()) }

	// The node, read-only, against the directory it came from.
	compareViews(t, "projection", roBind(t, src), project(imported.Root), true)

	// Attempts over each: the lower layer, then after copy-up.
	plain, ours := overlayOn(t, src), overlayOn(t, project(imported.Root))
	compareViews(t, "lower layer", plain.Root, ours.Root, false)
	for _, c := range userChanges {
		wantOK, want, err := asUser(c.uid, c.gid, c.groups, c.script, plain.Root)
		if err != nil {
			t.Fatalf("%s on plain overlayfs: %v", c.name, err)
		}
		if wantOK != c.ok {
			t.Fatalf("%s on plain overlayfs: %s; the test expects ok=%v", c.name, want, c.ok)
		}
		_, got, err := asUser(c.uid, c.gid, c.groups, c.script, ours.Root)
		if err != nil || got != want {
			t.Errorf("%s as uid %d on the attempt: %s, %v; on plain overlayfs: %s", c.name, c.uid, got, err, want)
		}
	}
	for _, c := range copyUps {
		if err := c.do(plain.Root); err != nil {
			t.Fatalf("%s on plain overlayfs: %v", c.name, err)
		}
		if err := c.do(ours.Root); err != nil {
			t.Errorf("%s on the attempt: %v", c.name, err)
		}
	}
	compareViews(t, "after copy-up", plain.Root, ours.Root, false)

	// The seal: the attempt's upper directory onto its node; the plain
	// side's equivalent is a faithful copy of its merged view.
	if err := delta.Unmount(ours.Root); err != nil {
		t.Fatal(err)
	}
	sealed, err := ingest.Upper(ctx, st, imported.Root, ours.Upper(), ingest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	copied := tarCopy(t, plain.Root)
	compareViews(t, "sealed projection", roBind(t, copied), project(sealed.Root), true)
	plain2, ours2 := overlayOn(t, copied), overlayOn(t, project(sealed.Root))
	compareViews(t, "sealed, in a new attempt", plain2.Root, ours2.Root, false)
}
