package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/esf-dev/esf/api"
	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/fabric"
)

func TestExitCodeTable(t *testing.T) {
	codes := []errdefs.Code{
		errdefs.CodeNotFound, errdefs.CodeStaleGeneration, errdefs.CodeConflict, errdefs.CodeQuotaExceeded,
		errdefs.CodeInvalidArgument, errdefs.CodeUnsupported, errdefs.CodeFailedPrecondition,
		errdefs.CodeDeadlineExceeded, errdefs.CodeCorrupt, errdefs.CodeUnavailable, errdefs.CodeInternal,
		errdefs.CodeUnauthenticated,
	}
	seen := map[int]errdefs.Code{}
	for _, e := range exitCodes {
		if prev, dup := seen[e.status]; dup {
			t.Errorf("exit status %d used by %q and %q", e.status, prev, e.code)
		}
		seen[e.status] = e.code
	}
	help := exitCodeHelp()
	for _, c := range codes {
		s := exitStatus(c)
		if s == 0 || seen[s] != c {
			t.Errorf("code %s has no exit status of its own (%d)", c, s)
		}
		if !strings.Contains(help, string(c)) {
			t.Errorf("--help does not list %s", c)
		}
	}
	if len(exitCodes) != len(codes)+1 {
		t.Errorf("%d exit codes for %d error codes and success", len(exitCodes), len(codes))
	}
}

// daemon serves a real Fabric on a temp socket, in process.
func daemon(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	f, err := fabric.Open(context.Background(), fabric.Options{StateDir: filepath.Join(dir, "state")})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "esfd.sock")
	ln, err := api.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- api.NewServer(f, api.ServerOptions{}).Serve(ctx, ln, 5*time.Second) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		f.Close()
	})
	return sock
}

type result struct {
	status         int
	stdout, stderr string
}

// esfctl runs the CLI in process against socket.
func esfctl(t *testing.T, socket string, stdin io.Reader, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	if stdin == nil {
		stdin = strings.NewReader("")
	}
	a := &app{stdin: stdin, stdout: &out, stderr: &errb, umask: 0o022, isTTY: func(*os.File) bool { return false }}
	full := append([]string{"esfctl", "--socket", socket}, args...)
	st := a.run(context.Background(), full)
	return result{st, out.String(), errb.String()}
}

// jsonError decodes the -o json error on stderr.
func jsonError(t *testing.T, r result) errdefs.Error {
	t.Helper()
	var v struct {
		Error errdefs.Error `json:"error"`
	}
	dec := json.NewDecoder(strings.NewReader(r.stderr))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("stderr %q is not a JSON error: %v", r.stderr, err)
	}
	return v.Error
}

func TestErrorsAndExitStatuses(t *testing.T) {
	sock := daemon(t)
	dir := t.TempDir()
	unknown := cas.Sum([]byte("unknown")).String()
	tests := []struct {
		name   string
		socket string
		args   []string
		status int
		code   errdefs.Code
	}{
		{"unknown id", sock, []string{"-o", "json", "export", unknown, "--to", filepath.Join(dir, "a")}, 3, errdefs.CodeNotFound},
		{"flags after the argument", sock, []string{"export", unknown, "--to", filepath.Join(dir, "b"), "-o", "json"}, 3, errdefs.CodeNotFound},
		{"malformed id", sock, []string{"export", "abc", "-o", "json", "--to", filepath.Join(dir, "c")}, 2, errdefs.CodeInvalidArgument},
		{"missing --to", sock, []string{"-o", "json", "export", unknown}, 2, errdefs.CodeInvalidArgument},
		{"extra argument", sock, []string{"-o", "json", "status", "extra"}, 2, errdefs.CodeInvalidArgument},
		{"unknown flag", sock, []string{"-o", "json", "status", "--bogus"}, 2, errdefs.CodeInvalidArgument},
		{"bad output format", sock, []string{"-o", "yaml", "status"}, 2, errdefs.CodeInvalidArgument},
		{"import missing path", sock, []string{"-o", "json", "import", filepath.Join(dir, "absent")}, 3, errdefs.CodeNotFound},
		{"tar file of unknown id", sock, []string{"-o", "json", "export", unknown, "--to", filepath.Join(dir, "x.tar.zst")}, 3, errdefs.CodeNotFound},
		{"daemon down", filepath.Join(dir, "none.sock"), []string{"-o", "json", "status"}, 11, errdefs.CodeUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := esfctl(t, tt.socket, nil, tt.args...)
			if r.status != tt.status {
				t.Errorf("exit %d, want %d (stderr %s)", r.status, tt.status, r.stderr)
			}
			if r.stdout != "" {
				t.Errorf("stdout on error: %q", r.stdout)
			}
			if tt.code != errdefs.CodeInvalidArgument || !strings.Contains(tt.name, "format") {
				if e := jsonError(t, r); e.Code != tt.code || e.Message == "" {
					t.Errorf("error %+v, want code %s", e, tt.code)
				}
			}
		})
	}
	// A failed tar export leaves no file behind, not even a temp file.
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("left in %s: %v", dir, ents)
	}
	// Human errors name the code too.
	r := esfctl(t, sock, nil, "export", unknown, "--to", filepath.Join(dir, "h"))
	if r.status != 3 || !strings.Contains(r.stderr, "(not_found)") || strings.HasPrefix(r.stderr, "{") {
		t.Errorf("human error: %d %q", r.status, r.stderr)
	}
}

func TestImportExportVerbs(t *testing.T) {
	sock := daemon(t)
	src := filepath.Join(t.TempDir(), "src")
	if err := os.MkdirAll(filepath.Join(src, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "d", "f"), bytes.Repeat([]byte("x"), 5000), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("d/f", filepath.Join(src, "l")); err != nil {
		t.Fatal(err)
	}

	r := esfctl(t, sock, nil, "import", src)
	root := strings.TrimSpace(r.stdout)
	if r.status != 0 || len(root) != 64 || !strings.Contains(r.stderr, "imported 1 files") {
		t.Fatalf("import: %+v", r)
	}

	r = esfctl(t, sock, nil, "import", src, "-o", "json")
	var imp v1.ImportResponse
	if err := json.Unmarshal([]byte(r.stdout), &imp); err != nil || imp.RootID.String() != root || imp.NewObjects != 0 {
		t.Fatalf("second import -o json: %+v, %v (%q)", imp, err, r.stdout)
	}

	work := t.TempDir()
	for _, name := range []string{"t.tar", "t.tar.zst", "t.tgz"} {
		to := filepath.Join(work, name)
		r = esfctl(t, sock, nil, "export", root, "--to", to)
		if r.status != 0 {
			t.Fatalf("export to %s: %+v", name, r)
		}
		fi, err := os.Stat(to)
		if err != nil || fi.Mode().Perm() != 0o644 {
			t.Fatalf("%s: %v, %v", name, fi, err)
		}
		// The daemon reads it back (server-side path import, any compression).
		r = esfctl(t, sock, nil, "import", to)
		if got := strings.TrimSpace(r.stdout); r.status != 0 || got != root {
			t.Fatalf("re-import of %s: %s, want %s (%+v)", name, got, root, r)
		}
	}
	tarBytes, err := os.ReadFile(filepath.Join(work, "t.tar"))
	if err != nil {
		t.Fatal(err)
	}
	r = esfctl(t, sock, bytes.NewReader(tarBytes), "import", "-")
	if got := strings.TrimSpace(r.stdout); r.status != 0 || got != root {
		t.Fatalf("import - : %s, want %s (%+v)", got, root, r)
	}

	dest := filepath.Join(work, "out")
	r = esfctl(t, sock, nil, "export", root, "--to", dest, "-o", "json")
	var exp fabric.ExportResult
	if err := json.Unmarshal([]byte(r.stdout), &exp); err != nil || exp.Files != 1 || exp.RootID != root ||
		exp.Provenance != dest+".provenance.json" || exp.Record.Export.Destination != dest {
		t.Fatalf("export to dir: %+v, %v (%+v)", exp, err, r)
	}
	for _, name := range []string{"out.provenance.json", "t.tar.provenance.json", "t.tar.zst.provenance.json", "t.tgz.provenance.json"} {
		r = esfctl(t, sock, nil, "verify-provenance", filepath.Join(work, name))
		if r.status != 0 || !strings.Contains(r.stdout, "valid") {
			t.Fatalf("verify-provenance %s: %+v", name, r)
		}
	}
	if out, err := exec.Command("diff", "-r", "--no-dereference", src, dest).CombinedOutput(); err != nil {
		t.Fatalf("diff -r: %v\n%s", err, out)
	}

	var stdout bytes.Buffer
	a := &app{stdin: strings.NewReader(""), stdout: &stdout, stderr: io.Discard, isTTY: func(*os.File) bool { return false }}
	if st := a.run(context.Background(), []string{"esfctl", "--socket", sock, "export", root, "--to", "-"}); st != 0 {
		t.Fatalf("export to stdout: exit %d", st)
	}
	if !bytes.Equal(stdout.Bytes(), tarBytes) {
		t.Fatalf("tar on stdout (%d bytes) differs from the tar file (%d bytes)", stdout.Len(), len(tarBytes))
	}

	r = esfctl(t, sock, nil, "-o", "json", "status")
	var st v1.StatusResponse
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.Objects == 0 {
		t.Fatalf("status: %+v, %v", st, err)
	}
	r = esfctl(t, sock, nil, "fsck")
	if r.status != 0 || !strings.Contains(r.stdout, "checked ") {
		t.Fatalf("fsck: %+v", r)
	}
}

func TestWantsJSON(t *testing.T) {
	tests := map[string]bool{
		"esfctl -o json status":         true,
		"esfctl status --output json":   true,
		"esfctl status -o=json":         true,
		"esfctl -o table status":        false,
		"esfctl import -- -o json":      false,
		"esfctl import json":            false,
		"esfctl --output=json import x": true,
	}
	for line, want := range tests {
		if got := wantsJSON(strings.Fields(line)); got != want {
			t.Errorf("wantsJSON(%q) = %v", line, got)
		}
	}
}

// import --help says what a tree keeps and that sockets are left out.
func TestImportHelpNamesWhatIsLeftOut(t *testing.T) {
	r := esfctl(t, filepath.Join(t.TempDir(), "none.sock"), nil, "import", "--help")
	for _, want := range []string{"sockets", "skipped", "sparse", "0000", "POSIX ACLs"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("import --help does not mention %q:\n%s", want, r.stdout)
		}
	}
}
