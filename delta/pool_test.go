package delta

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/internal/testenv"
)

// TestPoolLimitsADelta: a delta made in the pool takes writes up to its
// limit and fails past it with EDQUOT; a restarted daemon adopts the
// mounted pool; Close unmounts it and deletes the image.
func TestPoolLimitsADelta(t *testing.T) {
	testenv.Require(t, "root", "cmd:mkfs.btrfs", "cmd:btrfs")
	dir := t.TempDir()
	p, err := OpenPool(filepath.Join(dir, "attempts"), filepath.Join(dir, "attempts.img"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if again, err := OpenPool(p.Dir, p.Image); err != nil || again.Dir != p.Dir {
		t.Fatalf("adopting the mounted pool: %v", err)
	}
	d := filepath.Join(p.Dir, "a")
	const limit = 16 << 20
	if err := p.NewDelta(d, limit); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(d, "big"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	var wrote int64
	for wrote < 4*limit {
		n, err := f.Write(buf)
		wrote += int64(n)
		if err == nil {
			err = f.Sync() // the qgroup counts what is allocated
		}
		if err != nil {
			if !errors.Is(err, unix.EDQUOT) && !errors.Is(err, unix.ENOSPC) {
				t.Fatalf("write past the limit: %v, want EDQUOT", err)
			}
			break
		}
	}
	if wrote > limit+1<<20 || wrote < limit/2 {
		t.Fatalf("wrote %d bytes under a limit of %d", wrote, limit)
	}
	f.Close()
	if err := os.RemoveAll(d); err != nil {
		t.Fatalf("deleting a delta (a subvolume): %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if Mounted(p.Dir) {
		t.Fatal("pool still mounted after Close")
	}
	if _, err := os.Stat(p.Image); !os.IsNotExist(err) {
		t.Fatalf("image left: %v", err)
	}
}
