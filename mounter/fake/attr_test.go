package fake

import (
	"testing"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/delta"
)

// TestApplyAttrModeBits: a root's setgid and sticky bits reach the fake's
// directory with its permission bits.
func TestApplyAttrModeBits(t *testing.T) {
	dir := t.TempDir()
	want := uint32(unix.S_ISGID | unix.S_ISVTX | 0o751)
	if err := applyAttr(dir, &delta.RootAttr{Mode: want}); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&0o7777 != want {
		t.Fatalf("mode %o after applyAttr, want %o", st.Mode&0o7777, want)
	}
}
