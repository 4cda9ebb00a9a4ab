package opensandbox

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/esf-dev/esf/workspace"
)

func TestEventReaderFramings(t *testing.T) {
	for _, tc := range []struct {
		name  string
		in    string
		types []string
		texts []string
	}{
		{"execd bare JSON", `{"type":"init","text":"id1"}` + "\n\n" + `{"type":"stdout","text":"a"}` + "\n\n" + `{"type":"execution_complete"}` + "\n\n",
			[]string{"init", "stdout", "execution_complete"}, []string{"id1", "a", ""}},
		{"standard SSE data lines", "event: x\ndata: {\"type\":\"stdout\",\ndata: \"text\":\"b\"}\n\n: comment\n\ndata:{\"type\":\"ping\"}\n\n",
			[]string{"stdout", "ping"}, []string{"b", ""}},
		{"CRLF and no final blank line", "{\"type\":\"stderr\",\"text\":\"c\"}\r\n\r\n{\"type\":\"error\",\"error\":{\"evalue\":\"3\"}}",
			[]string{"stderr", "error"}, []string{"c", ""}},
		{"escaped newline in text", `{"type":"stdout","text":"\n"}` + "\n\n", []string{"stdout"}, []string{"\n"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rd := newEventReader(strings.NewReader(tc.in))
			var types, texts []string
			for {
				ev, err := rd.next()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				types, texts = append(types, ev.Type), append(texts, ev.Text)
			}
			if strings.Join(types, ",") != strings.Join(tc.types, ",") || strings.Join(texts, "|") != strings.Join(tc.texts, "|") {
				t.Errorf("got types %q texts %q, want %q %q", types, texts, tc.types, tc.texts)
			}
		})
	}
	// A line beyond the bound is refused, not buffered without end.
	huge := `{"type":"stdout","text":"` + strings.Repeat("x", 300<<10) + `"}`
	if ev, err := newEventReader(strings.NewReader(huge + "\n\n")).next(); err != nil || len(ev.Text) != 300<<10 {
		t.Errorf("a 300 KiB event: %d bytes, %v", len(ev.Text), err)
	}
	small := newEventReader(strings.NewReader(huge))
	small.max = 256 << 10
	if _, err := small.next(); err == nil || errors.Is(err, io.EOF) {
		t.Errorf("an event line of %d bytes: err = %v, want a refusal", len(huge), err)
	}
	if _, err := newEventReader(strings.NewReader("{not json}\n\n")).next(); err == nil {
		t.Error("an undecodable event was accepted")
	}
}

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		e    streamError
		code int
		ok   bool
	}{
		{streamError{EValue: "3", Traceback: []string{"exit status 3"}}, 3, true},
		{streamError{EValue: "255"}, 255, true},
		{streamError{EValue: "-1", Traceback: []string{"signal: killed"}}, 137, true},
		{streamError{EValue: "-1", Traceback: []string{"signal: terminated"}}, 143, true},
		{streamError{EValue: "-1", Traceback: []string{"signal: segmentation fault (core dumped)"}}, 139, true},
		{streamError{EValue: "-1", Traceback: []string{"signal: signal 40"}}, 168, true},
		{streamError{EValue: "-1", Traceback: []string{"something else"}}, -1, true},
		{streamError{EName: "CommandExecError", EValue: "fork/exec /bin/bash: no such file or directory"}, 0, false},
	} {
		code, ok := exitCode(tc.e)
		if code != tc.code || ok != tc.ok {
			t.Errorf("exitCode(%+v) = %d, %v; want %d, %v", tc.e, code, ok, tc.code, tc.ok)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	if d := parseRetryAfter("7"); d != 7*time.Second {
		t.Errorf("7 -> %v", d)
	}
	if d := parseRetryAfter(""); d != 0 {
		t.Errorf("empty -> %v", d)
	}
	if d := parseRetryAfter("-3"); d != 0 {
		t.Errorf("-3 -> %v", d)
	}
	date := time.Now().Add(90 * time.Second).UTC().Format(http.TimeFormat)
	if d := parseRetryAfter(date); d < 80*time.Second || d > 90*time.Second {
		t.Errorf("%s -> %v", date, d)
	}
}

// TestStatusErrorClasses is the error mapping table: what each answer of
// the two servers becomes.
func TestStatusErrorClasses(t *testing.T) {
	p := &Provider{cfg: Config{}}
	for _, tc := range []struct {
		surface surface
		status  int
		body    string
		class   error
		code    string
	}{
		{lifecycleAPI, 401, `{"code":"INVALID_API_KEY","message":"bad key"}`, workspace.ErrPolicy, "INVALID_API_KEY"},
		{lifecycleAPI, 403, `{"code":"FORBIDDEN","message":"no"}`, workspace.ErrPolicy, "FORBIDDEN"},
		{lifecycleAPI, 429, `{"code":"TOO_MANY_REQUESTS","message":"slow down"}`, workspace.ErrPolicy, "TOO_MANY_REQUESTS"},
		{lifecycleAPI, 404, `{"code":"DOCKER::SANDBOX_NOT_FOUND","message":"Sandbox x not found."}`, workspace.ErrNotFound, "DOCKER::SANDBOX_NOT_FOUND"},
		{lifecycleAPI, 404, `{"code":"KUBERNETES::SANDBOX_NOT_FOUND","message":"gone"}`, workspace.ErrNotFound, "KUBERNETES::SANDBOX_NOT_FOUND"},
		{lifecycleAPI, 409, `{"code":"DOCKER::SANDBOX_NOT_RUNNING","message":"not running"}`, workspace.ErrProvider, "DOCKER::SANDBOX_NOT_RUNNING"},
		{lifecycleAPI, 422, `{"detail":[{"msg":"Input should be greater than or equal to 60"}]}`, workspace.ErrProvider, ""},
		{lifecycleAPI, 500, `{"code":"GENERAL::UNKNOWN_ERROR","message":"boom"}`, workspace.ErrProvider, "GENERAL::UNKNOWN_ERROR"},
		{execdAPI, 404, `{"code":"FILE_NOT_FOUND","message":"file not found"}`, fs.ErrNotExist, "FILE_NOT_FOUND"},
		{execdAPI, 404, `{"code":"DOCKER::SANDBOX_NOT_FOUND","message":"gone"}`, workspace.ErrNotFound, "DOCKER::SANDBOX_NOT_FOUND"},
		{execdAPI, 404, `404 page not found`, workspace.ErrProvider, ""},
		{execdAPI, 401, `{"error":"Unauthorized: invalid or missing header X-EXECD-ACCESS-TOKEN"}`, workspace.ErrPolicy, ""},
		{execdAPI, 400, `{"code":"INVALID_REQUEST_BODY","message":"bad"}`, workspace.ErrProvider, "INVALID_REQUEST_BODY"},
		{execdAPI, 502, `{"code":"GENERAL::UNKNOWN_ERROR","message":"Could not connect"}`, workspace.ErrProvider, "GENERAL::UNKNOWN_ERROR"},
		{execdAPI, 500, `{"code":"RUNTIME_ERROR","message":"error accessing file: open /etc/x: permission denied"}`, fs.ErrPermission, "RUNTIME_ERROR"},
		{execdAPI, 500, `{"code":"RUNTIME_ERROR","message":"error removing file /d. path is a directory: /d"}`, workspace.ErrProvider, "RUNTIME_ERROR"},
		{lifecycleAPI, 500, `{"code":"X","message":"permission denied"}`, workspace.ErrProvider, "X"},
	} {
		resp := &http.Response{StatusCode: tc.status, Header: http.Header{"Retry-After": {"2"}}, Body: io.NopCloser(strings.NewReader(tc.body))}
		pe := p.statusError(call{op: "op", surface: tc.surface}, resp)
		if !errors.Is(pe, tc.class) || pe.Code != tc.code || pe.Status != tc.status || pe.Message == "" || pe.Provider != providerName {
			t.Errorf("%d %s: %+v (class %v), want class %v code %q", tc.status, tc.body, pe, pe.Unwrap(), tc.class, tc.code)
		}
		if (pe.RetryAfter != 0) != (tc.status == 429) {
			t.Errorf("%d: RetryAfter %v", tc.status, pe.RetryAfter)
		}
	}
}

func TestOutStreamRestoresLineEnds(t *testing.T) {
	const sent = "esf-end-x"
	for _, tc := range []struct {
		events []string
		want   string
	}{
		{[]string{"f", sent}, "f"},
		{[]string{"f", "\n", sent}, "f\n"},
		{[]string{"\n", sent}, ""},
		{[]string{"\n", "\n", sent}, "\n"},
		{[]string{"a", "b", "\n", sent}, "a\nb\n"},
		{[]string{"a", "\n", "\n", "b", sent}, "a\n\n\nb"},
		{[]string{"a", "b"}, "a\nb\n"}, // no sentinel: killed with the command
		{[]string{sent, "after"}, ""},
	} {
		var b bytes.Buffer
		o := &outStream{w: &b, sentinel: sent}
		for _, e := range tc.events {
			if err := o.line(e); err != nil {
				t.Fatal(err)
			}
		}
		if err := o.end(); err != nil {
			t.Fatal(err)
		}
		if b.String() != tc.want {
			t.Errorf("events %q -> %q, want %q", tc.events, b.String(), tc.want)
		}
	}
}

func TestWorkdirMetadataRoundTrip(t *testing.T) {
	for _, wd := range []string{"", "/tmp", "~/proj", "relative/dir", "/" + strings.Repeat("deep/", 40) + "ünïcode dir"} {
		md := encodeWorkdir(wd)
		for k, v := range md {
			if !strings.HasPrefix(k, reservedPrefix) || len(v) > 63 || strings.Trim(v, "0123456789abcdefghijklmnopqrstuv") != "" {
				t.Errorf("workdir %q: metadata %s=%q is not label-safe", wd, k, v)
			}
		}
		if got := decodeWorkdir(md); got != wd {
			t.Errorf("workdir %q came back as %q", wd, got)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"no base URL", Config{}},
		{"not http", Config{BaseURL: "ftp://x"}},
		{"no host", Config{BaseURL: "http://"}},
		{"relative home", Config{BaseURL: "http://x", Home: "home"}},
		{"port", Config{BaseURL: "http://x", ExecdPort: 70000}},
		{"reserved metadata", Config{BaseURL: "http://x", Metadata: map[string]string{reservedPrefix + "x": "y"}}},
	} {
		if _, err := New(tc.cfg); err == nil {
			t.Errorf("%s: New accepted %+v", tc.name, tc.cfg)
		}
	}
	for in, want := range map[string]string{
		"http://h:8080": "http://h:8080/v1", "http://h:8080/": "http://h:8080/v1",
		"https://h/v1": "https://h/v1", "http://h/prefix/v1/": "http://h/prefix/v1",
	} {
		p, err := New(Config{BaseURL: in})
		if err != nil || p.api.String() != want {
			t.Errorf("BaseURL %q -> %v, %v; want %s", in, p.api, err, want)
		}
	}
}
