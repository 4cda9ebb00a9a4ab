package delta

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestUnshare: a file the adoption log names gets its own inode (if it
// shares one), its owner and its mode back; a torn last record is ignored; the log
// goes.
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
	}
	if err := unix.Setxattr(shared, "user.t", []byte("v"), 0); err != nil {
		t.Fatal(err)
	}
	for _, rel := range []string{"d/shared", "alone"} {
		if err := l.NoteAdopted(rel, 0o640, 1234, 5678); err != nil {
			t.Fatal(err)
		}
	}
	// What a seal did: both the store's and read-only, one linked into
	// "the store".
	store := filepath.Join(dir, "object")
	for _, p := range []string{shared, alone} {
		if err := os.Chown(p, os.Geteuid(), os.Getegid()); err != nil {
			t.Fatal(err)
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
