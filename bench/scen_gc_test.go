package bench

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestUsage: the gc rows divide by what usage counts, so it must count
// regular files and their bytes, and nothing else (directories, symlinks).
func TestUsage(t *testing.T) {
	dir := t.TempDir()
	for name, size := range map[string]int{"a": 0, "b": 10, "d/c": 4096, "d/e/f": 1} {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, make([]byte, size), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("b", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	files, bytes, err := usage(dir)
	if err != nil || files != 4 || bytes != 4107 {
		t.Fatalf("usage = %d files, %d bytes, %v; want 4, 4107", files, bytes, err)
	}
	if _, _, err := usage(filepath.Join(dir, "missing")); err == nil {
		t.Error("usage of a missing directory did not fail")
	}
}

func TestWithWork(t *testing.T) {
	ms := []Measurement{{Elapsed: time.Second, Work: 3}, {Elapsed: 2 * time.Second, Work: 3}}
	got := withWork(ms, 4<<20)
	if s := Rates(got, mib); s.P50 != 3 || ms[0].Work != 3 {
		t.Errorf("rates %v MiB/s (want p50 3), input work %v (want untouched 3)", s.Values, ms[0].Work)
	}
}
