package fabric

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/esf-dev/esf/journal"
)

// MountRequest shows a node at a directory.
type MountRequest struct {
	NodeID string `json:"node_id"`
	Dir    string `json:"dir"`
	// RW activates an attempt whose writable root is Dir; otherwise Dir
	// becomes a read-only bind of the node's projected root.
	RW bool `json:"rw,omitempty"`
}

// MountResult says what was mounted.
type MountResult struct {
	Dir     string       `json:"dir"`
	RootID  string       `json:"root_id"`
	Attempt *AttemptView `json:"attempt,omitempty"`
}

// Mount shows a node at req.Dir, which must be an existing empty
// directory that nothing is mounted on.
func (f *Fabric) Mount(ctx context.Context, req MountRequest) (MountResult, error) {
	if err := journal.CheckID(journal.KindNode, req.NodeID); err != nil {
		return MountResult{}, fmt.Errorf("mount: %w", err)
	}
	if req.RW {
		// Activate checks the directory, after its idempotency check.
		a, err := f.Activate(ctx, ActivateRequest{NodeID: req.NodeID, Root: req.Dir})
		if err != nil {
			return MountResult{}, err
		}
		return MountResult{Dir: a.Root, Attempt: &a}, nil
	}
	dir, err := checkMountDir(f.mounter, req.Dir)
	if err != nil {
		return MountResult{}, fmt.Errorf("mount: %w", err)
	}
	var n journal.Node
	if err := f.journal.View(ctx, func(r journal.Reader) error {
		var err error
		n, err = journal.GetNode(r, req.NodeID)
		return err
	}); err != nil {
		return MountResult{}, fmt.Errorf("mount: %w", err)
	}
	if n.Status == journal.NodePruned {
		return MountResult{}, fmt.Errorf("mount: node %s is pruned: %w", n.NodeID, journal.ErrFailedPrecondition)
	}
	if err := f.projection.Ensure(ctx); err != nil {
		return MountResult{}, err
	}
	src := f.projection.RootPath(n.RootID)
	if err := f.mounter.BindView(src, dir); err != nil {
		return MountResult{}, fmt.Errorf("mount: %w", err)
	}
	return MountResult{Dir: dir, RootID: n.RootID}, nil
}

// UmountRequest undoes a Mount.
type UmountRequest struct {
	Dir string `json:"dir"`
}

// Umount releases the attempt whose root is req.Dir, or removes the
// read-only bind there. The daemon's own mounts (anything in the state
// dir: the projection, attempts' private roots) are invalid_argument.
func (f *Fabric) Umount(ctx context.Context, req UmountRequest) (MountResult, error) {
	dir, err := filepath.Abs(req.Dir)
	if err != nil {
		return MountResult{}, err
	}
	if what, own := f.ownMount(dir); own {
		return MountResult{}, errOwnMount(dir, what)
	}
	var attemptID string
	err = f.journal.View(ctx, func(r journal.Reader) error {
		return journal.ExpiredLeases(r, time.Unix(1<<40, 0), func(lid string) error {
			l, err := journal.GetLease(r, lid)
			if err != nil {
				return err
			}
			rt, err := journal.GetAttemptRuntime(r, l.AttemptID)
			if err == nil && rt.Mount == dir {
				attemptID = l.AttemptID
				return journal.ErrStop
			}
			if err != nil && !isNotFound(err) {
				return err
			}
			return nil
		})
	})
	if err != nil {
		return MountResult{}, fmt.Errorf("umount: %w", err)
	}
	if attemptID != "" {
		a, err := f.Release(ctx, ReleaseRequest{AttemptID: attemptID})
		if err != nil {
			return MountResult{}, err
		}
		return MountResult{Dir: dir, Attempt: &a}, nil
	}
	if !f.mounter.IsView(dir) {
		return MountResult{}, fmt.Errorf("umount: nothing of esf is mounted at %s: %w", dir, journal.ErrNotFound)
	}
	if err := f.mounter.Unmount(dir); err != nil {
		return MountResult{}, fmt.Errorf("umount: %w", err)
	}
	return MountResult{Dir: dir}, nil
}
