package e2bfake_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/esf-dev/esf/adapters/workspace/e2b/envd"
)

// TestSignalByTag: a process can be killed by its tag before its pid is
// known (what the adapter does when a stream breaks before the start
// event), and a stream that closes does not kill the process.
func TestSignalByTag(t *testing.T) {
	srv := fake(t)
	sb := newSandbox(t, srv)
	h := http.Header{}
	h.Set(envd.HeaderSandboxID, sb.ID)
	h.Set(envd.HeaderAccessToken, sb.Token)
	c := envd.NewClient(nil, envd.Target{BaseURL: srv.URL, Header: h, User: "user"})

	ctx, cancel := context.WithCancel(context.Background())
	tag, no := "t1", false
	stream, err := c.Start(ctx, &envd.StartRequest{Process: &envd.ProcessConfig{Cmd: "sleep", Args: []string{"60"}}, Tag: &tag, Stdin: &no}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() || stream.Msg().Event.Start == nil {
		t.Fatalf("no start event: %v", stream.Err())
	}
	cancel() // the client leaves; envd keeps the process
	stream.Close()
	time.Sleep(100 * time.Millisecond)
	if srv.Processes() != 1 {
		t.Fatalf("%d processes after the stream closed, want the sleep still running", srv.Processes())
	}
	if err := c.SendSignal(context.Background(), &envd.ProcessSelector{Tag: &tag}, envd.SignalKill); err != nil {
		t.Fatal(err)
	}
	for i := 0; srv.Processes() != 0; i++ {
		if i == 200 {
			t.Fatal("the tagged process survived SIGKILL")
		}
		time.Sleep(10 * time.Millisecond)
	}
	err = c.SendSignal(context.Background(), &envd.ProcessSelector{Tag: &tag}, envd.SignalKill)
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("signal to a gone process = %v, want not_found", err)
	}
}
