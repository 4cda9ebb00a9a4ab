package api

import (
	"context"
	"net/http/httptrace"
	"path/filepath"
	"testing"
	"time"

	"github.com/esf-dev/esf/api/client"
	v1 "github.com/esf-dev/esf/api/v1"
)

// TestClientReusesItsConnection: a client making calls one after another
// keeps one connection, whatever the size of the replies. A reply over
// 2 KiB comes chunked, and a body closed before its last chunk is read
// makes the transport drop the connection, so every later call would pay a
// dial (about 0.3 ms on a unix socket).
func TestClientReusesItsConnection(t *testing.T) {
	h := newHarness(t, 5*time.Second)
	ctx := context.Background()
	src := filepath.Join(t.TempDir(), "src")
	writeTree(t, src, map[string]string{"a.txt": "alpha"})
	imp, err := h.client.Import(ctx, src, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	g, err := h.client.CreateGroup(ctx, v1.CreateGroupRequest{RootID: imp.RootID.String()}, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// minReply is the least a case's reply must weigh for it to test what
	// it names: Raw reads a reply to its end, so it is used once to weigh
	// the reply, then the calls decode as usual.
	for _, tc := range []struct {
		name     string
		minReply int
		call     func(ctx context.Context, opt client.CallOptions) error
	}{
		{"small reply (inspect)", 0, func(ctx context.Context, opt client.CallOptions) error {
			_, err := h.client.Inspect(ctx, g.Node.NodeID, opt)
			return err
		}},
		{"chunked reply (fork -n 20)", 4 << 10, func(ctx context.Context, opt client.CallOptions) error {
			_, err := h.client.Fork(ctx, v1.ForkRequest{NodeID: g.Node.NodeID, N: 20}, opt)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var raw []byte
			if err := tc.call(ctx, client.CallOptions{Raw: &raw}); err != nil {
				t.Fatal(err)
			}
			if len(raw) < tc.minReply {
				t.Fatalf("reply of %d bytes, want at least %d (the server chunks replies over 2 KiB)", len(raw), tc.minReply)
			}
			var dials, calls int
			tctx := httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
				calls++
				if !i.Reused {
					dials++
				}
			}})
			for range 20 {
				if err := tc.call(tctx, client.CallOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			// The calls before left an idle connection: none should dial. (A
			// body closed early is dropped only when its last chunk had not
			// arrived with the value, so one call alone can pass by luck.)
			if dials != 0 {
				t.Errorf("%d of %d calls dialled a new connection, want none", dials, calls)
			}
		})
	}
}
