package e2e

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

// TestMergeDiffGC drives the content verbs through the real binaries: a
// conflicting merge exits 4 and lists the path on stderr; a clean merge
// prints the new node, whose diff against an input is the other input's
// change; an export of it has a record that verifies; gc keeps what the
// graph holds.
func TestMergeDiffGC(t *testing.T) {
	requireFUSE(t)
	d := startDaemon(t)
	g := createGroup(t, d, smallTree(t, d, map[string]string{"a.txt": "base\n"}))
	kids := fork(t, d, g.Node.NodeID, 3)
	for i, files := range []map[string]string{
		{"a.txt": "x\n"},
		{"a.txt": "y\n"},
		{"c.txt": "sea\n"},
	} {
		a := activate(t, d, kids[i])
		for p, data := range files {
			writeFile(t, filepath.Join(a.Root, p), data)
		}
		suspend(t, d, a.AttemptID)
	}

	r := d.ctl(nil, "merge", kids[0], kids[1])
	if r.code != 4 || !strings.Contains(r.stderr, "a.txt\n") || !strings.Contains(r.stderr, "(conflict)") {
		t.Fatalf("conflicting merge: exit %d\n%s", r.code, r.stderr)
	}
	r = d.ctl(nil, "-o", "json", "merge", kids[0], kids[1])
	var body struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(r.stderr), &body); err != nil || r.code != 4 || body.Error.Code != "conflict" {
		t.Fatalf("conflicting merge -o json: exit %d %s (%v)", r.code, r.stderr, err)
	}

	r = d.mustCtl(nil, "merge", kids[0], kids[2])
	merged := strings.TrimSpace(r.stdout)
	if !strings.HasPrefix(merged, "node_") {
		t.Fatalf("merge printed %q", r.stdout)
	}
	r = d.mustCtl(nil, "diff", kids[0], merged)
	if !strings.Contains(r.stdout, "A c.txt\n") || strings.Contains(r.stdout, "a.txt") {
		t.Fatalf("diff input→merged:\n%s", r.stdout)
	}

	dest := filepath.Join(t.TempDir(), "out")
	d.mustCtl(nil, "export", merged, "--to", dest)
	if got := readFile(t, filepath.Join(dest, "a.txt")) + readFile(t, filepath.Join(dest, "c.txt")); got != "x\nsea\n" {
		t.Fatalf("merged tree: %q", got)
	}
	d.mustCtl(nil, "verify-provenance", dest+".provenance.json")

	d.mustCtl(nil, "gc")
	dest2 := filepath.Join(t.TempDir(), "again")
	d.mustCtl(nil, "export", merged, "--to", dest2)
	if got := readFile(t, filepath.Join(dest2, "c.txt")); got != "sea\n" {
		t.Fatalf("after gc: %q", got)
	}
}
