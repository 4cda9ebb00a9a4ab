package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/esf-dev/esf/cas"
)

// jsonObject decodes s as one JSON object.
func jsonObject(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("not a JSON object: %v\n%s", err, s)
	}
	return m
}

func keys(m map[string]any) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// jsonErr checks that stderr is exactly {"error":{"code","message"}} with
// the given code.
func jsonErr(t *testing.T, r result, code string) string {
	t.Helper()
	m := jsonObject(t, r.stderr)
	e, ok := m["error"].(map[string]any)
	if len(m) != 1 || !ok || !reflect.DeepEqual(keys(e), []string{"code", "message"}) {
		t.Fatalf("stderr is not {\"error\":{\"code\",\"message\"}}: %s", r.stderr)
	}
	if e["code"] != code {
		t.Fatalf("error code %v, want %s (%s)", e["code"], code, r.stderr)
	}
	return e["message"].(string)
}

func objects(t *testing.T, d *daemon) float64 {
	t.Helper()
	return jsonObject(t, d.mustCtl(nil, "-o", "json", "status").stdout)["objects"].(float64)
}

func TestStatus(t *testing.T) {
	d := startDaemon(t)
	r := d.mustCtl(nil, "status")
	for _, want := range []string{"version", "state_dir", d.state, "objects", "bytes"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("status output lacks %q:\n%s", want, r.stdout)
		}
	}
	m := jsonObject(t, d.mustCtl(nil, "status", "-o", "json").stdout)
	want := []string{"bytes", "objects", "state_dir", "version"}
	if sharedRemote.srv != nil {
		want = []string{"bytes", "objects", "remote", "state_dir", "version"} // ESF_E2E_CAS_REMOTE
	}
	if !reflect.DeepEqual(keys(m), want) || m["state_dir"] != d.state || m["objects"] != 0.0 {
		t.Errorf("status -o json: %v", m)
	}
	fi, err := os.Lstat(d.socket)
	if err != nil || fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket %v, %v: want a 0600 socket", fi.Mode(), err)
	}
	// --help documents the exit statuses.
	help := d.mustCtl(nil, "--help").stdout
	for _, want := range []string{"EXIT STATUS", "not_found", "corrupt", "unavailable"} {
		if !strings.Contains(help, want) {
			t.Errorf("--help lacks %q", want)
		}
	}
}

// TestImportIsIdempotent: the same directory twice is the same root and
// stores nothing the second time; a tar of it is the same root too.
func TestImportIsIdempotent(t *testing.T) {
	src := fixture(t)
	d := startDaemon(t)

	first := jsonObject(t, d.mustCtl(nil, "-o", "json", "import", src).stdout)
	root, _ := first["root_id"].(string)
	if _, err := cas.ParseID(root); err != nil || first["new_objects"].(float64) == 0 {
		t.Fatalf("first import: %v", first)
	}
	for _, k := range []string{"root_id", "files", "dirs", "bytes", "new_objects", "new_bytes", "skipped"} {
		if _, ok := first[k]; !ok {
			t.Errorf("import -o json lacks %q: %v", k, first)
		}
	}
	count := objects(t, d)
	if count != first["new_objects"].(float64) {
		t.Errorf("status counts %v objects after importing %v", count, first["new_objects"])
	}

	// Human output: the root id alone on stdout.
	r := d.mustCtl(nil, "import", src)
	if strings.TrimSpace(r.stdout) != root {
		t.Fatalf("second import printed %q, want %s", r.stdout, root)
	}
	if !strings.Contains(r.stderr, "0 new objects") {
		t.Errorf("second import stored something: %s", r.stderr)
	}
	if n := objects(t, d); n != count {
		t.Errorf("objects %v after re-import, was %v", n, count)
	}

	// The same tree as a tar stream on stdin. posix format keeps ns mtimes
	// and every xattr namespace.
	tarCmd := exec.Command("tar", "--format=posix", "--xattrs", "--xattrs-include=*", "--numeric-owner",
		"-C", src, "-cf", "-", ".")
	tarData, err := tarCmd.Output()
	if err != nil {
		t.Fatalf("tar: %v", err)
	}
	r = d.mustCtl(bytes.NewReader(tarData), "import", "-")
	if got := strings.TrimSpace(r.stdout); got != root {
		t.Fatalf("tar of the directory: root %s, want %s", got, root)
	}
	if n := objects(t, d); n != count {
		t.Errorf("objects %v after importing the tar, was %v", n, count)
	}
}

// TestExportReproducesTheFixture: import, export to a directory, and
// everything diff -r, stat and getfattr see agrees.
func TestExportReproducesTheFixture(t *testing.T) {
	src := fixture(t)
	d := startDaemon(t)
	root := strings.TrimSpace(d.mustCtl(nil, "import", src).stdout)

	dest := filepath.Join(t.TempDir(), "export")
	r := d.mustCtl(nil, "export", root, "--to", dest, "--preserve-privileged")
	if !strings.Contains(r.stdout, root) {
		t.Errorf("export output: %s", r.stdout)
	}
	compareTrees(t, src, dest)

	// The destination must be new or empty.
	r = d.ctl(nil, "-o", "json", "export", root, "--to", dest)
	if r.code != 6 {
		t.Fatalf("export into a non-empty dir: exit %d, want 6 (failed_precondition): %s", r.code, r.stderr)
	}
	jsonErr(t, r, "failed_precondition")
}

// TestTarZstRoundTrip: export to .tar.zst, import the file (daemon side)
// and the decompressed stream (stdin): the same root every time.
func TestTarZstRoundTrip(t *testing.T) {
	src := fixture(t)
	d := startDaemon(t)
	root := strings.TrimSpace(d.mustCtl(nil, "import", src).stdout)
	dir := t.TempDir()
	out := filepath.Join(dir, "root.tar.zst")

	r := d.mustCtl(nil, "-o", "json", "export", root, "--to", out, "--preserve-privileged")
	m := jsonObject(t, r.stdout)
	if m["root_id"] != root || m["format"] != "zstd" || m["to"] != out {
		t.Fatalf("export -o json: %v", m)
	}
	if m["provenance"] != out+".provenance.json" {
		t.Fatalf("export -o json: provenance %v", m["provenance"])
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 2 {
		t.Fatalf("export left %d entries in %s, want just the file and its provenance record", len(ents), dir)
	}
	d.mustCtl(nil, "verify-provenance", out+".provenance.json")
	if got := strings.TrimSpace(d.mustCtl(nil, "import", out).stdout); got != root {
		t.Fatalf("import of the .tar.zst: %s, want %s", got, root)
	}
	plain, err := exec.Command("zstd", "-dc", out).Output()
	if err != nil {
		t.Fatalf("zstd -dc: %v", err)
	}
	if got := strings.TrimSpace(d.mustCtl(bytes.NewReader(plain), "import", "-").stdout); got != root {
		t.Fatalf("import of the decompressed stream: %s, want %s", got, root)
	}
	// GNU tar reads it and extracts the same tree.
	x := filepath.Join(dir, "x")
	if err := os.Mkdir(x, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("tar", "--xattrs", "--xattrs-include=*", "--numeric-owner", "-C", x, "-xpf", out).CombinedOutput(); err != nil {
		t.Fatalf("tar -x: %v\n%s", err, out)
	}
	compareTrees(t, src, x)
	// And --to - writes the same tar to stdout.
	r = d.mustCtl(nil, "export", root, "--to", "-", "--preserve-privileged")
	if r.stdout != string(plain) {
		t.Fatalf("export --to -: %d bytes, the file holds %d", len(r.stdout), len(plain))
	}
}

func TestErrorsAsJSONWithExitCodes(t *testing.T) {
	d := startDaemon(t)
	unknown := cas.Sum([]byte("never stored")).String()
	to := filepath.Join(t.TempDir(), "out")
	tests := []struct {
		name string
		args []string
		exit int
		code string
	}{
		{"unknown id", []string{"-o", "json", "export", unknown, "--to", to}, 3, "not_found"},
		{"unknown id, flags last", []string{"export", unknown, "--to", to, "-o", "json"}, 3, "not_found"},
		{"malformed id", []string{"-o", "json", "export", "not-an-id", "--to", to}, 2, "invalid_argument"},
		{"malformed id to tar", []string{"-o", "json", "export", "xyz", "--to", to + ".tar"}, 2, "invalid_argument"},
		{"usage", []string{"-o", "json", "import"}, 2, "invalid_argument"},
		{"unknown flag", []string{"-o", "json", "fsck", "--repair"}, 2, "invalid_argument"},
		{"missing source", []string{"-o", "json", "import", "/nonexistent/esf/src"}, 3, "not_found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := d.ctl(nil, tt.args...)
			if r.code != tt.exit {
				t.Errorf("exit %d, want %d (%s)", r.code, tt.exit, r.stderr)
			}
			if r.stdout != "" {
				t.Errorf("stdout on error: %q", r.stdout)
			}
			jsonErr(t, r, tt.code)
		})
	}
	if _, err := os.Lstat(to); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("failed exports created %s", to)
	}

	// A daemon that is not there is exit 11, unavailable.
	cmd := exec.Command(esfctlBin, "-o", "json", "--socket", filepath.Join(t.TempDir(), "no.sock"), "status")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 11 {
		t.Fatalf("status without a daemon: %v, want exit 11", err)
	}
	jsonErr(t, result{stderr: stderr.String()}, "unavailable")
}

// objectFile is where the disk store keeps object id.
func objectFile(t *testing.T, d *daemon, id cas.ID) string {
	t.Helper()
	h := id.String()
	p := filepath.Join(d.state, "cas", "objects", h[:2], h[2:])
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("object %s not found under %s/cas/objects: %v", h, d.state, err)
	}
	return p
}

// TestFsckAndCorruptContent flips one byte of a stored blob: fsck reports
// exactly that object with the corrupt exit status, and no export serves the
// damaged content.
func TestFsckAndCorruptContent(t *testing.T) {
	src := fixture(t)
	d := startDaemon(t)
	root := strings.TrimSpace(d.mustCtl(nil, "import", src).stdout)
	clean := jsonObject(t, d.mustCtl(nil, "-o", "json", "fsck").stdout)
	if bad := clean["bad"].([]any); len(bad) != 0 || clean["checked"].(float64) != objects(t, d) {
		t.Fatalf("fsck of a clean store: %v", clean)
	}

	id := cas.Sum(readmeContent)
	p := objectFile(t, d, id)
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/3] ^= 0x20
	if err := os.WriteFile(p, b, 0o444); err != nil {
		t.Fatal(err)
	}

	r := d.ctl(nil, "fsck")
	if r.code != 9 || !strings.Contains(r.stdout, "corrupt "+id.String()) {
		t.Fatalf("fsck: exit %d, want 9 listing %s\n%s%s", r.code, id, r.stdout, r.stderr)
	}
	r = d.ctl(nil, "-o", "json", "fsck")
	m := jsonObject(t, r.stdout)
	if r.code != 9 || !reflect.DeepEqual(m["bad"], []any{id.String()}) {
		t.Fatalf("fsck -o json: exit %d, %v", r.code, m)
	}
	jsonErr(t, r, "corrupt")

	// Exports fail rather than serve it, whatever the destination.
	dest := filepath.Join(t.TempDir(), "out")
	r = d.ctl(nil, "export", root, "--to", dest)
	if r.code != 9 {
		t.Fatalf("export to a dir: exit %d, want 9\n%s", r.code, r.stderr)
	}
	if _, err := os.Lstat(dest); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a failed export left its destination behind: %v", err)
	}
	tarDir := t.TempDir()
	r = d.ctl(nil, "export", root, "--to", filepath.Join(tarDir, "x.tar.zst"))
	if r.code != 9 {
		t.Fatalf("export to a tar file: exit %d, want 9\n%s", r.code, r.stderr)
	}
	if ents, _ := os.ReadDir(tarDir); len(ents) != 0 {
		t.Fatalf("a failed tar export left %v", ents)
	}
	r = d.ctl(nil, "export", root, "--to", "-")
	if r.code != 9 {
		t.Fatalf("export to stdout: exit %d, want 9", r.code)
	}
	// Its member is cut short (see fabric.holdLast): never whole.
	if strings.Contains(r.stdout, string(b)) {
		t.Fatal("the corrupt content reached stdout whole")
	}
}

// TestSIGTERM: the daemon stops cleanly, removes its socket, logs JSON,
// and its state survives a restart.
func TestSIGTERM(t *testing.T) {
	d := startDaemon(t)
	fix := filepath.Join(t.TempDir(), "small")
	if err := os.MkdirAll(filepath.Join(fix, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(fix, "d", "f"), []byte("persist me"), 0o644); err != nil {
		t.Fatal(err)
	}
	root := strings.TrimSpace(d.mustCtl(nil, "import", fix).stdout)
	count := objects(t, d)

	start := time.Now()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("esfd did not exit after SIGTERM")
	}
	if d.err != nil {
		t.Fatalf("esfd exit: %v\n%s", d.err, d.logs.String())
	}
	t.Logf("stopped in %v", time.Since(start))
	if _, err := os.Lstat(d.socket); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("socket left behind: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(d.logs.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil || rec["msg"] == nil || rec["level"] == nil {
			t.Fatalf("log line is not structured JSON: %q", line)
		}
	}
	if !strings.Contains(d.logs.String(), `"msg":"stopped"`) {
		t.Error("no clean stop in the log")
	}

	again := startDaemon(t, d.state)
	if n := objects(t, again); n != count {
		t.Fatalf("after restart: %v objects, want %v", n, count)
	}
	dest := filepath.Join(t.TempDir(), "out")
	again.mustCtl(nil, "export", root, "--to", dest)
	if b, err := os.ReadFile(filepath.Join(dest, "d", "f")); err != nil || string(b) != "persist me" {
		t.Fatalf("after restart: %q, %v", b, err)
	}
}
