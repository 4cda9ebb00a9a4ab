package main

import (
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/fabric"
)

// recorder is a fake esfd that records the JSON request of each call and
// answers activate and exec (both forms) with canned results.
type recorder struct {
	reqs  chan any
	forms chan string
}

func fakeDaemon(t *testing.T) (string, *recorder) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "esfd.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{reqs: make(chan any, 8), forms: make(chan string, 8)}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/activate", func(w http.ResponseWriter, r *http.Request) {
		var req fabric.ActivateRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			t.Error(err)
		}
		rec.reqs <- req
		w.Header().Set("Content-Type", v1.MediaJSON)
		io.WriteString(w, `{"attempt_id":"att_1","node_id":"`+req.NodeID+`","state":"active"}`)
	})
	mux.HandleFunc("POST /v1/exec", func(w http.ResponseWriter, r *http.Request) {
		ct := r.Header.Get("Content-Type")
		rec.forms <- ct
		body := io.Reader(r.Body)
		if ct == v1.MediaExecStream {
			http.NewResponseController(w).EnableFullDuplex()
			var hdr [5]byte
			if _, err := io.ReadFull(r.Body, hdr[:]); err != nil || hdr[0] != v1.FrameRequest {
				t.Errorf("first frame % x, %v", hdr, err)
				return
			}
			body = io.LimitReader(r.Body, int64(binary.BigEndian.Uint32(hdr[1:])))
		}
		var req fabric.ExecRequest
		if err := json.NewDecoder(body).Decode(&req); err != nil {
			t.Error(err)
		}
		rec.reqs <- req
		w.Header().Set("Content-Type", v1.MediaExecStream)
		exit := []byte(`{"exit_code":42,"ms":1}`)
		frame := append([]byte{v1.FrameExit, 0, 0, 0, byte(len(exit))}, exit...)
		w.Write(frame)
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return sock, rec
}

// TestActivateFlags: every runc flag lands in the request as the API
// names it; malformed values are usage errors that send nothing.
func TestActivateFlags(t *testing.T) {
	sock, rec := fakeDaemon(t)
	r := esfctl(t, sock, nil, "activate", "node_1", "--executor", "runc", "--memory", "64M", "--pids", "32", "--cpus", "1.5",
		"--env", "A=1", "--env", "B=two=2", "--workdir", "/work", "--user", "1000:1000", "--no-queue", "--ttl", "1m")
	if r.status != 0 {
		t.Fatalf("activate: %d %s", r.status, r.stderr)
	}
	want := fabric.ActivateRequest{NodeID: "node_1", Executor: "runc", TTLMillis: 60_000, MemoryBytes: 64 << 20, Pids: 32, CPUs: 1.5,
		Env: []string{"A=1", "B=two=2"}, Workdir: "/work", User: "1000:1000", NoQueue: true}
	if got := <-rec.reqs; !reflect.DeepEqual(got, want) {
		t.Fatalf("request %+v\nwant %+v", got, want)
	}
	r = esfctl(t, sock, nil, "activate", "node_1")
	if got := <-rec.reqs; r.status != 0 || !reflect.DeepEqual(got, fabric.ActivateRequest{NodeID: "node_1", Executor: "none"}) {
		t.Fatalf("plain activate: %d %+v", r.status, got)
	}
	for _, bad := range [][]string{
		{"--memory", "12X"}, {"--memory", "-1G"}, {"--env", "NOEQUALS"}, {"--env", "=v"}, {"--pids", "-1"}, {"--cpus", "-2"}, {"--pids", "many"},
	} {
		r := esfctl(t, sock, nil, append([]string{"-o", "json", "activate", "node_1"}, bad...)...)
		if r.status != 2 || jsonError(t, r).Code != "invalid_argument" {
			t.Errorf("activate %v: exit %d %s", bad, r.status, r.stderr)
		}
	}
	select {
	case got := <-rec.reqs:
		t.Fatalf("a rejected command line was sent: %+v", got)
	default:
	}
}

// TestExecFlags: -i sends stdin through the interactive form, -t asks for
// a terminal (here none is local: no size), -it combines, and the exit
// status is the command's.
func TestExecFlags(t *testing.T) {
	sock, rec := fakeDaemon(t)
	for _, tc := range []struct {
		flags      []string
		stdin, tty bool
	}{
		{nil, false, false},
		{[]string{"-i"}, true, false},
		{[]string{"--interactive"}, true, false},
		{[]string{"-t"}, false, true},
		{[]string{"-it"}, true, true},
		{[]string{"-i", "-t"}, true, true},
	} {
		args := append(append([]string{"exec", "att_1"}, tc.flags...), "--env", "X=1", "--", "sh", "-c", "exit 42")
		r := esfctl(t, sock, strings.NewReader("input"), args...)
		if r.status != 42 {
			t.Errorf("%v: exit %d, want the command's 42 (%s)", tc.flags, r.status, r.stderr)
			continue
		}
		want := fabric.ExecRequest{AttemptID: "att_1", Args: []string{"sh", "-c", "exit 42"}, Env: []string{"X=1"}, Stdin: tc.stdin, TTY: tc.tty}
		if got := <-rec.reqs; !reflect.DeepEqual(got, want) {
			t.Errorf("%v: request %+v\nwant %+v", tc.flags, got, want)
		}
		wantForm := v1.MediaJSON
		if tc.stdin || tc.tty {
			wantForm = v1.MediaExecStream
		}
		if got := <-rec.forms; got != wantForm {
			t.Errorf("%v: sent as %s, want %s", tc.flags, got, wantForm)
		}
	}
}
