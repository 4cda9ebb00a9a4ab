package export

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/mem"
)

// What the sample tree holds that could give privilege on a host: two
// setuid/setgid files, one file capability, a block and a char device.
var sampleDropped = Dropped{SetID: 2, Xattrs: 1, Devices: 2,
	Paths: []string{"bin/cap", "bin/sgid", "bin/suid", "dev/loop0", "dev/null"}}

// TestToDirDropsPrivileged: by default a directory export clears setuid and
// setgid bits of files (a setgid directory keeps its bit), leaves out
// security.* xattrs and device nodes, writes everything else, and reports
// what it dropped.
func TestToDirDropsPrivileged(t *testing.T) {
	requireRoot(t)
	s := mem.New()
	root := buildSpecs(t, s, sampleSpecs())
	dest := filepath.Join(t.TempDir(), "out")
	st, err := ToDir(context.Background(), s, root, dest, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(st.Dropped, sampleDropped) {
		t.Errorf("dropped %+v, want %+v", st.Dropped, sampleDropped)
	}
	for path, want := range map[string]uint32{"bin/suid": 0o755, "bin/sgid": 0o755, "bin/cap": 0o750, "bin": 0o1777} {
		if got := lstat(t, filepath.Join(dest, path)).Mode & 0o7777; got != want {
			t.Errorf("%s: mode %o, want %o", path, got, want)
		}
	}
	if _, err := unix.Getxattr(filepath.Join(dest, "bin/cap"), "security.capability", nil); !errors.Is(err, unix.ENODATA) {
		t.Errorf("bin/cap kept security.capability (err %v)", err)
	}
	for _, dev := range []string{"dev/null", "dev/loop0"} {
		if _, err := os.Lstat(filepath.Join(dest, dev)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s was exported (lstat: %v)", dev, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(dest, "dev/fifo")); err != nil {
		t.Errorf("a fifo is not privileged and must be exported: %v", err)
	}
	if got := listXattrs(t, filepath.Join(dest, "a/hard1")); got["user.h"] != "1" {
		t.Errorf("user xattrs must stay: %v", got)
	}

	// With PreservePrivileged all of it is written as stored.
	dest2 := filepath.Join(t.TempDir(), "out")
	st, err = ToDir(context.Background(), s, root, dest2, Options{PreservePrivileged: true})
	if err != nil {
		t.Fatal(err)
	}
	if st.Dropped.Any() || st.Dropped.String() != "" {
		t.Errorf("dropped %+v with PreservePrivileged", st.Dropped)
	}
	checkDir(t, dest2, sampleSpecs(), true)
}

// TestToTarDropsPrivileged is TestToDirDropsPrivileged for tar streams.
func TestToTarDropsPrivileged(t *testing.T) {
	s := mem.New()
	root := buildSpecs(t, s, sampleSpecs())
	var buf bytes.Buffer
	st, err := ToTar(context.Background(), s, root, &buf, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(st.Dropped, sampleDropped) {
		t.Errorf("dropped %+v, want %+v", st.Dropped, sampleDropped)
	}
	tr := tar.NewReader(&buf)
	seen := map[string]*tar.Header{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		seen[h.Name] = h
		if h.Typeflag == tar.TypeChar || h.Typeflag == tar.TypeBlock {
			t.Errorf("%s: device in the tar", h.Name)
		}
		if h.Typeflag != tar.TypeDir && h.Mode&0o6000 != 0 {
			t.Errorf("%s: mode %o keeps setuid/setgid", h.Name, h.Mode)
		}
		for k := range h.PAXRecords {
			if strings.HasPrefix(k, paxXattr+"security.") {
				t.Errorf("%s: %s in the tar", h.Name, k)
			}
		}
	}
	if h := seen["./bin/"]; h == nil || h.Mode != 0o1777 {
		t.Errorf("./bin/: %+v", h)
	}
	if seen["./dev/fifo"] == nil || seen["./bin/suid"] == nil {
		t.Errorf("fifo or file missing from the tar")
	}
	if _, err := ToTar(context.Background(), s, root, io.Discard, Options{PreservePrivileged: true}); err != nil {
		t.Fatal(err)
	}
}

// A tree of more devices than the report lists counts them all and lists
// MaxDroppedPaths.
func TestDroppedPathsBounded(t *testing.T) {
	var specs []spec
	specs = append(specs, spec{path: "", typ: cas.TypeDir, attr: cas.Attr{Mode: 0o755}})
	for i := range MaxDroppedPaths + 5 {
		specs = append(specs, spec{path: fmt.Sprintf("d%03d", i), typ: cas.TypeCharDev, attr: cas.Attr{Mode: 0o666}, major: 1, minor: 3})
	}
	s := mem.New()
	root := buildSpecs(t, s, specs)
	st, err := ToTar(context.Background(), s, root, io.Discard, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if st.Dropped.Devices != MaxDroppedPaths+5 || len(st.Dropped.Paths) != MaxDroppedPaths {
		t.Errorf("dropped %d devices, %d paths listed", st.Dropped.Devices, len(st.Dropped.Paths))
	}
}
