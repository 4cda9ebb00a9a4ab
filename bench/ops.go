package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/esf-dev/esf/api/client"
	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/fabric"
)

// Ops drives a daemon the way a user does: through its API client over the
// unix socket, so that every latency includes the HTTP round trip and the
// JSON coding. Path reports, per operation, which way a row was measured.
type Ops struct {
	c *client.Client
	f *fabric.Fabric
	// viaFabric calls the graph and attempt operations as Go methods (no
	// transport), to measure what the API adds (-bench.fabric).
	viaFabric bool
}

// NewOps returns Ops for d with a client of its own (its own connection),
// as a separate process driving the daemon would have: concurrent
// scenarios give each of their clients one.
func (d *Daemon) NewOps() *Ops {
	return &Ops{c: client.NewClient(d.Socket), f: d.Fabric, viaFabric: d.Ops.viaFabric}
}

// Path of the transport an operation goes through: "api" or "fabric".
func (o *Ops) Path(op string) string {
	if o.viaFabric && op != "import" && op != "export" {
		return "fabric"
	}
	return "api"
}

// ImportResult is what an import reports.
type ImportResult struct {
	RootID     string
	Files      int64
	Bytes      int64
	NewObjects int64
}

// Import imports a directory on the daemon's host.
func (o *Ops) Import(ctx context.Context, path string) (ImportResult, error) {
	r, err := o.c.Import(ctx, path, apiOpts)
	if err != nil {
		return ImportResult{}, fmt.Errorf("import %s: %w", path, err)
	}
	return ImportResult{RootID: r.RootID.String(), Files: r.Files, Bytes: r.Bytes, NewObjects: r.NewObjects}, nil
}

// ExportDir writes the tree of id into dest (must not exist).
func (o *Ops) ExportDir(ctx context.Context, id, dest string) error {
	_, err := o.c.Export(ctx, id, dest, apiOpts)
	return err
}

// ExportTar streams the tree of id as a tar into w.
func (o *Ops) ExportTar(ctx context.Context, id string, w io.Writer) error {
	_, err := o.c.ExportTar(ctx, id, w)
	return err
}

// CreateGroup makes a group whose root node is sealed at rootID.
func (o *Ops) CreateGroup(ctx context.Context, rootID string) (fabric.CreateGroupResult, error) {
	if o.viaFabric {
		return o.f.CreateGroup(ctx, fabric.CreateGroupRequest{RootID: rootID})
	}
	r, err := o.c.CreateGroup(ctx, v1.CreateGroupRequest{RootID: rootID}, apiOpts)
	if err != nil {
		return fabric.CreateGroupResult{}, err
	}
	return fromView[fabric.CreateGroupResult](r)
}

// Fork creates n drafts of node and returns their ids.
func (o *Ops) Fork(ctx context.Context, node string, n int) ([]string, error) {
	req := fabric.ForkRequest{NodeID: node, N: n}
	var ids []string
	if o.viaFabric {
		r, err := o.f.Fork(ctx, req)
		if err != nil {
			return nil, err
		}
		for _, n := range r.Nodes {
			ids = append(ids, n.NodeID)
		}
	} else {
		r, err := o.c.Fork(ctx, v1.ForkRequest(req), apiOpts)
		if err != nil {
			return nil, err
		}
		for _, n := range r.Nodes {
			ids = append(ids, n.NodeID)
		}
	}
	return ids, nil
}

// Inspect reads a node, attempt or group.
func (o *Ops) Inspect(ctx context.Context, id string) error {
	if o.viaFabric {
		_, err := o.f.Inspect(ctx, id)
		return err
	}
	_, err := o.c.Inspect(ctx, id, apiOpts)
	return err
}

// Activate starts an attempt (executor none) on node and returns its id and
// writable root.
func (o *Ops) Activate(ctx context.Context, node string) (attemptID, root string, err error) {
	req := fabric.ActivateRequest{NodeID: node}
	if o.viaFabric {
		a, err := o.f.Activate(ctx, req)
		return a.AttemptID, a.Root, err
	}
	a, err := o.c.Activate(ctx, v1.ActivateRequest(req), apiOpts)
	if err != nil {
		return "", "", err
	}
	return a.AttemptID, a.Root, nil
}

// ActivateAttempt starts an attempt as req says (any executor) and returns
// it.
func (o *Ops) ActivateAttempt(ctx context.Context, req fabric.ActivateRequest) (fabric.AttemptView, error) {
	if o.viaFabric {
		return o.f.Activate(ctx, req)
	}
	a, err := o.c.Activate(ctx, v1.ActivateRequest(req), apiOpts)
	if err != nil {
		return fabric.AttemptView{}, err
	}
	return fromView[fabric.AttemptView](a)
}

// Exec runs req in an attempt, discarding its output, and fails unless it
// exits 0.
func (o *Ops) Exec(ctx context.Context, req fabric.ExecRequest) error {
	var res fabric.ExecResult
	var err error
	if o.viaFabric {
		res, err = o.f.Exec(ctx, req, fabric.ExecStreams{Stdout: io.Discard, Stderr: io.Discard})
	} else {
		var r v1.ExecResult
		r, err = o.c.Exec(ctx, v1.ExecRequest(req), io.Discard, io.Discard)
		res = fabric.ExecResult(r)
	}
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("exec %v in %s: exit code %d", req.Args, req.AttemptID, res.ExitCode)
	}
	return err
}

// Suspend seals an attempt (and releases it) and returns the sealed node.
func (o *Ops) Suspend(ctx context.Context, attemptID string) (string, error) {
	return o.suspend(ctx, fabric.SuspendRequest{AttemptID: attemptID})
}

// Checkpoint seals an attempt and leaves it active (suspend
// --keep-running).
func (o *Ops) Checkpoint(ctx context.Context, attemptID string) (string, error) {
	return o.suspend(ctx, fabric.SuspendRequest{AttemptID: attemptID, KeepRunning: true})
}

func (o *Ops) suspend(ctx context.Context, req fabric.SuspendRequest) (string, error) {
	if o.viaFabric {
		res, err := o.f.Suspend(ctx, req)
		return res.Node.NodeID, err
	}
	res, err := o.c.Suspend(ctx, v1.SuspendRequest(req), apiOpts)
	if err != nil {
		return "", err
	}
	return res.Node.NodeID, nil
}

// Release ends an attempt without sealing it.
func (o *Ops) Release(ctx context.Context, attemptID string) error {
	req := fabric.ReleaseRequest{AttemptID: attemptID}
	if o.viaFabric {
		_, err := o.f.Release(ctx, req)
		return err
	}
	_, err := o.c.Release(ctx, v1.ReleaseRequest(req), apiOpts)
	return err
}

// apiOpts are the call options of the benchmarks' API calls: none, so the
// server generates the idempotency key as it does for esfctl by default.
var apiOpts = client.CallOptions{}

// fromView reads a /v1 view back as the fabric result it was made from, so
// the benchmarks handle one type whichever path drove the daemon. The two
// encode alike (api's TestViewsEncodeAsRecords).
func fromView[T any](v any) (T, error) {
	var t T
	b, err := json.Marshal(v)
	if err == nil {
		err = json.Unmarshal(b, &t)
	}
	return t, err
}
