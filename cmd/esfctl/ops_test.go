package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/fabric"
	"github.com/esf-dev/esf/internal/testenv"
)

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for p, c := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDiffPatchProvenanceVerbs: diff prints one line per change; a patch
// file applies with git to the base's export and gives the other tree; its
// provenance record verifies, and an altered one exits 9.
func TestDiffPatchProvenanceVerbs(t *testing.T) {
	sock := daemon(t)
	work := t.TempDir()
	a, b := filepath.Join(work, "a"), filepath.Join(work, "b")
	writeFiles(t, a, map[string]string{"keep": "k\n", "mod": "one\n", "gone": "g\n"})
	writeFiles(t, b, map[string]string{"keep": "k\n", "mod": "two\n", "new/x": "x\n"})
	// Same times on both sides, so only content differs.
	for _, d := range []string{a, b} {
		if out, err := exec.Command("touch", "-h", "-d", "2020-01-01", d).CombinedOutput(); err != nil {
			t.Fatalf("touch: %v %s", err, out)
		}
	}
	if err := os.Chmod(filepath.Join(b, "keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	ra := strings.TrimSpace(esfctl(t, sock, nil, "import", a).stdout)
	rb := strings.TrimSpace(esfctl(t, sock, nil, "import", b).stdout)

	r := esfctl(t, sock, nil, "diff", ra, rb)
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		if !strings.HasPrefix(l, "m /") { // the root's mtime
			lines = append(lines, l)
		}
	}
	if want := "D gone,m keep,M mod,A new,A new/x"; r.status != 0 || strings.Join(lines, ",") != want {
		t.Fatalf("diff: %+v, want %s", r, want)
	}

	patch := filepath.Join(work, "a-b.patch")
	r = esfctl(t, sock, nil, "export", rb, "--format", "patch", "--base", ra, "--to", patch)
	if r.status != 0 {
		t.Fatalf("export patch: %+v", r)
	}
	if testenv.Has(t, "cmd:git") { // the patch applies with git apply (CI: required)
		tree := filepath.Join(work, "apply")
		if r := esfctl(t, sock, nil, "export", ra, "--to", tree); r.status != 0 {
			t.Fatalf("export base: %+v", r)
		}
		if out, err := exec.Command("git", "-C", tree, "apply", patch).CombinedOutput(); err != nil {
			t.Fatalf("git apply: %v\n%s", err, out)
		}
		for p, want := range map[string]string{"mod": "two\n", "new/x": "x\n"} {
			if got, err := os.ReadFile(filepath.Join(tree, p)); err != nil || string(got) != want {
				t.Errorf("%s after git apply: %q, %v", p, got, err)
			}
		}
		if _, err := os.Stat(filepath.Join(tree, "gone")); !os.IsNotExist(err) {
			t.Errorf("gone survived the patch: %v", err)
		}
	}
	prov := patch + ".provenance.json"
	r = esfctl(t, sock, nil, "verify-provenance", prov)
	if r.status != 0 {
		t.Fatalf("verify-provenance: %+v", r)
	}
	var rec fabric.ProvenanceRecord
	raw, _ := os.ReadFile(prov)
	if err := json.Unmarshal(raw, &rec); err != nil || rec.Export.Format != "patch" || rec.Export.Base != ra || rec.RootID != rb || rec.Export.Destination != patch {
		t.Fatalf("patch provenance: %+v, %v", rec, err)
	}
	rec.RootID = ra
	raw, _ = json.Marshal(rec)
	forged := filepath.Join(work, "forged.json")
	if err := os.WriteFile(forged, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	r = esfctl(t, sock, nil, "verify-provenance", forged)
	if r.status != 9 || r.stdout == "" {
		t.Fatalf("verify a forged record: %+v", r)
	}

	// A patch to stdout writes a record only when asked where.
	r = esfctl(t, sock, nil, "export", rb, "--format", "patch", "--base", ra, "--to", "-", "--provenance", filepath.Join(work, "p.json"))
	if patchBytes, _ := os.ReadFile(patch); r.status != 0 || r.stdout != string(patchBytes) {
		t.Fatalf("patch to stdout: %+v", r)
	}
	if r := esfctl(t, sock, nil, "verify-provenance", filepath.Join(work, "p.json")); r.status != 0 {
		t.Fatalf("verify the stdout patch's record: %+v", r)
	}
}

func TestOpsVerbsUsageAndErrors(t *testing.T) {
	sock := daemon(t)
	dir := t.TempDir()
	unknownAttempt := "att_0000000000000000000000000a"
	for _, c := range []struct {
		name   string
		args   []string
		status int
		code   errdefs.Code
	}{
		{"merge of one node", []string{"-o", "json", "merge", "node_1"}, 2, errdefs.CodeInvalidArgument},
		{"diff of one id", []string{"-o", "json", "diff", "abc"}, 2, errdefs.CodeInvalidArgument},
		{"patch without base", []string{"-o", "json", "export", "abc", "--format", "patch", "--to", "-"}, 2, errdefs.CodeInvalidArgument},
		{"artifact to a tar", []string{"-o", "json", "export", "abc", "--artifact", "d", "--to", filepath.Join(dir, "x.tar")}, 2, errdefs.CodeInvalidArgument},
		{"verify a missing file", []string{"-o", "json", "verify-provenance", filepath.Join(dir, "none")}, 3, errdefs.CodeNotFound},
		{"exec without command", []string{"-o", "json", "exec", unknownAttempt}, 2, errdefs.CodeInvalidArgument},
		{"exec bad env", []string{"-o", "json", "exec", "--env", "NOEQ", unknownAttempt, "--", "true"}, 2, errdefs.CodeInvalidArgument},
		{"exec in an unknown attempt", []string{"-o", "json", "exec", unknownAttempt, "--timeout", "1s", "--", "ls", "-l"}, 3, errdefs.CodeNotFound},
	} {
		r := esfctl(t, sock, nil, c.args...)
		if r.status != c.status || jsonError(t, r).Code != c.code {
			t.Errorf("%s: %+v, want exit %d (%s)", c.name, r, c.status, c.code)
		}
	}

	r := esfctl(t, sock, nil, "gc", "--dry-run")
	if r.status != 0 || !strings.Contains(r.stdout, "would delete") || !strings.Contains(r.stdout, "bytes reclaimed") {
		t.Fatalf("gc --dry-run: %+v", r)
	}
	r = esfctl(t, sock, nil, "-o", "json", "gc")
	var rep fabric.CollectReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || r.status != 0 || rep.DryRun {
		t.Fatalf("gc -o json: %+v, %v", r, err)
	}
}
