package delta

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
)

// netBindCap is a security.capability value (VFS_CAP_REVISION_2,
// effective): CAP_NET_BIND_SERVICE permitted.
var netBindCap = []byte{0x01, 0, 0, 0x02, 0x00, 0x04, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}

// TestUnshare: a file the adoption log names gets its own inode (if it
// shares one), its owner, its mode and its file capability (which the
// store's chown cleared) back; a torn last record is ignored; the log goes.
func TestUnshare(t *testing.T) {
	dir := t.TempDir()
	l := Layout{Dir: dir}
	up := l.Upper()
	if err := os.MkdirAll(filepath.Join(up, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	shared, alone := filepath.Join(up, "d", "shared"), filepath.Join(up, "alone")
	for _, p := range []string{shared, alone} {
		if err := os.WriteFile(p, []byte("content of "+p), 0o640); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, 1234, 5678); err != nil {
			t.Fatal(err)
		}
		if err := unix.Setxattr(p, "security.capability", netBindCap, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Setxattr(shared, "user.t", []byte("v"), 0); err != nil {
		t.Fatal(err)
	}
	xattrs := []cas.Xattr{{Name: "security.capability", Value: netBindCap}}
	for _, rel := range []string{"d/shared", "alone"} {
		x := xattrs
		if rel == "d/shared" {
			x = append(x, cas.Xattr{Name: "user.t", Value: []byte("v")})
		}
		if err := l.NoteAdopted(rel, 0o640, 1234, 5678, x); err != nil {
			t.Fatal(err)
		}
	}
	// What a seal did: both the store's (the chown clears the
	// capability) and read-only, one linked into "the store".
	store := filepath.Join(dir, "object")
	for _, p := range []string{shared, alone} {
		if err := os.Chown(p, os.Geteuid(), os.Getegid()); err != nil {
			t.Fatal(err)
		}
		if _, err := unix.Getxattr(p, "security.capability", nil); !errors.Is(err, unix.ENODATA) {
			t.Fatalf("%s: capability after the store's chown: %v; want none", p, err)
		}
		if err := os.Chmod(p, 0o444); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Link(shared, store); err != nil {
		t.Fatal(err)
	}
	var was unix.Stat_t
	if err := unix.Stat(alone, &was); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(l.adoptLog(), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"path":"torn`) // a crash mid-append
	f.Close()

	if err := l.Unshare(); err != nil {
		t.Fatal(err)
	}
	var st, obj, al unix.Stat_t
	for p, s := range map[string]*unix.Stat_t{shared: &st, store: &obj, alone: &al} {
		if err := unix.Stat(p, s); err != nil {
			t.Fatal(err)
		}
	}
	if st.Ino == obj.Ino || st.Nlink != 1 || st.Mode&0o7777 != 0o640 || obj.Mode&0o7777 != 0o444 {
		t.Errorf("shared file: inode %d (object %d), %d links, mode %o (object %o); want its own, 640, object 444",
			st.Ino, obj.Ino, st.Nlink, st.Mode&0o7777, obj.Mode&0o7777)
	}
	for p, s := range map[string]*unix.Stat_t{shared: &st, alone: &al} {
		if s.Uid != 1234 || s.Gid != 5678 {
			t.Errorf("%s owned by %d:%d after Unshare, want 1234:5678 (the log's)", p, s.Uid, s.Gid)
		}
	}
	if int(obj.Uid) != os.Geteuid() {
		t.Errorf("the object's owner changed to %d", obj.Uid)
	}
	if b, err := os.ReadFile(shared); err != nil || string(b) != "content of "+shared {
		t.Errorf("shared file content %q, %v", b, err)
	}
	buf := make([]byte, 4)
	if n, err := unix.Getxattr(shared, "user.t", buf); err != nil || string(buf[:n]) != "v" {
		t.Errorf("xattr of the copy: %q, %v", buf[:n], err)
	}
	for _, p := range []string{shared, alone} {
		c := make([]byte, 64)
		if n, err := unix.Getxattr(p, "security.capability", c); err != nil || !slices.Equal(c[:n], netBindCap) {
			t.Errorf("%s: capability after Unshare: %x, %v; want %x", p, c[:max(n, 0)], err, netBindCap)
		}
	}
	if _, err := unix.Getxattr(store, "security.capability", nil); !errors.Is(err, unix.ENODATA) {
		t.Errorf("the object got a capability: %v", err)
	}
	if al.Ino != was.Ino || al.Mode&0o7777 != 0o640 {
		t.Errorf("file with one name: inode %d (was %d), mode %o; want the same inode, 640", al.Ino, was.Ino, al.Mode&0o7777)
	}
	if _, err := os.Stat(l.adoptLog()); !os.IsNotExist(err) {
		t.Errorf("adoption log left: %v", err)
	}
	if err := l.Unshare(); err != nil {
		t.Errorf("Unshare without a log: %v", err)
	}
}

// TestNoteAdoptedLogsOnlyClearedXattrs: the log holds the attributes the
// handover clears (the capability), not the ones that stay on the inode.
func TestNoteAdoptedLogsOnlyClearedXattrs(t *testing.T) {
	l := Layout{Dir: t.TempDir()}
	if err := l.NoteAdopted("f", 0o755, 1, 2, []cas.Xattr{
		{Name: "security.capability", Value: netBindCap}, {Name: "user.big", Value: []byte(strings.Repeat("x", 4096))},
	}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(l.adoptLog())
	if err != nil {
		t.Fatal(err)
	}
	var r adoptRecord
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Xattrs) != 1 || r.Xattrs[0].Name != "security.capability" || !slices.Equal(r.Xattrs[0].Value, netBindCap) {
		t.Fatalf("logged xattrs %+v, want the capability only", r.Xattrs)
	}
}
