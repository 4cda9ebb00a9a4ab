package fabric

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/esf-dev/esf/executor"
	"github.com/esf-dev/esf/executor/runc"
	"github.com/esf-dev/esf/executor/runc/runctest"
	"github.com/esf-dev/esf/internal/testenv"
	"github.com/esf-dev/esf/journal"
)

// The schema audit (the spec's portability attribute): durable state holds
// no worker-local truth, so that any worker can take over the graph. What
// is worker-local: paths on the worker's disk (the state dir, attempt
// roots and deltas, mount dirs, an operator's bind-mount sources, the
// directory an import came from), inode and device numbers, mount ids,
// boot ids, host names as identity. It may live only in the runtime/
// records (AttemptRuntime), which recovery rebuilds or discards; an
// import's source path stays as the client's description (a node's
// Provenance.Source), never as identity.

// durableTypes maps each key prefix of the journal to the record type
// stored under it, with the JSON fields a value of it may carry that
// hold a caller's free data (checked for worker-local values, not names).
var durableTypes = map[string]reflect.Type{
	"group/":   reflect.TypeFor[journal.Group](),
	"node/":    reflect.TypeFor[journal.Node](),
	"attempt/": reflect.TypeFor[journal.Attempt](),
	"eval/":    reflect.TypeFor[journal.Evaluation](),
	"lease/":   reflect.TypeFor[journal.Lease](),
	"idem/":    reflect.TypeFor[journal.IdempotencyEntry](),
	"sys/ev/":  reflect.TypeFor[journal.Event](),
}

// Key prefixes that hold no record: index keys (empty values), counters,
// parts of recorded results (checked whole through their entry), the
// store's own keys, the worker-local runtime records, and the configuration
// workers of a cluster share (cfg/provenance-key: 32 random bytes),
// front doors' own records (front/, opaque to the fabric: package e2b
// checks what it keeps there), and sealed objects' redo records
// (store-redo/: object bytes, see storeredo.go).
var notRecords = []string{"idx/", "counter/", "idem-part/", "sys/evseq", "sys/schema", "runtime/", "cfg/", "front/", "store-redo/"}

// forbiddenFields are JSON field names that say worker-local truth.
var forbiddenFields = []string{"path", "mount", "mountpoint", "dir", "private_delta", "inode", "ino", "dev",
	"device", "mount_id", "mnt_id", "host", "hostname", "worker", "pid", "boot_id", "fd"}

// TestPortability_SchemaAuditStatic walks every durable record type's
// fields (and the types they nest): none is named like worker-local
// truth. A new field fails here until it is classified.
func TestPortability_SchemaAuditStatic(t *testing.T) {
	for prefix, typ := range durableTypes {
		for _, f := range jsonFields(typ, typ.Name()) {
			name := f[strings.LastIndexByte(f, '.')+1:]
			if slices.Contains(forbiddenFields, name) {
				t.Errorf("%s (under %s) is named like worker-local truth: keep it in AttemptRuntime", f, prefix)
			}
		}
	}
	// The one type made for worker-local truth is stored only under runtime/.
	for prefix, typ := range durableTypes {
		if typ == reflect.TypeFor[journal.AttemptRuntime]() {
			t.Errorf("AttemptRuntime is stored under %s", prefix)
		}
	}
}

// jsonFields lists the JSON names of typ's fields, nested ones dotted.
func jsonFields(typ reflect.Type, at string) []string {
	for typ.Kind() == reflect.Pointer || typ.Kind() == reflect.Slice {
		typ = typ.Elem()
	}
	if typ.Kind() != reflect.Struct || typ.PkgPath() == "time" {
		return nil
	}
	var out []string
	for f := range typ.Fields() {
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if f.Anonymous && name == "" {
			out = append(out, jsonFields(f.Type, at)...)
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, at+"."+name)
		out = append(out, jsonFields(f.Type, at+"."+name)...)
	}
	return out
}

// TestPortability_SchemaAudit drives every operation that writes the
// journal on a real fabric (runc with an operator bind mount, custom
// attempt roots, read-only and writable mounts, seals, evaluations,
// merges, promotion, pruning, retries, renewals), then reads every key of
// the journal: each is a known record type or index; no value outside the
// runtime records holds a path of this worker, its host name, or an inode,
// device or mount number. Then the import's source directory is deleted:
// the graph does not depend on it (it was a description, not identity).
func TestPortability_SchemaAudit(t *testing.T) {
	testenv.Require(t, "root", "fuse", "overlay", "runc", "busybox")
	ctx := context.Background()
	top := t.TempDir()
	host, _ := os.Hostname()
	tools := filepath.Join(top, "host-tools") // an operator's bind mount
	os.MkdirAll(tools, 0o755)
	os.WriteFile(filepath.Join(tools, "tool.sh"), []byte("echo tool"), 0o755)

	initBin, err := runctest.BuildInit(filepath.Join(top, "init"))
	if err != nil {
		t.Fatal(err)
	}
	ex, err := runc.New(runc.Options{StateDir: filepath.Join(top, "runc-state"), Init: initBin, Namespace: "esf-audit"})
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(top, "state")
	f, err := Open(ctx, Options{StateDir: state, Executor: ex,
		ContainerMounts: []executor.Mount{{Source: tools, Destination: "/opt/tools", ReadOnly: true}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.StopAll(context.Background()); err != nil {
			t.Errorf("StopAll: %v", err)
		}
		f.Close()
		if left, _ := ex.List(context.Background(), ""); len(left) != 0 {
			t.Errorf("containers left: %+v", left)
		}
		runctest.RemoveCgroupParents("esf-audit")
	})
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}

	// The graph: a busybox root imported from a host directory.
	src := filepath.Join(top, "import-src")
	must(runctest.Busybox(src))
	imp, err := f.Import(ctx, ImportSource{Path: src})
	must(err)
	g, err := f.CreateGroup(withKey("audit-group"), CreateGroupRequest{RootID: imp.Root.String(), Source: src})
	must(err)
	kids, err := f.Fork(withKey("audit-fork"), ForkRequest{NodeID: g.Node.NodeID, N: 3})
	must(err)
	a, b, c := kids.Nodes[0].NodeID, kids.Nodes[1].NodeID, kids.Nodes[2].NodeID

	// A runc attempt at a custom root, writing through the container.
	customRoot := filepath.Join(top, "custom-root")
	os.MkdirAll(customRoot, 0o755)
	av, err := f.Activate(withKey("audit-activate-runc"), ActivateRequest{NodeID: a, Executor: ExecutorRunc, Root: customRoot,
		Env: []string{"A=1"}, Workdir: "/", MemoryBytes: 128 << 20, Pids: 64})
	must(err)
	var out bytes.Buffer
	res, err := f.Exec(ctx, ExecRequest{AttemptID: av.AttemptID, Args: []string{"sh", "-c", "echo hi > /written; sh /opt/tools/tool.sh"}},
		ExecStreams{Stdout: &out})
	must(err)
	if res.ExitCode != 0 || out.String() != "tool\n" {
		t.Fatalf("exec: %d %q", res.ExitCode, out.String())
	}
	_, err = f.Renew(withKey("audit-renew"), RenewRequest{LeaseID: av.Lease.LeaseID, Token: av.Lease.Token})
	must(err)
	sealedA, err := f.Suspend(withKey("audit-seal-runc"), SuspendRequest{AttemptID: av.AttemptID})
	must(err)

	// An attempt without an executor, on the default root, written on
	// the host side, sealed keeping it running, then released.
	bv, err := f.Activate(withKey("audit-activate-none"), ActivateRequest{NodeID: b})
	must(err)
	must(os.WriteFile(filepath.Join(bv.Root, "from-host.txt"), []byte("b"), 0o644))
	sealedB, err := f.Suspend(withKey("audit-seal-none"), SuspendRequest{AttemptID: bv.AttemptID, KeepRunning: true})
	must(err)
	_, err = f.Release(withKey("audit-release"), ReleaseRequest{AttemptID: bv.AttemptID})
	must(err)

	// A failed attempt and its retry.
	cv, err := f.Activate(withKey("audit-activate-fail"), ActivateRequest{NodeID: c})
	must(err)
	f.failAttempt(ctx, cv.AttemptID, fmt.Errorf("made to fail by the audit"))
	rv, err := f.Retry(withKey("audit-retry"), RetryRequest{AttemptID: cv.AttemptID})
	must(err)
	_, err = f.Release(withKey("audit-release-retry"), ReleaseRequest{AttemptID: rv.AttemptID})
	must(err)

	// Mounts: read-only and writable, at custom directories.
	roDir, rwDir := filepath.Join(top, "ro-view"), filepath.Join(top, "rw-view")
	os.MkdirAll(roDir, 0o755)
	os.MkdirAll(rwDir, 0o755)
	_, err = f.Mount(withKey("audit-mount-ro"), MountRequest{NodeID: sealedA.Node.NodeID, Dir: roDir})
	must(err)
	rw, err := f.Mount(withKey("audit-mount-rw"), MountRequest{NodeID: sealedB.Node.NodeID, Dir: rwDir, RW: true})
	must(err)
	_, err = f.Umount(withKey("audit-umount-ro"), UmountRequest{Dir: roDir})
	must(err)
	_, err = f.Umount(withKey("audit-umount-rw"), UmountRequest{Dir: rwDir})
	must(err)
	_ = rw

	// Evaluate with evidence, merge, promote, prune.
	ev, _, err := f.Store().Put(ctx, bytes.NewReader([]byte("evidence")))
	must(err)
	_, err = f.Evaluate(withKey("audit-eval"), EvaluateRequest{Target: sealedA.Node.NodeID, Evaluator: "audit@1", Reward: 1,
		Verdict: "pass", Evidence: []string{ev.ID.String()}, Backprop: true})
	must(err)
	merged, err := f.Merge(withKey("audit-merge"), MergeRequest{Nodes: []string{sealedA.Node.NodeID, sealedB.Node.NodeID}})
	must(err)
	_, err = f.Promote(withKey("audit-promote"), PromoteRequest{GroupID: g.Group.GroupID, NodeID: merged.Node.NodeID, ExpectedGeneration: 1})
	must(err)
	_, err = f.Prune(withKey("audit-prune"), PruneRequest{NodeID: c})
	must(err)
	// Export to a host directory (recorded nowhere, but it must not be).
	_, _, err = f.ExportDir(ctx, sealedA.Node.NodeID, filepath.Join(top, "exported"))
	must(err)

	// A live attempt (its lease is a record too) while the journal is read.
	live, err := f.Activate(withKey("audit-activate-live"), ActivateRequest{NodeID: sealedB.Node.NodeID})
	must(err)

	// Worker-local values: every path this worker used, and its name.
	local := []string{top, state, src, tools, customRoot, roDir, rwDir, bv.Root, live.Root, f.projection.mnt}
	if len(host) >= 4 {
		local = append(local, host)
	}
	violations := auditJournal(t, f.journal, local)
	for _, v := range violations {
		t.Error(v)
	}

	_, err = f.Release(withKey("audit-release-live"), ReleaseRequest{AttemptID: live.AttemptID})
	must(err)

	// The import's directory was a description, not identity: the same
	// tree imported from another place is the same root, and once the
	// directory is gone the graph is whole and every operation works.
	moved := filepath.Join(top, "moved-src")
	must(os.Rename(src, moved))
	imp2, err := f.Import(ctx, ImportSource{Path: moved})
	must(err)
	if imp2.Root != imp.Root {
		t.Errorf("the tree imported from %s has root %s, from %s %s", moved, imp2.Root, src, imp.Root)
	}
	must(os.RemoveAll(moved))
	again, err := f.Fork(withKey("audit-fork-after"), ForkRequest{NodeID: g.Node.NodeID, N: 1})
	must(err)
	dv, err := f.Activate(withKey("audit-activate-after"), ActivateRequest{NodeID: again.Nodes[0].NodeID})
	must(err)
	if _, err := os.Stat(filepath.Join(dv.Root, "bin", "busybox")); err != nil {
		t.Errorf("the root imported from the removed directory: %v", err)
	}
	_, err = f.Release(withKey("audit-release-after"), ReleaseRequest{AttemptID: dv.AttemptID})
	must(err)
	var n journal.Node
	must(f.journal.View(ctx, func(r journal.Reader) error {
		var err error
		n, err = journal.GetNode(r, g.Node.NodeID)
		return err
	}))
	if n.RootID != imp.Root.String() || n.Provenance.Source != src {
		t.Errorf("root node: root %s (want %s), source %q (kept as the client's description)", n.RootID, imp.Root, n.Provenance.Source)
	}
}

// auditJournal reads every key of s and returns what breaks the schema
// audit: unknown key prefixes, and worker-local values outside runtime/.
func auditJournal(t *testing.T, s journal.Store, local []string) []string {
	t.Helper()
	var bad []string
	seen := map[string]int{}
	err := s.View(context.Background(), func(r journal.Reader) error {
		err := r.Scan(nil, nil, func(k, v []byte) error {
			key := string(k)
			if slices.ContainsFunc(notRecords, func(p string) bool { return strings.HasPrefix(key, p) }) {
				return nil // idem-part/ is checked whole with its entry, below
			}
			var prefix string
			for p := range durableTypes {
				if strings.HasPrefix(key, p) {
					prefix = p
				}
			}
			if prefix == "" {
				bad = append(bad, fmt.Sprintf("key %q: a durable record type the schema audit does not know", key))
				return nil
			}
			seen[prefix]++
			if prefix == "idem/" {
				e, err := journal.GetIdempotency(r, strings.TrimPrefix(key, prefix))
				if err != nil {
					return err
				}
				v = e.Result // the result whole, from its parts if it has them
				bad = append(bad, auditValue("idem "+e.Op+" result", v, local)...)
				return nil
			}
			bad = append(bad, auditValue(key, v, local)...)
			return nil
		})
		if err != nil {
			return err
		}
		return r.Events(0, func(ev journal.Event) error {
			seen["event"]++
			b, _ := json.Marshal(ev)
			bad = append(bad, auditValue(fmt.Sprintf("event %d %s", ev.Seq, ev.Type), b, local)...)
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"group/", "node/", "attempt/", "eval/", "lease/", "idem/", "event"} {
		if seen[p] == 0 {
			t.Errorf("the scenario wrote no %s record: the audit would not see one", p)
		}
	}
	return bad
}

// auditValue checks one JSON value: no string in it names a worker-local
// path or the host, and no field is named like an inode, device or mount
// number.
func auditValue(what string, b []byte, local []string) []string {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return []string{fmt.Sprintf("%s: not JSON: %v", what, err)}
	}
	var bad []string
	var walk func(at string, v any)
	walk = func(at string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				if slices.Contains(forbiddenFields, strings.ToLower(k)) {
					bad = append(bad, fmt.Sprintf("%s: field %s%s is worker-local truth: %v", what, at, k, e))
				}
				walk(at+k+".", e)
			}
		case []any:
			for _, e := range x {
				walk(at, e)
			}
		case string:
			if strings.HasSuffix(at, "provenance.source.") {
				return // the client's description of an import, not identity
			}
			for _, l := range local {
				if strings.Contains(x, l) {
					bad = append(bad, fmt.Sprintf("%s: %s holds %q, worker-local (%s)", what, strings.TrimSuffix(at, "."), x, l))
					break
				}
			}
		}
	}
	walk("", v)
	return bad
}
