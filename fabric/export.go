package fabric

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/export"
	"github.com/esf-dev/esf/internal/atomicfile"
)

// ExportOptions choose what an export may carry to the daemon's host.
type ExportOptions struct {
	// PreservePrivileged keeps setuid/setgid bits, security.* xattrs and
	// device nodes; by default they are dropped and reported in
	// export.Stats.Dropped (see the export package).
	PreservePrivileged bool
}

// exportOptions merges the optional ExportOptions argument.
func (f *Fabric) exportOptions(opts []ExportOptions) export.Options {
	o := export.Options{Logger: f.log.With("op", "export")}
	if f.local != nil {
		// Large blobs this process has verified are copied in the kernel.
		o.VerifiedFile = f.local.OpenVerified
		if f.tier == nil {
			// Small blobs are read whole and hashed in memory. Not in front
			// of a remote: the tier's Get also keeps its cache's order.
			o.ReadSmall = f.local.ReadSmall
		}
	}
	for _, x := range opts {
		o.PreservePrivileged = o.PreservePrivileged || x.PreservePrivileged
	}
	return o
}

// ExportDir writes the tree id designates into dest, an absolute path on
// the daemon's host that must not exist (its parent must) or be an empty
// directory. When the export fails, a dest it created is removed again; an
// existing empty directory keeps what was written (export never deletes
// what it did not create). Privileged content is dropped unless opts say
// otherwise.
func (f *Fabric) ExportDir(ctx context.Context, id, dest string, opts ...ExportOptions) (cas.ID, export.Stats, error) {
	root, err := f.resolveRoot(ctx, id)
	if err != nil {
		return cas.ZeroID, export.Stats{}, fmt.Errorf("export: %w", err)
	}
	if !filepath.IsAbs(dest) {
		return root, export.Stats{}, fmt.Errorf("export to %q: not an absolute path: %w", dest, errdefs.ErrInvalidArgument)
	}
	_, lerr := os.Lstat(dest)
	fresh := errors.Is(lerr, fs.ErrNotExist)
	st, err := export.ToDir(ctx, f.store, root, dest, f.exportOptions(opts))
	if err != nil {
		if fresh && !errors.Is(err, errdefs.ErrFailedPrecondition) {
			// All or nothing when the export made dest: a half-written
			// tree under the caller's name would pass for an export.
			if rerr := os.RemoveAll(dest); rerr != nil {
				f.log.Warn("export failed; removing its partial output failed too", "to", dest, "err", rerr)
			}
		}
		return root, st, err
	}
	f.log.Info("exported", "root_id", root, "to", dest, "files", st.Files, "bytes", st.Bytes, "dropped", st.Dropped.String())
	return root, st, nil
}

// ExportTar streams the tree id designates as a tar into w. Nothing is
// written to w when id does not resolve; a failure after the first byte
// leaves a truncated tar in w. A corrupt blob never appears whole in w: the
// member it belongs to is cut short, so even a reader of the tar that
// ignores how the stream ended fails on it. Privileged content is dropped
// unless opts say otherwise.
func (f *Fabric) ExportTar(ctx context.Context, id string, w io.Writer, opts ...ExportOptions) (cas.ID, export.Stats, error) {
	root, err := f.resolveRoot(ctx, id)
	if err != nil {
		return cas.ZeroID, export.Stats{}, fmt.Errorf("export: %w", err)
	}
	st, err := export.ToTar(ctx, f.store, root, w, f.exportOptions(opts))
	if err != nil {
		return root, st, err
	}
	return root, st, nil
}

// ExportRequest materialises a node or root on the daemon's host.
type ExportRequest struct {
	ID string `json:"id"` // node id or root id
	To string `json:"to"` // absolute destination directory
	// Artifact exports one file or subtree (a slash path in the root)
	// instead of the whole root.
	Artifact string `json:"artifact,omitempty"`
	// Provenance is where the record goes; default To + ".provenance.json".
	Provenance string `json:"provenance,omitempty"`
	// PreservePrivileged keeps setuid/setgid bits, security.* xattrs and
	// device nodes, which are dropped by default.
	PreservePrivileged bool `json:"preserve_privileged,omitempty"`
}

// ExportResult is what an export wrote.
type ExportResult struct {
	RootID     string           `json:"root_id"`
	Files      int64            `json:"files"`
	Bytes      int64            `json:"bytes"`
	Provenance string           `json:"provenance"`
	Record     ProvenanceRecord `json:"record"`
	// Dropped is what the export left out because it could give
	// privilege on the host.
	Dropped export.Dropped `json:"dropped"`
}

// Export writes a node's (or root's) tree, or one artifact of it, to a
// directory and its provenance record beside it.
func (f *Fabric) Export(ctx context.Context, req ExportRequest) (ExportResult, error) {
	root, err := f.resolveRoot(ctx, req.ID)
	if err != nil {
		return ExportResult{}, fmt.Errorf("export: %w", err)
	}
	id := root.String()
	if req.Artifact != "" {
		e, err := export.Lookup(ctx, f.store, root, req.Artifact)
		if err != nil {
			return ExportResult{}, fmt.Errorf("export artifact %s: %w", req.Artifact, err)
		}
		if e.Type != cas.TypeDir {
			return ExportResult{}, fmt.Errorf("export artifact %s: a %s; artifacts are directories here (export its parent or the tar): %w",
				req.Artifact, e.Type, errdefs.ErrUnsupported)
		}
		id = e.ID.String()
	}
	_, st, err := f.ExportDir(ctx, id, req.To, ExportOptions{PreservePrivileged: req.PreservePrivileged})
	if err != nil {
		return ExportResult{}, err
	}
	rec, err := f.Provenance(ctx, req.ID, ExportInfo{Format: "dir", Artifact: req.Artifact, Destination: req.To})
	if err != nil {
		return ExportResult{}, err
	}
	path := req.Provenance
	if path == "" {
		path = req.To + ".provenance.json"
	}
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return ExportResult{}, err
	}
	if err := atomicfile.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return ExportResult{}, fmt.Errorf("export: provenance: %w", err)
	}
	if st.Dropped.Paths == nil {
		st.Dropped.Paths = []string{}
	}
	return ExportResult{RootID: root.String(), Files: st.Files, Bytes: st.Bytes, Provenance: path, Record: rec, Dropped: st.Dropped}, nil
}
