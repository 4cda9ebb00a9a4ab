package e2b

import (
	"context"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/esf-dev/esf/e2b/envdwire"
	"github.com/esf-dev/esf/journal"
)

// TestControlPlane: keys, create from a group or a node (unknown: 404;
// internet access refused), get info, list with metadata and state filters
// and paging, set timeout, kill (then 404), and envd's health and token.
func TestControlPlane(t *testing.T) {
	h := newHarness(t)

	var e apiError
	if st, _ := h.callKey(t, "", "GET", "/v2/sandboxes", nil, &e); st != 401 || e.Code != 401 || e.Message == "" {
		t.Fatalf("no key: %d %+v", st, e)
	}
	if st, _ := h.callKey(t, "e2b_00000000000000000000000000000000", "GET", "/v2/sandboxes", nil, &e); st != 401 || e.Code != 401 {
		t.Fatalf("wrong key: %d %+v", st, e)
	}
	// The key file is read again when it changes.
	const key2 = "e2b_fedcba9876543210fedcba9876543210"
	if err := os.WriteFile(h.keys+".new", []byte(key2+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(h.keys+".new", h.keys); err != nil {
		t.Fatal(err)
	}
	if st, _ := h.callKey(t, key2, "GET", "/v2/sandboxes", nil, nil); st != 200 {
		t.Fatalf("new key: %d", st)
	}
	if st, _ := h.callKey(t, testKey, "GET", "/v2/sandboxes", nil, nil); st != 401 {
		t.Fatalf("revoked key: %d", st)
	}
	if err := os.WriteFile(h.keys, []byte(testKey+"\n"+key2+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	for _, tmpl := range []string{"nope", "grp_0123456789abcdef0123456789abcdef", "node_0123456789abcdef0123456789abcdef", "a b"} {
		if st, _ := h.call(t, "POST", "/v2/sandboxes", map[string]any{"templateID": tmpl, "allow_internet_access": false}, &e); st != 404 || e.Code != 404 {
			t.Errorf("template %q: %d %+v", tmpl, st, e)
		}
	}
	if st, _ := h.call(t, "POST", "/v2/sandboxes", map[string]any{"templateID": h.groupID, "allow_internet_access": true}, &e); st != 400 ||
		!strings.Contains(e.Message, "allow_internet_access") {
		t.Errorf("internet access: %d %+v", st, e)
	}

	a := h.create(t, map[string]any{"metadata": map[string]string{"team": "a", "n": "1"}, "envVars": map[string]string{"GREETING": "hi"}})
	b := h.create(t, map[string]any{"templateID": h.nodeID, "metadata": map[string]string{"team": "b"}})
	byName := h.create(t, map[string]any{"templateID": testGroupName})
	if st, _ := h.call(t, "DELETE", "/sandboxes/"+byName.SandboxID, nil, nil); st != 204 {
		t.Fatalf("kill the sandbox made from the group's name: %d", st)
	}
	if a.EnvdVersion != EnvdVersion || a.EnvdAccessToken == "" || a.EnvdAccessToken == b.EnvdAccessToken || !strings.HasPrefix(a.SandboxID, "i") {
		t.Fatalf("create replies %+v %+v", a, b)
	}

	var d sandboxDetail
	if st, _ := h.call(t, "GET", "/sandboxes/"+a.SandboxID, nil, &d); st != 200 || d.State != "running" || d.Metadata["team"] != "a" ||
		d.TemplateID != h.groupID || d.EnvdVersion != EnvdVersion || d.EndAt.Before(d.StartedAt.Add(299*time.Second)) {
		t.Fatalf("get info: %d %+v", st, d)
	}

	var list []sandboxDetail
	h.call(t, "GET", "/v2/sandboxes?metadata="+"team%3Da", nil, &list)
	if len(list) != 1 || list[0].SandboxID != a.SandboxID {
		t.Fatalf("list team=a: %+v", list)
	}
	h.call(t, "GET", "/v2/sandboxes?state=paused", nil, &list)
	if len(list) != 0 {
		t.Fatalf("list paused: %+v", list)
	}
	seen := map[string]bool{}
	next := ""
	for i := 0; i < 3; i++ {
		var page []sandboxDetail
		_, hdr := h.call(t, "GET", "/v2/sandboxes?limit=1&nextToken="+next, nil, &page)
		for _, p := range page {
			seen[p.SandboxID] = true
		}
		if next = hdr.Get("X-Next-Token"); next == "" {
			break
		}
	}
	if len(seen) != 2 || !seen[a.SandboxID] || !seen[b.SandboxID] {
		t.Fatalf("paged list: %v", seen)
	}

	// Set timeout: the end moves.
	if st, _ := h.call(t, "POST", "/sandboxes/"+a.SandboxID+"/timeout", map[string]any{"timeout": 3600}, nil); st != 204 {
		t.Fatalf("set timeout: %d", st)
	}
	h.call(t, "GET", "/sandboxes/"+a.SandboxID, nil, &d)
	if time.Until(d.EndAt) < 3500*time.Second {
		t.Fatalf("end after set timeout: %v", d.EndAt)
	}
	// Connect to a running sandbox: 200, same token.
	var rep sandboxReply
	if st, _ := h.call(t, "POST", "/sandboxes/"+a.SandboxID+"/connect", map[string]any{"timeout": 60}, &rep); st != 200 || rep.EnvdAccessToken != a.EnvdAccessToken {
		t.Fatalf("connect: %d %+v", st, rep)
	}

	// envd: health needs no token; a wrong token is 401; envVars reach
	// commands.
	c := h.envd(a)
	req, _ := http.NewRequest("GET", h.url+"/health", nil)
	req.Header.Set(envdwire.HeaderSandboxID, a.SandboxID)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 204 {
		t.Fatalf("health: %v %v", resp, err)
	}
	bad := *c
	bad.token = b.EnvdAccessToken
	if st, msg := bad.unary(t, envdwire.ProcList, struct{}{}, nil); st != 401 {
		t.Fatalf("another sandbox's token: %d %s", st, msg)
	}
	bad.token = ""
	if st, _ := bad.stream(context.Background(), t, envdwire.ProcStart, run("true"), nil); st != 401 {
		t.Fatalf("no token: %d", st)
	}
	_, ch := c.stream(context.Background(), t, envdwire.ProcStart, run("echo $GREETING; pwd"), nil)
	if r := collect(t, ch); r.stdout != "hi\n"+Home+"\n" || r.end == nil || r.end.ExitCode != 0 {
		t.Fatalf("env and cwd: %+v %+v", r, r.end)
	}

	// Kill: 204, then 404 everywhere; the envd of a gone sandbox is 502.
	if st, _ := h.call(t, "DELETE", "/sandboxes/"+a.SandboxID, nil, nil); st != 204 {
		t.Fatalf("kill: %d", st)
	}
	if st, _ := h.call(t, "DELETE", "/sandboxes/"+a.SandboxID, nil, &e); st != 404 || e.Code != 404 {
		t.Fatalf("kill again: %d %+v", st, e)
	}
	if st, _ := h.call(t, "GET", "/sandboxes/"+a.SandboxID, nil, nil); st != 404 {
		t.Fatalf("info after kill: %d", st)
	}
	if st, _ := c.unary(t, envdwire.ProcList, struct{}{}, nil); st != 502 {
		t.Fatalf("envd after kill: %d", st)
	}
}

// TestTimeoutKills: a sandbox whose timeout passes is gone (its lease
// expired and the fabric failed its attempt).
func TestTimeoutKills(t *testing.T) {
	h := newHarness(t)
	sb := h.create(t, map[string]any{"timeout": 1})
	deadline := time.Now().Add(2 * time.Minute)
	for {
		h.f.ExpireLeases(context.Background()) // esfd's reaper does this every second
		if st, _ := h.call(t, "GET", "/sandboxes/"+sb.SandboxID, nil, nil); st == 404 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sandbox outlived its timeout by 2 minutes")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestTraceContext: a create continues the caller's trace, and the events
// of the attempt it activated carry the trace id, as a /v1 call's do.
func TestTraceContext(t *testing.T) {
	h := newHarness(t)
	const trace = "4bf92f3577b34da6a3ce929d0e0e4736"
	body := strings.NewReader(`{"templateID":"` + h.groupID + `","timeout":60}`)
	req, _ := http.NewRequest("POST", h.url+"/v2/sandboxes", body)
	req.Header.Set("X-API-KEY", testKey)
	req.Header.Set("Traceparent", "00-"+trace+"-00f067aa0ba902b7-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 201 || !strings.Contains(resp.Header.Get("Traceparent"), trace) {
		t.Fatalf("create: %d, traceparent %q", resp.StatusCode, resp.Header.Get("Traceparent"))
	}
	found := false
	err = h.f.Events(context.Background(), 0, journal.EventFilter{GroupID: h.groupID}, false, func(ev journal.Event) error {
		if ev.AttemptID != "" && ev.TraceID == trace {
			found = true
		}
		return nil
	})
	if err != nil || !found {
		t.Fatalf("no attempt event with the caller's trace id (%v)", err)
	}
}

// TestMetrics: a sample from the container's cgroup: CPU used by a busy
// command, memory held and its limit, the disk of the writable layer.
func TestMetrics(t *testing.T) {
	h := newHarness(t)
	sb := h.create(t, nil)
	var first []sandboxMetric
	if st, _ := h.call(t, "GET", "/sandboxes/"+sb.SandboxID+"/metrics", nil, &first); st != 200 || len(first) != 1 {
		t.Fatalf("metrics: %d %+v", st, first)
	}
	h.envd(sb).sh(t, "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done")
	var m []sandboxMetric
	if st, _ := h.call(t, "GET", "/sandboxes/"+sb.SandboxID+"/metrics", nil, &m); st != 200 || len(m) != 1 {
		t.Fatalf("metrics: %d %+v", st, m)
	}
	if m[0].CPUUsedPct <= 0 || m[0].MemUsed <= 0 || m[0].DiskTotal <= 0 || m[0].DiskUsed <= 0 || m[0].CPUCount != 1 {
		t.Fatalf("metrics after a busy loop: %+v", m[0])
	}
}
