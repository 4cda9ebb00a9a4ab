package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/esf-dev/esf/api/internal/wire"
	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/fabric"
)

func TestDecodeRequestsStrict(t *testing.T) {
	tests := []struct {
		name string
		body string
		ok   bool
	}{
		{"valid", `{"source":"/data/x"}`, true},
		{"valid with spaces", " \n{\"source\" : \"/data/x\"}\n ", true},
		{"unknown field", `{"source":"/x","sorce":"/y"}`, false},
		{"typo only", `{"sorce":"/y"}`, false},
		{"trailing object", `{"source":"/x"}{}`, false},
		{"trailing garbage", `{"source":"/x"}x`, false},
		{"empty", ``, false},
		{"null", `null`, false}, // decodes, then the empty source is rejected
		{"wrong type", `{"source":1}`, false},
		{"array", `[]`, false},
		{"relative", `{"source":"data/x"}`, false},
		{"empty source", `{"source":""}`, false},
		{"nul byte", `{"source":"/a\u0000b"}`, false},
		{"huge", `{"source":"/` + strings.Repeat("a", maxJSONBody) + `"}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "/v1/import", strings.NewReader(tt.body))
			req, err := decodeImport(r)
			if tt.ok {
				if err != nil {
					t.Fatalf("decode: %v", err)
				}
				if req.Source != "/data/x" {
					t.Fatalf("source %q", req.Source)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("decode %q: %v, want invalid argument", tt.body, err)
			}
		})
	}
}

func TestDecodeFsckAcceptsEmptyBody(t *testing.T) {
	for _, body := range []string{"", "{}", " {} "} {
		r := httptest.NewRequest("POST", "/v1/fsck", strings.NewReader(body))
		if _, err := decodeFsck(r); err != nil {
			t.Errorf("fsck body %q: %v", body, err)
		}
	}
	r := httptest.NewRequest("POST", "/v1/fsck", strings.NewReader(`{"deep":true}`))
	if _, err := decodeFsck(r); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("fsck with an unknown option: %v", err)
	}
}

// decoders are every request decoder of the API, for the fuzz target. valid
// checks what an accepted request must satisfy (absolute clean host paths).
var decoders = []struct {
	name   string
	decode func(*http.Request) (any, error)
	valid  func(any) bool
}{
	{"import", anyDecoder(decodeImport), func(v any) bool { return cleanAbs(v.(v1.ImportRequest).Source) }},
	{"export", anyDecoder(decodeExport), func(v any) bool {
		r := v.(v1.ExportRequest)
		return r.ID != "" && cleanAbs(r.To)
	}},
	{"fsck", anyDecoder(decodeFsck), nil},
	{"groups", anyDecoder(decodeCreateGroup), func(v any) bool {
		r := v.(fabric.CreateGroupRequest)
		return r.RootID != "" || cleanAbs(r.Source)
	}},
	{"fork", anyDecoder(decodeFork), nil},
	{"promote", anyDecoder(decodePromote), nil},
	{"evaluate", anyDecoder(decodeEvaluate), nil},
	{"prune", anyDecoder(decodePrune), nil},
	{"activate", anyDecoder(decodeActivate), func(v any) bool {
		r := v.(fabric.ActivateRequest)
		return r.Root == "" || cleanAbs(r.Root)
	}},
	{"suspend", anyDecoder(decodeSuspend), nil},
	{"release", anyDecoder(decodeRelease), nil},
	{"retry", anyDecoder(decodeRetry), nil},
	{"renew", anyDecoder(decodeRenew), nil},
	{"mount", anyDecoder(decodeMount), func(v any) bool { return cleanAbs(v.(fabric.MountRequest).Dir) }},
	{"umount", anyDecoder(decodeUmount), func(v any) bool { return cleanAbs(v.(fabric.UmountRequest).Dir) }},
	{"gc", anyDecoder(decodeCollect), nil},
	{"merge", anyDecoder(decodeMerge), func(v any) bool {
		r := v.(fabric.MergeRequest)
		return r.Nodes == nil || len(r.Nodes) > 0
	}},
	{"export-node", anyDecoder(decodeExportNode), func(v any) bool {
		r := v.(fabric.ExportRequest)
		return r.ID != "" && cleanAbs(r.To) && (r.Provenance == "" || cleanAbs(r.Provenance))
	}},
	{"exec", anyDecoder(decodeExec), func(v any) bool {
		r := v.(fabric.ExecRequest)
		return len(r.Args) > 0 || r.Module != ""
	}},
}

func anyDecoder[T any](d func(*http.Request) (T, error)) func(*http.Request) (any, error) {
	return func(r *http.Request) (any, error) { return d(r) }
}

func cleanAbs(p string) bool { return filepath.IsAbs(p) && filepath.Clean(p) == p }

// FuzzDecodeRequests feeds arbitrary bodies to every request decoder. None
// may panic; a rejection is always invalid_argument; an accepted request
// is valid (absolute clean paths, an id) and its encoding is a fixed point:
// re-encoded and decoded again, it encodes to the same bytes (so a replay
// of what a client sends fingerprints alike).
func FuzzDecodeRequests(f *testing.F) {
	seeds := []string{
		`{"source":"/a/b"}`, `{"id":"00","to":"/x"}`, `{}`, ``, `null`, `{"source":"/a/../b/"}`,
		`{"id":"x","to":"/"}{}`, `{"to":"rel"}`, `[1,2]`, `{"source":"\ud800"}`, `{"source":"/a","source":"/b"}`,
		`{"root_id":"ab","policy":{"x" : [1, 2]},"logical_state":null}`, `{"node_id":"node_1","n":3,"logical_state":{"a":1}}`,
		`{"group_id":"grp_1","node_id":"node_1","expected_generation":18446744073709551615}`,
		`{"target":"att_1","evaluator":"e@1","reward":1e308,"verdict":"ok","evidence":[],"terminal":true,"backprop":true}`,
		`{"node_id":"node_1","executor":"none","ttl_ms":-5,"root":"/mnt/./x/","retry_of":"att_1"}`,
		`{"attempt_id":"att_1","logical_state":" \"s\" ","keep_running":true,"token":7}`,
		`{"lease_id":"lease_1","token":1,"ttl_ms":1000}`, `{"node_id":"node_1","dir":"/d","rw":true}`, `{"dir":"//d/"}`,
		`{"n":1.5}`, `{"reward":"NaN"}`, `{"policy":}`,
		`{"dry_run":true}`, `{"nodes":["node_1","node_2"],"base":"node_0","logical_state":null,"promote":true,"expected_generation":3}`,
		`{"nodes":[]}`, `{"id":"node_1","to":"/x/./y","artifact":"d/e","provenance":"/p/../q.json"}`, `{"id":"n","to":"/x","provenance":"rel"}`,
		`{"attempt_id":"att_1","args":["sh","-c","echo"],"env":["A=1"],"timeout_ms":5,"user":"1:1"}`, `{"attempt_id":"att_1","module":"ab","stdin":true}`,
	}
	for i, s := range seeds {
		for j := range decoders {
			f.Add(byte(i*len(decoders)+j), []byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, which byte, body []byte) {
		d := decoders[int(which)%len(decoders)]
		got, err := d.decode(httptest.NewRequest("POST", "/", bytes.NewReader(body)))
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("%s: rejection is not invalid_argument: %v", d.name, err)
			}
			return
		}
		if d.valid != nil && !d.valid(got) {
			t.Fatalf("%s: accepted invalid request %+v", d.name, got)
		}
		enc, err := json.Marshal(got)
		if err != nil {
			t.Fatalf("%s: accepted request does not encode: %v", d.name, err)
		}
		got2, err := d.decode(httptest.NewRequest("POST", "/", bytes.NewReader(enc)))
		if err != nil {
			t.Fatalf("%s: re-encoded %s is rejected: %v", d.name, enc, err)
		}
		enc2, err := json.Marshal(got2)
		if err != nil || !bytes.Equal(enc, enc2) {
			t.Fatalf("%s: re-encoded %s decodes to %s, %v", d.name, enc, enc2, err)
		}
	})
}

func TestStatusTable(t *testing.T) {
	codes := []errdefs.Code{
		errdefs.CodeNotFound, errdefs.CodeStaleGeneration, errdefs.CodeConflict, errdefs.CodeQuotaExceeded,
		errdefs.CodeInvalidArgument, errdefs.CodeUnsupported, errdefs.CodeFailedPrecondition,
		errdefs.CodeDeadlineExceeded, errdefs.CodeCorrupt, errdefs.CodeUnavailable, errdefs.CodeInternal,
		errdefs.CodeUnauthenticated,
	}
	byStatus := map[int][]errdefs.Code{}
	for _, c := range codes {
		s, ok := statusOf[c]
		if !ok {
			t.Errorf("code %s has no HTTP status", c)
			continue
		}
		if s < 400 || s > 599 {
			t.Errorf("code %s: status %d is not an error", c, s)
		}
		byStatus[s] = append(byStatus[s], c)
	}
	if len(statusOf) != len(codes) {
		t.Errorf("statusOf has %d entries, want %d", len(statusOf), len(codes))
	}
	// A status that only one code uses maps back to that code, for
	// responses that lost their body.
	for s, cs := range byStatus {
		if len(cs) == 1 && wire.CodeForStatus(s) != cs[0] {
			t.Errorf("wire.CodeForStatus(%d) = %s, want %s", s, wire.CodeForStatus(s), cs[0])
		}
	}
	if HTTPStatus("no_such_code") != 500 {
		t.Error("unknown code is not 500")
	}
}

func TestAsciiJSON(t *testing.T) {
	msg := "bad name \"é\x7f😀\" in /a"
	s := asciiJSON(errdefs.Error{Code: errdefs.CodeCorrupt, Message: msg})
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] >= 0x7f {
			t.Fatalf("byte %#x at %d in %q", s[i], i, s)
		}
	}
	var e errdefs.Error
	if err := json.Unmarshal([]byte(s), &e); err != nil || e.Message != msg || e.Code != errdefs.CodeCorrupt {
		t.Fatalf("%s decodes to %+v, %v", s, e, err)
	}
}

func TestParseIdempotencyKey(t *testing.T) {
	tests := []struct {
		vals []string
		want string
		ok   bool
	}{
		{nil, "", true},
		{[]string{"abc-123_X"}, "abc-123_X", true},
		{[]string{strings.Repeat("k", 255)}, strings.Repeat("k", 255), true},
		{[]string{strings.Repeat("k", 256)}, "", false},
		{[]string{""}, "", false},
		{[]string{"has space"}, "", false},
		{[]string{"naïve"}, "", false},
		{[]string{"a", "b"}, "", false},
	}
	for _, tt := range tests {
		got, err := parseIdempotencyKey(tt.vals)
		if tt.ok != (err == nil) || got != tt.want {
			t.Errorf("parseIdempotencyKey(%q) = %q, %v", tt.vals, got, err)
		}
		if err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("parseIdempotencyKey(%q): %v is not invalid_argument", tt.vals, err)
		}
	}
}
