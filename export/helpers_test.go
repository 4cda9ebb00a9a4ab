package export

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/mem"
	"github.com/esf-dev/esf/internal/testenv"
)

func requireRoot(t *testing.T) {
	t.Helper()
	testenv.Require(t, "root") // chown, mknod and trusted.* xattrs
}

// spec describes one node of a test tree, both to build it and to check an
// export of it.
type spec struct {
	path         string // "" is the root
	typ          cas.Type
	attr         cas.Attr
	content      string
	target       string
	major, minor uint32
	linkTo       string // hard link to this earlier path; attr and content come from it
}

func xattrs(kv ...string) []cas.Xattr {
	var xs []cas.Xattr
	for i := 0; i < len(kv); i += 2 {
		xs = append(xs, cas.Xattr{Name: kv[i], Value: []byte(kv[i+1])})
	}
	cas.SortXattrs(xs)
	return xs
}

// capV2 is a valid VFS_CAP_REVISION_2 security.capability value granting
// CAP_NET_BIND_SERVICE (effective); chown clears it, so it survives an
// export only if xattrs are set after the owner.
func capV2() string {
	b := make([]byte, 20)
	binary.LittleEndian.PutUint32(b[0:], 0x02000001)
	binary.LittleEndian.PutUint32(b[4:], 1<<10)
	return string(b)
}

func pattern(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/251)
	}
	return string(b)
}

// bigContent spans several copy buffers; made once, it is slow under -race.
var bigContent = sync.OnceValue(func() string { return pattern(3<<20 + 17) })

const ts0 = int64(1_700_000_000_123_456_789)

func sampleSpecs() []spec {
	return []spec{
		{path: "", typ: cas.TypeDir, attr: cas.Attr{Mode: 0o750, UID: 100, GID: 200, MtimeNs: ts0, Xattrs: xattrs("user.root", "r")}},
		// Same name as the exporter's first temporary file.
		{path: ".esf-export-1.tmp", typ: cas.TypeFile, attr: cas.Attr{Mode: 0o644, MtimeNs: ts0}, content: "not a temp file"},
		{path: "a", typ: cas.TypeDir, attr: cas.Attr{Mode: 0o755, UID: 1, GID: 2, MtimeNs: ts0 + 1}},
		{path: "a/b", typ: cas.TypeDir, attr: cas.Attr{Mode: 0o555, UID: 3, GID: 4, MtimeNs: ts0 + 2}},
		{path: "a/b/deep.txt", typ: cas.TypeFile, attr: cas.Attr{Mode: 0o444, UID: 5, GID: 6, MtimeNs: ts0 + 3}, content: "deep\n"},
		{path: "a/empty", typ: cas.TypeFile, attr: cas.Attr{Mode: 0o600, MtimeNs: ts0 + 4}},
		{path: "a/hard1", typ: cas.TypeFile, attr: cas.Attr{Mode: 0o640, UID: 1000, GID: 1000, MtimeNs: ts0 + 5, Xattrs: xattrs("user.h", "1")}, content: "linked content"},
		{path: "big", typ: cas.TypeFile, attr: cas.Attr{Mode: 0o644, MtimeNs: ts0}, content: bigContent()},
		{path: "bin", typ: cas.TypeDir, attr: cas.Attr{Mode: 0o1777, MtimeNs: ts0 + 6}},
		{path: "bin/cap", typ: cas.TypeFile, attr: cas.Attr{Mode: 0o750, UID: 1000, GID: 1000, MtimeNs: ts0 + 7, Xattrs: xattrs("security.capability", capV2())}, content: "cap"},
		{path: "bin/sgid", typ: cas.TypeFile, attr: cas.Attr{Mode: 0o2755, UID: 0, GID: 50, MtimeNs: ts0}, content: "sgid"},
		{path: "bin/suid", typ: cas.TypeFile, attr: cas.Attr{Mode: 0o4755, UID: 1000, GID: 1000, MtimeNs: ts0}, content: "suid"},
		{path: "dev", typ: cas.TypeDir, attr: cas.Attr{Mode: 0o755, MtimeNs: ts0 + 8}},
		{path: "dev/fifo", typ: cas.TypeFIFO, attr: cas.Attr{Mode: 0o620, UID: 5, GID: 5, MtimeNs: ts0 + 9}},
		{path: "dev/loop0", typ: cas.TypeBlockDev, attr: cas.Attr{Mode: 0o660, GID: 6, MtimeNs: ts0}, major: 7, minor: 0},
		{path: "dev/null", typ: cas.TypeCharDev, attr: cas.Attr{Mode: 0o666, MtimeNs: ts0, Xattrs: xattrs("trusted.dev", "n")}, major: 1, minor: 3},
		{path: "hard2", linkTo: "a/hard1"},
		{path: "links", typ: cas.TypeDir, attr: cas.Attr{Mode: 0o700, UID: 7, GID: 7, MtimeNs: ts0 + 10}},
		{path: "links/abs", typ: cas.TypeSymlink, attr: cas.Attr{Mode: 0o777, UID: 7, GID: 8, MtimeNs: ts0 + 11, Xattrs: xattrs("trusted.sym", "s")}, target: "/etc/passwd"},
		{path: "links/abs-hard", linkTo: "links/abs"},
		{path: "links/dangling", typ: cas.TypeSymlink, attr: cas.Attr{Mode: 0o777, MtimeNs: ts0}, target: "nope/nothing"},
		{path: "links/rel", typ: cas.TypeSymlink, attr: cas.Attr{Mode: 0o777, MtimeNs: -1}, target: "../a/empty"},
		{path: "old", typ: cas.TypeFile, attr: cas.Attr{Mode: 0o644, MtimeNs: -1_500_000_000_987_654_321}, content: "before 1970"},
		{path: "sp ace é", typ: cas.TypeFile, attr: cas.Attr{Mode: 0o755, MtimeNs: ts0}, content: "unicode"},
		{path: "xattrs", typ: cas.TypeFile, attr: cas.Attr{Mode: 0o644, MtimeNs: ts0, Xattrs: xattrs("user.a", "1", "user.bin", "\x00\xff", "user.empty", "")}, content: "x"},
		{path: "z", typ: cas.TypeDir, attr: cas.Attr{Mode: 0o755, MtimeNs: ts0 + 12}},
		{path: "z/hard3", linkTo: "a/hard1"},
	}
}

// resolve returns s with a link's type, attributes and content taken from
// its target.
func resolve(specs []spec, s spec) spec {
	if s.linkTo == "" {
		return s
	}
	for _, o := range specs {
		if o.path == s.linkTo {
			o.path, o.linkTo = s.path, s.linkTo
			return o
		}
	}
	panic("link to unknown path " + s.linkTo)
}

func putBlob(t testing.TB, s cas.Putter, content string) (cas.ID, int64) {
	t.Helper()
	info, _, err := s.Put(context.Background(), strings.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	return info.ID, info.Size
}

func buildSpecs(t testing.TB, s *mem.Store, specs []spec) cas.ID {
	t.Helper()
	ctx := context.Background()
	b := cas.NewBuilder(s, cas.ZeroID)
	for _, sp := range specs {
		var err error
		switch {
		case sp.linkTo != "":
			err = b.Link(ctx, sp.path, sp.linkTo)
		default:
			e := cas.Entry{Type: sp.typ, Attr: sp.attr, Target: sp.target, Major: sp.major, Minor: sp.minor}
			if sp.typ == cas.TypeFile {
				e.ID, e.Size = putBlob(t, s, sp.content)
			}
			err = b.Put(ctx, sp.path, e, "")
		}
		if err != nil {
			t.Fatalf("build %q: %v", sp.path, err)
		}
	}
	root, err := b.Write(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// dfsLess orders paths as a depth-first walk in name order visits them.
func dfsLess(a, b string) bool {
	if a == "" || b == "" {
		return a == "" && b != ""
	}
	return slices.Compare(strings.Split(a, "/"), strings.Split(b, "/")) < 0
}

func sortedDFS(specs []spec) []spec {
	out := slices.Clone(specs)
	sort.SliceStable(out, func(i, j int) bool { return dfsLess(out[i].path, out[j].path) })
	return out
}

func expectedStats(specs []spec) Stats {
	var st Stats
	for _, sp := range specs {
		if sp.linkTo != "" {
			st.Links++
			continue
		}
		switch sp.typ {
		case cas.TypeDir:
			st.Dirs++
		case cas.TypeFile:
			st.Files++
			st.Bytes += int64(len(sp.content))
		case cas.TypeSymlink:
			st.Symlinks++
		default:
			st.Others++
		}
	}
	return st
}

func listXattrs(t *testing.T, p string) map[string]string {
	t.Helper()
	sz, err := unix.Llistxattr(p, nil)
	if err != nil {
		t.Fatalf("listxattr %s: %v", p, err)
	}
	buf := make([]byte, sz)
	sz, err = unix.Llistxattr(p, buf)
	if err != nil {
		t.Fatalf("listxattr %s: %v", p, err)
	}
	out := map[string]string{}
	for _, name := range strings.Split(string(buf[:sz]), "\x00") {
		if name == "" {
			continue
		}
		vsz, err := unix.Lgetxattr(p, name, nil)
		if err != nil {
			t.Fatalf("getxattr %s %s: %v", p, name, err)
		}
		v := make([]byte, vsz)
		vsz, err = unix.Lgetxattr(p, name, v)
		if err != nil {
			t.Fatalf("getxattr %s %s: %v", p, name, err)
		}
		out[name] = string(v[:vsz])
	}
	return out
}

func xattrMap(xs []cas.Xattr) map[string]string {
	m := map[string]string{}
	for _, x := range xs {
		m[x.Name] = string(x.Value)
	}
	return m
}

func lstat(t *testing.T, p string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatalf("lstat: %v", err)
	}
	return st
}

var typeBits = map[cas.Type]uint32{
	cas.TypeFile: unix.S_IFREG, cas.TypeDir: unix.S_IFDIR, cas.TypeSymlink: unix.S_IFLNK,
	cas.TypeCharDev: unix.S_IFCHR, cas.TypeBlockDev: unix.S_IFBLK, cas.TypeFIFO: unix.S_IFIFO,
}

// checkDir compares dest with specs: every node and nothing else, with type,
// mode, owner (when owners is set), mtime to the nanosecond, content,
// target, device numbers, xattrs and hard-link identity.
func checkDir(t *testing.T, dest string, specs []spec, owners bool) {
	t.Helper()
	want := map[string]bool{}
	nlinks := map[string]uint64{}
	for _, sp := range specs {
		if sp.linkTo != "" {
			nlinks[sp.linkTo]++
		}
	}
	for _, raw := range specs {
		sp := resolve(specs, raw)
		want[sp.path] = true
		p := filepath.Join(dest, sp.path)
		st := lstat(t, p)
		if got := st.Mode & unix.S_IFMT; got != typeBits[sp.typ] {
			t.Errorf("%q: type bits %o, want %s", sp.path, got, sp.typ)
			continue
		}
		if sp.typ != cas.TypeSymlink && st.Mode&cas.ModeMask != sp.attr.Mode {
			t.Errorf("%q: mode %o, want %o", sp.path, st.Mode&cas.ModeMask, sp.attr.Mode)
		}
		if owners && (st.Uid != sp.attr.UID || st.Gid != sp.attr.GID) {
			t.Errorf("%q: owner %d:%d, want %d:%d", sp.path, st.Uid, st.Gid, sp.attr.UID, sp.attr.GID)
		}
		if got := st.Mtim.Nano(); got != sp.attr.MtimeNs {
			t.Errorf("%q: mtime %d, want %d", sp.path, got, sp.attr.MtimeNs)
		}
		if got, want := listXattrs(t, p), xattrMap(sp.attr.Xattrs); !mapsEqual(got, want) {
			t.Errorf("%q: xattrs %q, want %q", sp.path, got, want)
		}
		switch sp.typ {
		case cas.TypeFile:
			b, err := os.ReadFile(p)
			if err != nil || string(b) != sp.content {
				t.Errorf("%q: content differs (%d bytes, err %v)", sp.path, len(b), err)
			}
		case cas.TypeSymlink:
			if got, err := os.Readlink(p); err != nil || got != sp.target {
				t.Errorf("%q: target %q (%v), want %q", sp.path, got, err, sp.target)
			}
		case cas.TypeCharDev, cas.TypeBlockDev:
			if st.Rdev != unix.Mkdev(sp.major, sp.minor) {
				t.Errorf("%q: rdev %x, want %d,%d", sp.path, st.Rdev, sp.major, sp.minor)
			}
		}
		if raw.linkTo != "" {
			first := lstat(t, filepath.Join(dest, raw.linkTo))
			if first.Ino != st.Ino || first.Dev != st.Dev {
				t.Errorf("%q: not a hard link of %q", sp.path, raw.linkTo)
			}
			if st.Nlink != nlinks[raw.linkTo]+1 {
				t.Errorf("%q: nlink %d, want %d", sp.path, st.Nlink, nlinks[raw.linkTo]+1)
			}
		}
	}
	err := filepath.WalkDir(dest, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dest, p)
		if rel == "." {
			rel = ""
		}
		if !want[rel] {
			t.Errorf("unexpected node %q in export", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// snapshot records everything observable about the tree at root without
// following symlinks, so a test can prove an export left it untouched.
func snapshot(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		st := lstat(t, p)
		var sum string
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			h := sha256.Sum256(b)
			sum = hex.EncodeToString(h[:])
		case unix.S_IFLNK:
			sum, _ = os.Readlink(p)
		}
		var xs []string
		for k, v := range listXattrs(t, p) {
			xs = append(xs, k+"="+v)
		}
		sort.Strings(xs)
		rel, _ := filepath.Rel(root, p)
		out[rel] = fmt.Sprintf("%o %d:%d n%d m%d s%d %s %s", st.Mode, st.Uid, st.Gid, st.Nlink,
			st.Mtim.Nano(), st.Size, sum, strings.Join(xs, ","))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// sentinel makes a directory outside any export destination, with a file
// and a subdirectory, for trees to aim at.
func sentinel(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "outside")
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "victim"), []byte("original"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func checkUntouched(t *testing.T, dir string, before map[string]string) {
	t.Helper()
	after := snapshot(t, dir)
	if !mapsEqual(before, after) {
		t.Errorf("sentinel %s changed:\nbefore %v\nafter  %v", dir, before, after)
	}
}

// rawTree encodes t in the canonical tree format without validating it, so
// tests can store trees the encoder would refuse.
func rawTree(t *cas.Tree) []byte {
	str := func(b []byte, s string) []byte {
		b = binary.AppendUvarint(b, uint64(len(s)))
		return append(b, s...)
	}
	attr := func(b []byte, a *cas.Attr) []byte {
		b = binary.AppendUvarint(b, uint64(a.Mode))
		b = binary.AppendUvarint(b, uint64(a.UID))
		b = binary.AppendUvarint(b, uint64(a.GID))
		return binary.AppendVarint(b, a.MtimeNs)
	}
	xas := func(b []byte, xs []cas.Xattr) []byte {
		b = binary.AppendUvarint(b, uint64(len(xs)))
		for _, x := range xs {
			b = str(b, x.Name)
			b = str(b, string(x.Value))
		}
		return b
	}
	b := []byte("ESFT\x01")
	b = attr(b, &t.Attr)
	b = xas(b, t.Xattrs)
	b = binary.AppendUvarint(b, uint64(len(t.Entries)))
	for _, e := range t.Entries {
		b = str(b, e.Name)
		b = append(b, byte(e.Type))
		if e.Type == cas.TypeDir {
			b = append(b, e.ID[:]...)
			continue
		}
		b = attr(b, &e.Attr)
		switch e.Type {
		case cas.TypeFile:
			b = binary.AppendUvarint(b, uint64(e.Size))
			b = append(b, e.ID[:]...)
		case cas.TypeSymlink:
			b = str(b, e.Target)
		case cas.TypeCharDev, cas.TypeBlockDev:
			b = binary.AppendUvarint(b, uint64(e.Major))
			b = binary.AppendUvarint(b, uint64(e.Minor))
		}
		b = xas(b, e.Xattrs)
		b = str(b, e.LinkGroup)
		if e.LinkGroup != "" {
			b = binary.AppendUvarint(b, uint64(e.Nlink))
		}
	}
	return b
}

func putRaw(t *testing.T, s cas.Putter, tr *cas.Tree) cas.ID {
	t.Helper()
	info, _, err := s.Put(context.Background(), bytes.NewReader(rawTree(tr)))
	if err != nil {
		t.Fatal(err)
	}
	return info.ID
}

func TestRawTreeMatchesEncoder(t *testing.T) {
	s := mem.New()
	root := buildSpecs(t, s, sampleSpecs())
	raw, err := cas.ReadAll(context.Background(), s, root)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := cas.DecodeTree(raw)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(rawTree(tr), raw) {
		t.Fatal("the test encoder disagrees with cas.EncodeTree; hand-made trees would prove nothing")
	}
}

// tempLeftovers lists exporter temporary files under dir.
func tempLeftovers(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), ".esf-export-") {
			out = append(out, p)
		}
		if err == nil && strings.Contains(d.Name(), ".tmp-") {
			out = append(out, p)
		}
		return nil
	})
	return out
}
