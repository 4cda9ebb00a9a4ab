package fusefs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/local"
)

// TestPassthrough: with a local store, file reads bypass the server (the
// kernel reads the object file), and a corrupted object is refused at open.
func TestPassthrough(t *testing.T) {
	requireFUSE(t)
	ctx := context.Background()
	st, err := local.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	content := strings.Repeat("esf", 100_000)
	info, _, err := st.Put(ctx, strings.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	bad, _, err := st.Put(ctx, strings.NewReader("soon corrupt"))
	if err != nil {
		t.Fatal(err)
	}
	b := cas.NewBuilder(st, cas.ZeroID)
	for name, in := range map[string]cas.Info{"big": info, "bad": bad} {
		if err := b.Put(ctx, name, cas.Entry{Type: cas.TypeFile, Attr: cas.Attr{Mode: 0o644}, Size: in.Size, ID: in.ID}, ""); err != nil {
			t.Fatal(err)
		}
	}
	root, err := b.Write(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	// Flip a byte of the second blob on disk.
	p := st.Path(bad.ID)
	os.Chmod(p, 0o644)
	raw, _ := os.ReadFile(p)
	raw[0] ^= 1
	if err := os.WriteFile(p, raw, 0o444); err != nil {
		t.Fatal(err)
	}

	f, mnt := mount(t, st, root)
	got, err := os.ReadFile(filepath.Join(mnt, "big"))
	if err != nil || string(got) != content {
		t.Fatalf("read big: %d bytes, %v", len(got), err)
	}
	if n := f.Counters.Reads.Load(); n != 0 {
		if kernelAtLeast(6, 9) {
			t.Errorf("kernel supports passthrough, yet %d reads were served by the server", n)
		} else {
			t.Logf("no passthrough before Linux 6.9: %d reads served by the server", n)
		}
	}
	if _, err := os.ReadFile(filepath.Join(mnt, "bad")); err == nil {
		t.Fatal("corrupted blob was served")
	}
}

func kernelAtLeast(major, minor int) bool {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	var ma, mi int
	fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &ma, &mi)
	return ma > major || (ma == major && mi >= minor)
}
