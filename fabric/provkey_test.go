package fabric

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/esf-dev/esf/errdefs"
)

// TestProvenanceKeyCreatedOnce: the first load makes a 32-byte key, mode
// 0600; later loads return the same key.
func TestProvenanceKeyCreatedOnce(t *testing.T) {
	p := filepath.Join(t.TempDir(), "provenance.key")
	k1, err := loadKey(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(k1) != provKeySize {
		t.Fatalf("key of %d bytes", len(k1))
	}
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("key file mode %v, want 0600", fi.Mode().Perm())
	}
	k2, err := loadKey(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(k1, k2) {
		t.Error("second load returned another key")
	}
	if es, _ := os.ReadDir(filepath.Dir(p)); len(es) != 1 {
		t.Errorf("state directory holds %d entries, want only the key", len(es))
	}
}

// TestProvenanceKeyWrongLengthIsCorrupt: a key file that is empty (what a
// crash could leave before the writes were durable) or of any other wrong
// length is corrupt and stays as it is, never silently replaced.
func TestProvenanceKeyWrongLengthIsCorrupt(t *testing.T) {
	for _, n := range []int{0, 1, provKeySize - 1, provKeySize + 1} {
		p := filepath.Join(t.TempDir(), "provenance.key")
		bad := bytes.Repeat([]byte{7}, n)
		if err := os.WriteFile(p, bad, 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := loadKey(p)
		if !errors.Is(err, errdefs.ErrCorrupt) {
			t.Errorf("%d bytes: err %v, want corrupt", n, err)
		}
		if b, _ := os.ReadFile(p); !bytes.Equal(b, bad) {
			t.Errorf("%d bytes: the key file was changed to %d bytes", n, len(b))
		}
	}
}
