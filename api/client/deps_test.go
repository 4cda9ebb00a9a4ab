package client_test

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

// daemonOnly are the packages a client must never link: the daemon's
// storage, filesystem, sandbox and image code (tailscale's deptest idea).
// A client that links them pays for their size and runs their init code.
var daemonOnly = []string{
	"github.com/cockroachdb/pebble",
	"github.com/hanwen/go-fuse",
	"github.com/tetratelabs/wazero",
	"github.com/opencontainers/runc", // linked by nothing today: esfd drives the runc binary
	"github.com/containerd/",         // go-runc, the image code
	mod + "fabric",
	mod + "journal",
	mod + "cas",
	mod + "executor",
}

// TestClientsLinkNoDaemon pins that esfctl, the Go client and the
// workspace provider talk to esfd through api/v1 and api/client only.
func TestClientsLinkNoDaemon(t *testing.T) {
	// The leaf and the client: the standard library and each other only.
	leaf := []string{mod + "errdefs"}
	for _, v := range notAllowed(deps(t, mod+"api/v1"), mod+"api/v1", leaf) {
		t.Errorf("api/v1 depends on %s: only the standard library and %v are allowed", v, leaf)
	}
	cl := append(leaf, mod+"api/v1", mod+"api/internal/wire")
	for _, v := range notAllowed(deps(t, mod+"api/client"), mod+"api/client", cl) {
		t.Errorf("api/client depends on %s: only the standard library and %v are allowed", v, cl)
	}
	for _, pkg := range []string{mod + "cmd/esfctl", mod + "workspace/esf"} {
		for _, v := range daemonPackages(deps(t, pkg)) {
			t.Errorf("%s links %s, which only the daemon needs", pkg, v)
		}
	}
	// The check itself can fail: esfd links all of it (but runc's Go code).
	if v := daemonPackages(deps(t, mod+"cmd/esfd")); len(v) != len(daemonOnly)-1 {
		t.Errorf("control: esfd links only %q of the daemon's packages", v)
	}
}

// daemonPackages lists the packages of ds under a daemonOnly prefix, one
// per prefix.
func daemonPackages(ds []dep) []string {
	var out []string
	for _, p := range daemonOnly {
		for _, d := range ds {
			if strings.HasPrefix(d.path, p) && (strings.HasSuffix(p, "/") || d.path == p || strings.HasPrefix(d.path, p+"/")) {
				out = append(out, d.path)
				break
			}
		}
	}
	return out
}

// notAllowed lists, sorted, the packages of ds that are neither in the
// standard library nor pkg nor allowed.
func notAllowed(ds []dep, pkg string, allowed []string) []string {
	var bad []string
	for _, d := range ds {
		if !d.std && d.path != pkg && !slices.Contains(allowed, d.path) {
			bad = append(bad, d.path)
		}
	}
	slices.Sort(bad)
	return bad
}

type dep struct {
	path string
	std  bool
}

// deps lists every package a build of pkg needs, transitively.
func deps(t *testing.T, pkg string) []dep {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	cmd := exec.Command(goBin, "list", "-deps", "-f", "{{.ImportPath}} {{.Standard}}", pkg)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", pkg, err, stderr.Bytes())
	}
	var ds []dep
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		path, std, _ := strings.Cut(sc.Text(), " ")
		ds = append(ds, dep{path, std == "true"})
	}
	if len(ds) < 2 {
		t.Fatalf("go list -deps %s listed %d packages; the check would see nothing", pkg, len(ds))
	}
	return ds
}
