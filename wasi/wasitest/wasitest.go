// Package wasitest builds Go programs for tests: WebAssembly modules for
// GOOS=wasip1 and static Linux binaries, with the go command on PATH (the
// build cache makes a rebuild cheap; nothing needs the network).
//
// Each program is built once per test process and kept in memory, so
// every test that asks for it again gets the same bytes at once.
package wasitest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

// GuestPkg is the test guest of package wasi: one WebAssembly command with
// many small behaviours chosen by its first argument (see its source).
const GuestPkg = "github.com/esf-dev/esf/wasi/testdata/guest"

type key struct{ pkg, goos, goarch string }

type build struct {
	once sync.Once
	bin  []byte
	err  error
	out  []byte
}

var builds sync.Map // key -> *build

// GoBuild builds the Go package pkg (an import path in this module) for
// goos/goarch with cgo off and returns the binary. goarch "" means wasm
// for wasip1 and the host's architecture otherwise. Failures are fatal to
// tb, with the compiler's output.
func GoBuild(tb testing.TB, pkg, goos, goarch string) []byte {
	tb.Helper()
	if goarch == "" {
		goarch = runtime.GOARCH
		if goos == "wasip1" {
			goarch = "wasm"
		}
	}
	v, _ := builds.LoadOrStore(key{pkg, goos, goarch}, &build{})
	b := v.(*build)
	b.once.Do(func() {
		dir, err := os.MkdirTemp("", "wasitest-")
		if err != nil {
			b.err = err
			return
		}
		defer os.RemoveAll(dir)
		out := filepath.Join(dir, "prog")
		cmd := exec.Command("go", "build", "-trimpath", "-o", out, pkg)
		cmd.Env = append(os.Environ(), "GOOS="+goos, "GOARCH="+goarch, "CGO_ENABLED=0")
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stderr, &stderr
		if b.err = cmd.Run(); b.err != nil {
			b.out = stderr.Bytes()
			return
		}
		b.bin, b.err = os.ReadFile(out)
	})
	if b.err != nil {
		tb.Fatalf("go build %s for %s/%s: %v\n%s", pkg, goos, goarch, b.err, b.out)
	}
	return b.bin
}

// Guest returns the test guest module.
func Guest(tb testing.TB) []byte {
	tb.Helper()
	return GoBuild(tb, GuestPkg, "wasip1", "wasm")
}

// WriteExecutable writes bin to name in a fresh t.TempDir-backed
// directory with mode 0755 and returns its path.
func WriteExecutable(tb testing.TB, bin []byte, name string) string {
	tb.Helper()
	p := filepath.Join(tb.TempDir(), name)
	if err := os.WriteFile(p, bin, 0o755); err != nil {
		tb.Fatal(err)
	}
	return p
}
