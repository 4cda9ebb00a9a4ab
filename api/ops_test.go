package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/esf-dev/esf/api/client"
	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/fabric"
)

// TestCollectEndpoint: a root no node holds is garbage; a dry run counts it
// and keeps it, a real collection deletes it, and an empty body is the
// default request.
func TestCollectEndpoint(t *testing.T) {
	h := newHarness(t, 5*time.Second)
	ctx := context.Background()
	res, err := h.client.Import(ctx, newSource(t, map[string]string{"a.txt": "alpha", "d/b.txt": "beta"}), client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dry, err := h.client.Collect(ctx, v1.CollectRequest{DryRun: true}, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !dry.DryRun || dry.Deleted == 0 || dry.Examined < dry.Deleted {
		t.Fatalf("dry run: %+v", dry)
	}
	if _, err := h.client.ExportTar(ctx, res.RootID.String(), io.Discard); err != nil {
		t.Fatalf("a dry run deleted the root: %v", err)
	}
	status, body, _ := h.rawJSON(t, "/v1/gc", "", "")
	if status != http.StatusOK {
		t.Fatalf("gc with an empty body: %d %s", status, body)
	}
	var rep fabric.CollectReport
	if err := json.Unmarshal(body, &rep); err != nil || rep.DryRun || rep.Deleted != dry.Deleted {
		t.Fatalf("gc: %s (%v), want %d deleted", body, err, dry.Deleted)
	}
	if _, err := h.client.ExportTar(ctx, res.RootID.String(), io.Discard); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("export of a collected root: %v", err)
	}
	if status, body, _ := h.rawJSON(t, "/v1/gc", "", `{"dry":true}`); status != http.StatusBadRequest {
		t.Fatalf("gc with an unknown field: %d %s", status, body)
	}
}

// sealChild forks parent, writes files in an attempt on the child and
// seals it; it returns the child's node id.
func sealChild(t *testing.T, h *harness, parent string, files map[string]string) string {
	t.Helper()
	ctx := context.Background()
	fork, err := h.client.Fork(ctx, v1.ForkRequest{NodeID: parent}, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	child := fork.Nodes[0].NodeID
	a, err := h.client.Activate(ctx, v1.ActivateRequest{NodeID: child}, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	writeTree(t, a.Root, files)
	if _, err := h.client.Suspend(ctx, v1.SuspendRequest{AttemptID: a.AttemptID}, client.CallOptions{}); err != nil {
		t.Fatal(err)
	}
	return child
}

// TestMergeDiffPatch: a conflicting merge names its paths in the error
// body and the client's error; a clean one seals a node whose diff and
// patch against each input show exactly the other's changes.
func TestMergeDiffPatch(t *testing.T) {
	h := newHarness(t, 5*time.Second, onFakes)
	ctx := context.Background()
	g, err := h.client.CreateGroup(ctx, v1.CreateGroupRequest{Source: newSource(t, map[string]string{"a.txt": "base\n"})}, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	root := g.Node.NodeID
	x := sealChild(t, h, root, map[string]string{"a.txt": "x\n", "same.txt": "s\n"})
	y := sealChild(t, h, root, map[string]string{"a.txt": "y\n", "same.txt": "s\n", "z/y.txt": "why\n"})
	c := sealChild(t, h, root, map[string]string{"c.txt": "sea\n"})

	_, err = h.client.Merge(ctx, v1.MergeRequest{Nodes: []string{x, y}}, client.CallOptions{})
	var pe *client.PathsError
	if !errors.As(err, &pe) || !errors.Is(err, errdefs.ErrConflict) || strings.Join(pe.Paths, ",") != "a.txt" {
		t.Fatalf("conflicting merge: %v (%#v)", err, pe)
	}
	status, body, _ := h.rawJSON(t, "/v1/merge", "", `{"nodes":["`+x+`","`+y+`"]}`)
	var cb struct {
		Code    errdefs.Code `json:"code"`
		Message string       `json:"message"`
		Paths   []string     `json:"paths"`
	}
	if err := json.Unmarshal(body, &cb); err != nil || status != http.StatusConflict || cb.Code != errdefs.CodeConflict ||
		cb.Message == "" || len(cb.Paths) != 1 || cb.Paths[0] != "a.txt" {
		t.Fatalf("conflict body: %d %s", status, body)
	}

	m, err := h.client.Merge(ctx, v1.MergeRequest{Nodes: []string{x, c}, LogicalState: json.RawMessage(`{"m":1}`)}, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if m.Base != root || len(m.Node.Parents) != 2 {
		t.Fatalf("merge: %+v", m)
	}
	d, err := h.client.Diff(ctx, x, m.Node.NodeID, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Directory mtimes differ between trees written at different times:
	// only content changes are compared.
	if got := contentChanges(d); d.B != m.Node.RootID || strings.Join(got, ",") != "added c.txt" {
		t.Fatalf("diff x→merged: %v (%+v)", got, d)
	}
	// Root ids work as well as node ids, and a directory added is expanded.
	d, err = h.client.Diff(ctx, m.Node.RootID, y, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := contentChanges(d), "modified a.txt,deleted c.txt,added z,added z/y.txt"; strings.Join(got, ",") != want {
		t.Fatalf("diff merged→y: %v, want %s", got, want)
	}

	var patch bytes.Buffer
	pr, err := h.client.Patch(ctx, root, m.Node.NodeID, &patch)
	if err != nil {
		t.Fatal(err)
	}
	p := patch.String()
	if pr.RootID != m.Node.RootID || pr.Bytes != int64(len(p)) ||
		!strings.Contains(p, "diff --git a/a.txt b/a.txt") || !strings.Contains(p, "+x") ||
		!strings.Contains(p, "diff --git a/c.txt b/c.txt") || !strings.Contains(p, "+sea") || strings.Contains(p, "z/y.txt") {
		t.Fatalf("patch base→merged (%+v):\n%s", pr, p)
	}
	patch.Reset()
	if _, err := h.client.Patch(ctx, x, x, &patch); err != nil || patch.Len() != 0 {
		t.Fatalf("patch of a tree against itself: %q, %v", patch.String(), err)
	}
}

func contentChanges(d *v1.DiffResponse) []string {
	var got []string
	for _, ch := range d.Changes {
		if ch.Kind != "meta_changed" {
			got = append(got, ch.Kind+" "+ch.Path)
		}
	}
	return got
}

func TestDiffPatchQueryErrors(t *testing.T) {
	h := newHarness(t, 5*time.Second)
	res, err := h.client.Import(context.Background(), newSource(t, map[string]string{"a": "1"}), client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := res.RootID.String()
	for _, c := range []struct {
		path string
		code errdefs.Code
	}{
		{"/v1/diff?a=" + r, errdefs.CodeInvalidArgument},
		{"/v1/diff?a=" + r + "&b=" + r + "&b=" + r, errdefs.CodeInvalidArgument},
		{"/v1/diff?a=" + r + "&b=node_0000000000000000000000000a", errdefs.CodeNotFound},
		{"/v1/diff?a=" + r + "&b=zz", errdefs.CodeInvalidArgument},
		{"/v1/patch?base=" + r, errdefs.CodeInvalidArgument},
		{"/v1/patch?base=" + strings.Repeat("0", len(r)) + "&id=" + r, errdefs.CodeNotFound},
		{"/v1/provenance/" + r + "?format=zip", errdefs.CodeInvalidArgument},
		{"/v1/provenance/" + r + "?format=tar&colour=red", errdefs.CodeInvalidArgument},
	} {
		resp := h.raw(t, "GET", c.path, "", nil, nil)
		b, _ := io.ReadAll(resp.Body)
		if got := errorCode(t, b); got != c.code || resp.StatusCode != HTTPStatus(c.code) {
			t.Errorf("GET %s: %d %s, want %s", c.path, resp.StatusCode, b, c.code)
		}
	}
}

// TestProvenanceEndpoints: a server-side export writes a record that
// verifies; a fetched record for a client-side tar verifies; an altered
// one does not.
func TestProvenanceEndpoints(t *testing.T) {
	h := newHarness(t, 5*time.Second)
	ctx := context.Background()
	g, err := h.client.CreateGroup(ctx, v1.CreateGroupRequest{Source: newSource(t, map[string]string{"a.txt": "alpha", "d/b.txt": "beta"})}, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	to := filepath.Join(t.TempDir(), "out")
	ex, err := h.client.ExportNode(ctx, v1.ExportNodeRequest{ID: g.Node.NodeID, To: to, Artifact: "d"}, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(to, "b.txt")); err != nil || string(b) != "beta" {
		t.Fatalf("artifact export: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(to, "a.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("artifact export wrote the whole tree: %v", err)
	}
	if ex.Provenance != to+".provenance.json" || ex.Record.NodeID != g.Node.NodeID || ex.Record.Export.Artifact != "d" {
		t.Fatalf("export-node: %+v", ex)
	}
	written, err := os.ReadFile(ex.Provenance)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := h.client.VerifyProvenance(ctx, written, client.CallOptions{})
	if err != nil || !rep.Valid {
		t.Fatalf("verify the written record: %+v, %v", rep, err)
	}

	rec, err := h.client.Provenance(ctx, g.Node.NodeID, v1.ExportInfo{Format: "tar", Destination: "/tmp/x.tar"}, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rec.RootID != g.Node.RootID || rec.Export.Format != "tar" || rec.Export.Destination != "/tmp/x.tar" || rec.MAC == "" {
		t.Fatalf("provenance: %+v", rec)
	}
	b, _ := json.Marshal(rec)
	if rep, err := h.client.VerifyProvenance(ctx, b, client.CallOptions{}); err != nil || !rep.Valid {
		t.Fatalf("verify the fetched record: %+v, %v", rep, err)
	}
	rec.Export.Destination = "/tmp/y.tar"
	b, _ = json.Marshal(rec)
	if rep, err := h.client.VerifyProvenance(ctx, b, client.CallOptions{}); err != nil || rep.Valid || len(rep.Problems) == 0 {
		t.Fatalf("verify an altered record: %+v, %v", rep, err)
	}
	if status, body, _ := h.rawJSON(t, "/v1/verify-provenance", "", `{"version":`); status != http.StatusBadRequest {
		t.Fatalf("verify a truncated record: %d %s", status, body)
	}
}
