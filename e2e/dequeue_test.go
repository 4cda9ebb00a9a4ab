package e2e

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/esf-dev/esf/api"
	"github.com/esf-dev/esf/fabric"
	"github.com/esf-dev/esf/journal"
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
	cl := api.NewClient(d.socket)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	opt := api.CallOptions{}
	for i := 0; i < 8; i++ {
		kids := fork(t, d, g.Node.NodeID, 2)
		hold, err := cl.Activate(ctx, fabric.ActivateRequest{NodeID: kids[0]}, opt)
		if err != nil {
			t.Fatal(err)
		}
		q, err := cl.Activate(ctx, fabric.ActivateRequest{NodeID: kids[1], Executor: fabric.ExecutorRunc}, opt)
		if err != nil {
			t.Fatal(err)
		}
		if q.State != journal.AttemptQueued {
			t.Fatalf("second activation under --max-attempts 1: %s, want queued", q.State)
		}
		if _, err := cl.Release(ctx, fabric.ReleaseRequest{AttemptID: hold.AttemptID}, opt); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, "the queued attempt to start", func() bool {
			in, err := cl.Inspect(ctx, q.AttemptID, opt)
			if err != nil {
				t.Fatal(err)
			}
			if s := in.Attempt.State; s != journal.AttemptQueued && s != journal.AttemptActive {
				t.Fatalf("queued attempt became %s: %s", s, in.Attempt.Error)
			}
			return in.Attempt.State == journal.AttemptActive
		})
		var out bytes.Buffer
		res, err := cl.Exec(ctx, fabric.ExecRequest{AttemptID: q.AttemptID, Args: []string{"/bin/echo", "up"}}, &out, nil)
		if err != nil || res.ExitCode != 0 || out.String() != "up\n" {
			t.Fatalf("dequeue %d: exec as soon as the attempt is active: %v (exit %d, %q)", i, err, res.ExitCode, out.String())
		}
		if _, err := cl.Release(ctx, fabric.ReleaseRequest{AttemptID: q.AttemptID}, opt); err != nil {
			t.Fatal(err)
		}
	}
}
