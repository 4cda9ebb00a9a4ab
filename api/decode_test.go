package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/esf-dev/esf/errdefs"
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

// FuzzDecodeRequests feeds arbitrary bodies to every request decoder. None
// may panic; a rejection is always invalid_argument; an accepted request
// is valid (absolute clean paths, an id) and survives a re-encode unchanged.
func FuzzDecodeRequests(f *testing.F) {
	seeds := []string{
		`{"source":"/a/b"}`, `{"id":"00","to":"/x"}`, `{}`, ``, `null`, `{"source":"/a/../b/"}`,
		`{"id":"x","to":"/"}{}`, `{"to":"rel"}`, `[1,2]`, `{"source":"\ud800"}`, `{"source":"/a","source":"/b"}`,
	}
	for i, s := range seeds {
		f.Add(byte(i), []byte(s))
	}
	f.Fuzz(func(t *testing.T, which byte, body []byte) {
		r := httptest.NewRequest("POST", "/", bytes.NewReader(body))
		var (
			got any
			err error
		)
		switch which % 3 {
		case 0:
			var req ImportRequest
			req, err = decodeImport(r)
			if err == nil && (!filepath.IsAbs(req.Source) || filepath.Clean(req.Source) != req.Source) {
				t.Fatalf("accepted import source %q", req.Source)
			}
			got = req
		case 1:
			var req ExportRequest
			req, err = decodeExport(r)
			if err == nil && (req.ID == "" || !filepath.IsAbs(req.To) || filepath.Clean(req.To) != req.To) {
				t.Fatalf("accepted export request %+v", req)
			}
			got = req
		case 2:
			got, err = decodeFsck(r)
		}
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("rejection is not invalid_argument: %v", err)
			}
			return
		}
		again, err := json.Marshal(got)
		if err != nil {
			t.Fatal(err)
		}
		r2 := httptest.NewRequest("POST", "/", bytes.NewReader(again))
		var got2 any
		switch which % 3 {
		case 0:
			got2, err = decodeImport(r2)
		case 1:
			got2, err = decodeExport(r2)
		case 2:
			got2, err = decodeFsck(r2)
		}
		if err != nil || got2 != got {
			t.Fatalf("re-encoded %s decodes to %+v, %v; want %+v", again, got2, err, got)
		}
	})
}

func TestStatusTable(t *testing.T) {
	codes := []errdefs.Code{
		errdefs.CodeNotFound, errdefs.CodeStaleGeneration, errdefs.CodeConflict, errdefs.CodeQuotaExceeded,
		errdefs.CodeInvalidArgument, errdefs.CodeUnsupported, errdefs.CodeFailedPrecondition,
		errdefs.CodeDeadlineExceeded, errdefs.CodeCorrupt, errdefs.CodeUnavailable, errdefs.CodeInternal,
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
		if len(cs) == 1 && codeForStatus(s) != cs[0] {
			t.Errorf("codeForStatus(%d) = %s, want %s", s, codeForStatus(s), cs[0])
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
