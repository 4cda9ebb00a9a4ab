package envdwire

import (
	"testing"
	"time"
)

// TestWireSpelling pins the protobuf-JSON spelling envd expects and emits
// (PROTOCOLS.md §1.4): lowerCamelCase, zero values omitted, int64 as a
// string, bytes as standard base64, an explicit false for optional stdin.
func TestWireSpelling(t *testing.T) {
	cwd := "/home/user"
	no := false
	mt := time.Date(2026, 8, 1, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		msg  any
		want string
	}{
		{"start request", &StartRequest{Process: &ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "echo hi"}, Envs: map[string]string{"A": "1"}, Cwd: &cwd}, Stdin: &no},
			`{"process":{"cmd":"/bin/sh","args":["-c","echo hi"],"envs":{"A":"1"},"cwd":"/home/user"},"stdin":false}`},
		{"start request, old envd", &StartRequest{Process: &ProcessConfig{Cmd: "true"}},
			`{"process":{"cmd":"true"}}`},
		{"end exit 0", &StartResponse{Event: &ProcessEvent{End: &EndEvent{Exited: true, Status: "exit status 0"}}},
			`{"event":{"end":{"exited":true,"status":"exit status 0"}}}`},
		{"data", &StartResponse{Event: &ProcessEvent{Data: &DataEvent{Stdout: []byte("hi\n")}}},
			`{"event":{"data":{"stdout":"aGkK"}}}`},
		{"keepalive", &StartResponse{Event: &ProcessEvent{Keepalive: &struct{}{}}},
			`{"event":{"keepalive":{}}}`},
		{"signal", &SendSignalRequest{Process: &ProcessSelector{Pid: 421}, Signal: SignalKill},
			`{"process":{"pid":421},"signal":"SIGNAL_SIGKILL"}`},
		{"entry", &EntryResponse{Entry: &EntryInfo{Name: "a.txt", Type: FileTypeFile, Path: "/home/user/a.txt", Size: 3, Mode: 0o644,
			Permissions: "-rw-r--r--", Owner: "user", Group: "user", ModifiedTime: &mt}},
			`{"entry":{"name":"a.txt","type":"FILE_TYPE_FILE","path":"/home/user/a.txt","size":"3","mode":420,"permissions":"-rw-r--r--","owner":"user","group":"user","modifiedTime":"2026-08-01T10:00:00Z"}}`},
		{"empty", &Empty{}, `{}`},
	} {
		got, err := Codec{}.Marshal(tc.msg)
		if err != nil || string(got) != tc.want {
			t.Errorf("%s:\n got %s, %v\nwant %s", tc.name, got, err, tc.want)
		}
	}
}

func TestDecodeTolerates(t *testing.T) {
	var r StartResponse
	// Unknown fields (newer envd), exitCode for a failure, error text.
	in := `{"event":{"end":{"exitCode":-1,"exited":false,"status":"signal: killed","error":"signal: killed","cpuTime":"7"}},"extra":1}`
	if err := (Codec{}).Unmarshal([]byte(in), &r); err != nil {
		t.Fatal(err)
	}
	if e := r.Event.End; e == nil || e.ExitCode != -1 || e.Status != "signal: killed" || e.Error == nil {
		t.Errorf("decoded %+v", r.Event.End)
	}
	for in, want := range map[string]Int64{`"123"`: 123, `123`: 123, `"-5"`: -5, `null`: 0} {
		var n Int64
		if err := n.UnmarshalJSON([]byte(in)); err != nil || n != want {
			t.Errorf("Int64 %s = %d, %v", in, n, err)
		}
	}
	var n Int64
	if err := n.UnmarshalJSON([]byte(`"x"`)); err == nil {
		t.Error(`Int64 "x" decoded`)
	}
	if err := (Codec{}).Unmarshal(nil, &r); err != nil {
		t.Errorf("empty body: %v", err)
	}
}
