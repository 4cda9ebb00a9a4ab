package gc_test

import (
	"go/build"
	"strings"
	"testing"
)

// TestImports pins the layering: gc knows cas,
// never the journal, fabric, mounts or executors.
func TestImports(t *testing.T) {
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, imp := range pkg.Imports {
		if strings.HasPrefix(imp, "github.com/esf-dev/esf/") &&
			imp != "github.com/esf-dev/esf/cas" && imp != "github.com/esf-dev/esf/errdefs" {
			t.Errorf("gc imports %s", imp)
		}
	}
}
