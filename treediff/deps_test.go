package treediff_test

import (
	gobuild "go/build"
	"strings"
	"testing"
)

// TestImports pins the layering: treediff knows cas (and the error classes),
// never the journal, fabric, mounts or executors.
func TestImports(t *testing.T) {
	pkg, err := gobuild.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, imp := range pkg.Imports {
		if strings.HasPrefix(imp, "github.com/esf-dev/esf/") &&
			imp != "github.com/esf-dev/esf/cas" && imp != "github.com/esf-dev/esf/errdefs" {
			t.Errorf("treediff imports %s", imp)
		}
	}
}
