package workspace_test

import (
	"bufio"
	"bytes"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

const mod = "github.com/esf-dev/esf/"

// TestDeps pins the promotion criterion "the core module has no provider
// SDK dependency": the contract packages, the suite and the fake import the
// standard library and each other, nothing else, so no provider SDK (nor
// anything that could pull one in) can creep into a product that only uses
// the contract. Adapters live in their own modules under adapters/workspace.
func TestDeps(t *testing.T) {
	contract := []string{mod + "vfs", mod + "sandbox", mod + "workspace"}
	for _, tc := range []struct {
		pkg     string
		allowed []string
	}{
		{mod + "vfs", nil},
		{mod + "sandbox", nil},
		{mod + "workspace", contract},
		{mod + "workspace/workspacetest", contract},
		{mod + "workspace/fake", contract},
	} {
		for _, v := range violations(t, tc.pkg, tc.allowed) {
			t.Errorf("%s depends on %s: only the standard library and %v are allowed", tc.pkg, v, tc.allowed)
		}
	}
	// The check itself can fail: workspace does import vfs and sandbox.
	if v := violations(t, mod+"workspace", nil); !slices.Equal(v, []string{mod + "sandbox", mod + "vfs"}) {
		t.Errorf("control: workspace with nothing allowed violates %q, want sandbox and vfs", v)
	}
}

// violations lists, sorted, the packages pkg needs (transitively) that are
// neither in the standard library nor allowed.
func violations(t *testing.T, pkg string, allowed []string) []string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
		if _, err := exec.LookPath(goBin); err != nil {
			t.Fatalf("no go command to list dependencies with: %v", err)
		}
	}
	// -deps lists every package a build of pkg needs, transitively;
	// .Standard marks the standard library.
	cmd := exec.Command(goBin, "list", "-deps", "-f", "{{.ImportPath}} {{.Standard}}", pkg)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", pkg, err, stderr.Bytes())
	}
	var bad []string
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		path, std, _ := strings.Cut(sc.Text(), " ")
		n++
		if std != "true" && path != pkg && !slices.Contains(allowed, path) {
			bad = append(bad, path)
		}
	}
	if n < 2 {
		t.Fatalf("go list -deps %s listed %d packages; the check would see nothing", pkg, n)
	}
	slices.Sort(bad)
	return bad
}
