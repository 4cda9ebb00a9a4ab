package e2e

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/esf-dev/esf/api/client"
	v1 "github.com/esf-dev/esf/api/v1"
)

// TestExecRightAfterDequeue: a runc attempt queued by the live-attempt
// quota runs commands as soon as it shows active. (The daemon commits the
// dequeued attempt's state before it mounts its root and starts its
// container; an exec in between used to fail with not_found.) The race is
// narrow, so the test dequeues several times; a daemon without the fix
// fails it most runs, one with it never does.
func TestExecRightAfterDequeue(t *testing.T) {
	requireRunc(t)
	d := startDaemonWith(t, "", "--max-attempts", "1")
	g := createGroup(t, d, busyboxTree(t, d))
	cl := client.NewClient(d.socket)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	opt := client.CallOptions{}
	for i := 0; i < 8; i++ {
		kids := fork(t, d, g.Node.NodeID, 2)
		hold, err := cl.Activate(ctx, v1.ActivateRequest{NodeID: kids[0]}, opt)
		if err != nil {
			t.Fatal(err)
		}
		q, err := cl.Activate(ctx, v1.ActivateRequest{NodeID: kids[1], Executor: v1.ExecutorRunc}, opt)
		if err != nil {
			t.Fatal(err)
		}
		if q.State != v1.AttemptQueued {
			t.Fatalf("second activation under --max-attempts 1: %s, want queued", q.State)
		}
		if _, err := cl.Release(ctx, v1.ReleaseRequest{AttemptID: hold.AttemptID}, opt); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, "the queued attempt to start", func() bool {
			in, err := cl.Inspect(ctx, q.AttemptID, opt)
			if err != nil {
				t.Fatal(err)
			}
			if s := in.Attempt.State; s != v1.AttemptQueued && s != v1.AttemptActive {
				t.Fatalf("queued attempt became %s: %s", s, in.Attempt.Error)
			}
			return in.Attempt.State == v1.AttemptActive
		})
		var out bytes.Buffer
		res, err := cl.Exec(ctx, v1.ExecRequest{AttemptID: q.AttemptID, Args: []string{"/bin/echo", "up"}}, &out, nil)
		if err != nil || res.ExitCode != 0 || out.String() != "up\n" {
			t.Fatalf("dequeue %d: exec as soon as the attempt is active: %v (exit %d, %q)", i, err, res.ExitCode, out.String())
		}
		if _, err := cl.Release(ctx, v1.ReleaseRequest{AttemptID: q.AttemptID}, opt); err != nil {
			t.Fatal(err)
		}
	}
}
