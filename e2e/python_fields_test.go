package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/internal/testenv"
)

// pythonDump prints, as JSON, the fields of every record of the Python
// client (the dataclasses of esf.records, and the properties of
// ProvenanceRecord) and the parameters of every public Client method.
const pythonDump = `
import dataclasses, inspect, json, sys
sys.path.insert(0, sys.argv[1])
import esf, esf.errors
from esf import records
recs = {n: [f.name for f in dataclasses.fields(c)] for n, c in vars(records).items()
        if isinstance(c, type) and dataclasses.is_dataclass(c) and c.__module__ == records.__name__}
recs["ProvenanceRecord"] = [n for n, v in vars(records.ProvenanceRecord).items() if isinstance(v, property)]
params = {n: list(inspect.signature(f).parameters)[1:] for n, f in vars(esf.Client).items()
          if not n.startswith("_") and callable(f)}
print(json.dumps({"records": recs, "params": params,
                  "errors": {c: k.__name__ for c, k in esf.errors.CLASSES.items()}}))
`

// TestPython_RecordFields: the Python client's records carry every field of
// the /v1 types they decode, under the same names, and its methods take
// every field of the requests they send: what the API gains, the client
// must gain too.
func TestPython_RecordFields(t *testing.T) {
	testenv.Require(t, "cmd:python3")
	out, err := exec.Command("python3", "-c", pythonDump, filepath.Join("..", "clients", "python")).Output()
	if err != nil {
		t.Fatalf("python3: %v", err)
	}
	var py struct {
		Records map[string][]string
		Params  map[string][]string
		Errors  map[string]string // code -> class name
	}
	if err := json.Unmarshal(out, &py); err != nil {
		t.Fatal(err)
	}

	records := map[string]any{
		"Status": v1.StatusResponse{}, "RemoteStatus": v1.RemoteStatus{}, "Worker": v1.Worker{},
		"Workers": v1.WorkersResponse{}, "ImportResult": v1.ImportResponse{}, "FsckResult": v1.FsckResponse{},
		"Group": v1.Group{}, "GroupView": v1.GroupView{}, "Provenance": v1.Provenance{}, "Node": v1.Node{},
		"Lease": v1.Lease{}, "Evaluation": v1.Evaluation{}, "NodeView": v1.NodeView{},
		"AttemptRuntime": v1.AttemptRuntime{}, "AttemptView": v1.AttemptView{}, "Inspection": v1.Inspection{},
		"CreateGroupResult": v1.CreateGroupResult{}, "Tree": v1.TreeResponse{}, "ForkResult": v1.ForkResult{},
		"PruneResult": v1.PruneResult{}, "SuspendResult": v1.SuspendResult{}, "MergeResult": v1.MergeResult{},
		"EvidenceResult": v1.EvidenceResponse{}, "Change": v1.Change{}, "DiffResult": v1.DiffResponse{},
		"ProvenanceRecord": v1.ProvenanceRecord{}, "ProvenanceReport": v1.ProvenanceReport{},
		"Problem": v1.ProvenanceProblem{}, "CollectReport": v1.CollectReport{},
		"RemoteCollectReport": v1.RemoteCollectReport{}, "MountResult": v1.MountResult{}, "Event": v1.Event{},
		"ExecResult": v1.ExecResult{}, "Dropped": v1.Dropped{}, "ExportResult": v1.ExportNodeResult{},
	}
	// Python names where the JSON name cannot be an attribute.
	renamed := map[string]string{"self": "self_"}
	for name, typ := range records {
		have, ok := py.Records[name]
		if !ok {
			t.Errorf("esf.%s: no such record", name)
			continue
		}
		for _, f := range jsonFields(reflect.TypeOf(typ)) {
			if r, ok := renamed[f]; ok {
				f = r
			}
			if !slices.Contains(have, f) {
				t.Errorf("esf.%s lacks %q of %T", name, f, typ)
			}
		}
	}
	for name := range py.Records {
		if _, ok := records[name]; !ok && name != "TreeNode" && name != "Chunk" {
			t.Errorf("esf.%s: a record this test does not compare with a /v1 type", name)
		}
	}

	requests := map[string]any{
		"create_group": v1.CreateGroupRequest{}, "fork": v1.ForkRequest{}, "promote": v1.PromoteRequest{},
		"evaluate": v1.EvaluateRequest{}, "prune": v1.PruneRequest{}, "merge": v1.MergeRequest{},
		"activate": v1.ActivateRequest{}, "release": v1.ReleaseRequest{}, "retry": v1.RetryRequest{},
		"renew": v1.RenewRequest{}, "suspend": v1.SuspendRequest{}, "mount": v1.MountRequest{},
		"umount": v1.UmountRequest{}, "exec_stream": v1.ExecRequest{}, "export": v1.ExportNodeRequest{},
		"gc": v1.CollectRequest{}, "fsck": v1.FsckRequest{}, "import_source": v1.ImportRequest{},
	}
	// Parameters named after what they take (a record or its id).
	param := map[string]string{"node_id": "node", "attempt_id": "attempt", "group_id": "group",
		"remote_grace_seconds": "remote_grace"}
	for method, typ := range requests {
		have, ok := py.Params[method]
		if !ok {
			t.Errorf("esf.Client.%s: no such method", method)
			continue
		}
		for _, f := range jsonFields(reflect.TypeOf(typ)) {
			if p, ok := param[f]; ok {
				f = p
			}
			if !slices.Contains(have, f) {
				t.Errorf("esf.Client.%s takes no %q (%T)", method, f, typ)
			}
		}
	}
	// The exec stream's frames: stdin and a terminal; exec takes the rest.
	for _, p := range py.Params["exec_stream"] {
		if !slices.Contains(py.Params["exec"], p) && p != "tty" && p != "rows" && p != "cols" {
			t.Errorf("esf.Client.exec takes no %q (exec_stream does)", p)
		}
	}
}

// TestPython_ErrorClasses: one exception class of the Python client per
// error code of the API (the table of docs/openapi.yaml, every code of
// errdefs), and no class for a code the API does not have.
func TestPython_ErrorClasses(t *testing.T) {
	testenv.Require(t, "cmd:python3")
	out, err := exec.Command("python3", "-c", pythonDump, filepath.Join("..", "clients", "python")).Output()
	if err != nil {
		t.Fatalf("python3: %v", err)
	}
	var py struct{ Errors map[string]string }
	if err := json.Unmarshal(out, &py); err != nil {
		t.Fatal(err)
	}
	spec, err := os.ReadFile(filepath.Join("..", "docs", "openapi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var codes []string
	for _, m := range regexp.MustCompile(`(?m)^\s*\| ([a-z_]+)\s*\| (\d{3})\s*\|`).FindAllStringSubmatch(string(spec), -1) {
		codes = append(codes, m[1])
	}
	if len(codes) < 12 {
		t.Fatalf("docs/openapi.yaml: %d error codes in its table: %v", len(codes), codes)
	}
	for _, c := range codes {
		if errdefs.Class(errdefs.Code(c)) == nil && errdefs.Code(c) != errdefs.CodeInternal {
			t.Errorf("docs/openapi.yaml's code %q is not one of errdefs'", c)
		}
		cls, ok := py.Errors[c]
		if !ok {
			t.Errorf("esf: no exception class for the code %q", c)
			continue
		}
		want := ""
		for _, w := range strings.Split(c, "_") {
			want += strings.ToUpper(w[:1]) + w[1:]
		}
		if cls != want {
			t.Errorf("esf: the class of %q is %s, want %s", c, cls, want)
		}
	}
	for c := range py.Errors {
		if !slices.Contains(codes, c) {
			t.Errorf("esf.%s: a class for %q, which docs/openapi.yaml does not list", py.Errors[c], c)
		}
	}
}

// jsonFields lists the JSON names of a struct's fields, those of embedded
// structs included.
func jsonFields(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.Anonymous && name == "" {
			out = append(out, jsonFields(f.Type)...)
			continue
		}
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, name)
	}
	return out
}
