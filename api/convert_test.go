package api

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/journal"
	"github.com/esf-dev/esf/treediff"
)

// fill sets every field reachable from v to a non-zero value, so a view
// that forgets a field encodes differently from its record.
func fill(t *testing.T, v reflect.Value, depth int) {
	switch v.Kind() {
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			v.Set(reflect.ValueOf(time.Date(2026, 12, 7, 13, 0, 0, 123, time.UTC)))
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(t, v.Field(i), depth)
			}
		}
	case reflect.Pointer:
		if depth > 4 {
			return
		}
		v.Set(reflect.New(v.Type().Elem()))
		fill(t, v.Elem(), depth+1)
	case reflect.Slice:
		if v.Type() == reflect.TypeFor[json.RawMessage]() {
			v.SetBytes([]byte(`{"k":1}`))
			return
		}
		s := reflect.MakeSlice(v.Type(), 2, 2)
		for i := range 2 {
			fill(t, s.Index(i), depth+1)
		}
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(t, k, depth+1)
		fill(t, e, depth+1)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.Array:
		for i := range v.Len() {
			fill(t, v.Index(i), depth)
		}
	case reflect.String:
		v.SetString("s-" + v.Type().Name())
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(7)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(3) // a valid cas.Type too (symlink)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(0.5)
	default:
		t.Fatalf("fill: kind %v of %v", v.Kind(), v.Type())
	}
}

func filled[T any](t *testing.T) T {
	var v T
	fill(t, reflect.ValueOf(&v).Elem(), 0)
	return v
}

// sameJSON checks that the view encodes byte for byte as the record it
// was made from, for a record with every field set and for the zero one.
func sameJSON[R, V any](t *testing.T, conv func(R) V) {
	t.Helper()
	var zero R
	for _, r := range []R{filled[R](t), zero} {
		want, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := json.Marshal(conv(r))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%T: view encodes as\n%s\nthe record as\n%s", r, got, want)
		}
	}
}

// sameRequest checks that a request view decodes what the record decoded.
func sameRequest[V, R any](t *testing.T, conv func(V) R) {
	t.Helper()
	r := filled[R](t)
	b, _ := json.Marshal(r)
	var v V
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	if got := conv(v); !reflect.DeepEqual(got, r) {
		t.Errorf("%T: decoded through the view as %+v, want %+v", r, got, r)
	}
}

// TestViewsEncodeAsRecords pins that /v1 (and esfctl -o json) did not
// change when the views moved to api/v1: every view encodes as the record
// it is made from.
func TestViewsEncodeAsRecords(t *testing.T) {
	sameJSON(t, inspection)
	sameJSON(t, treeView)
	sameJSON(t, createGroupResult)
	sameJSON(t, forkResult)
	sameJSON(t, mergeResult)
	sameJSON(t, suspendResult)
	sameJSON(t, mountResult)
	sameJSON(t, attemptView)
	sameJSON(t, collectReport)
	sameJSON(t, exportNodeResult)
	sameJSON(t, provenanceRecord)
	sameJSON(t, provenanceReport)
	sameJSON(t, groupView)
	sameJSON(t, leaseView)
	sameJSON(t, evaluationView)
	sameJSON(t, eventView)
	sameJSON(t, pruneResult)
	sameJSON(t, execResult)
	sameJSON(t, remoteStatus)
	sameJSON(t, droppedView)
	sameJSON(t, func(e cas.Entry) any { return entryView(e) })
	sameJSON(t, func(id cas.ID) any { return idView(id) })

	// The diff's change as the API wrote it before the views moved.
	c := filled[treediff.Change](t)
	c.Kind, c.Meta = treediff.Modified, treediff.Meta(1)
	want, _ := json.Marshal(struct {
		Path string     `json:"path"`
		Kind string     `json:"kind"`
		Meta string     `json:"meta,omitempty"`
		Old  *cas.Entry `json:"old,omitempty"`
		New  *cas.Entry `json:"new,omitempty"`
	}{c.Path, c.Kind.String(), c.Meta.String(), c.Old, c.New})
	if got, _ := json.Marshal(changeView(c)); !bytes.Equal(got, want) {
		t.Errorf("change: view encodes as\n%s\nwant\n%s", got, want)
	}
}

func TestRequestViewsDecodeAsRecords(t *testing.T) {
	sameRequest(t, createGroupRequest)
	sameRequest(t, forkRequest)
	sameRequest(t, promoteRequest)
	sameRequest(t, evaluateRequest)
	sameRequest(t, pruneRequest)
	sameRequest(t, activateRequest)
	sameRequest(t, suspendRequest)
	sameRequest(t, releaseRequest)
	sameRequest(t, retryRequest)
	sameRequest(t, renewRequest)
	sameRequest(t, mountRequest)
	sameRequest(t, umountRequest)
	sameRequest(t, execRequest)
	sameRequest(t, collectRequest)
	sameRequest(t, mergeRequest)
	sameRequest(t, exportNodeRequest)
}

// The runtime record an inspect shows keeps a runc attempt's container
// environment by its names only: the values (an E2B sandbox's envVars,
// API keys handed to it) are secrets, and /v1 inspect, esfctl and the UI
// show the record to anyone holding an API token.
func TestRuntimeViewHidesEnvValues(t *testing.T) {
	data := `{"base_root_id":"r1","container":{"env":["API_KEY=hunter2-secret","PATH=/usr/bin","BARE"],"workdir":"/w"},"ttl_ms":5}`
	v := runtimeView(journal.AttemptRuntime{AttemptID: "a1", Data: json.RawMessage(data)})
	if bytes.Contains(v.Data, []byte("hunter2")) || bytes.Contains(v.Data, []byte("/usr/bin")) {
		t.Fatalf("the view shows env values: %s", v.Data)
	}
	var got struct {
		BaseRootID string `json:"base_root_id"`
		TTL        int64  `json:"ttl_ms"`
		Container  struct {
			Env     []string `json:"env"`
			Workdir string   `json:"workdir"`
		} `json:"container"`
	}
	if err := json.Unmarshal(v.Data, &got); err != nil {
		t.Fatalf("view data %s: %v", v.Data, err)
	}
	if got.BaseRootID != "r1" || got.TTL != 5 || got.Container.Workdir != "/w" ||
		!reflect.DeepEqual(got.Container.Env, []string{"API_KEY", "PATH", "BARE"}) {
		t.Fatalf("view data %s lost more than the values", v.Data)
	}
	// Data without a container environment is shown as recorded.
	for _, d := range []string{`{"k":1}`, `{"container":{"workdir":"/w"}}`, `not json`} {
		if v := runtimeView(journal.AttemptRuntime{Data: json.RawMessage(d)}); string(v.Data) != d {
			t.Errorf("runtimeView(%s) = %s", d, v.Data)
		}
	}
}
