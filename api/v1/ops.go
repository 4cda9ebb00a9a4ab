package v1

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Content operations: exports with provenance, collection, the remote store.

// ExportNodeRequest materialises a node or root on the daemon's host.
type ExportNodeRequest struct {
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

// ExportNodeResult is what an export wrote.
type ExportNodeResult struct {
	RootID     string           `json:"root_id"`
	Files      int64            `json:"files"`
	Bytes      int64            `json:"bytes"`
	Provenance string           `json:"provenance"`
	Record     ProvenanceRecord `json:"record"`
	// Dropped is what the export left out because it could give
	// privilege on the host.
	Dropped Dropped `json:"dropped"`
}

// ExportInfo says what an export produced.
type ExportInfo struct {
	Format      string    `json:"format"` // dir, tar, patch
	Base        string    `json:"base,omitempty"`
	Artifact    string    `json:"artifact,omitempty"`
	Destination string    `json:"destination,omitempty"`
	ExportedAt  time.Time `json:"exported_at"`
}

// ProvenanceRecord describes one export.
type ProvenanceRecord struct {
	Version     int             `json:"version"`
	RootID      string          `json:"root_id"`
	NodeID      string          `json:"node_id,omitempty"`
	GroupID     string          `json:"group_id,omitempty"`
	Parents     []string        `json:"parents,omitempty"`
	Ancestry    []string        `json:"ancestry,omitempty"`
	Origin      *Provenance     `json:"origin,omitempty"` // how the node came to be
	Policy      json.RawMessage `json:"policy,omitempty"`
	Attempt     *Attempt        `json:"attempt,omitempty"` // the attempt that sealed it
	Evaluations []Evaluation    `json:"evaluations,omitempty"`
	Export      ExportInfo      `json:"export"`
	// MAC is hex keyed-BLAKE3 over the record's canonical JSON without it.
	MAC string `json:"mac"`
}

// ProvenanceReport is the outcome of VerifyProvenance.
type ProvenanceReport struct {
	Valid    bool                `json:"valid"`
	Checked  int                 `json:"checked"` // ids checked against the graph and the store
	Problems []ProvenanceProblem `json:"problems,omitempty"`
}

// ProvenanceProblem is one failed check of a record.
type ProvenanceProblem struct {
	Field   string `json:"field"`
	Problem string `json:"problem"`
}

// CollectRequest runs one collection.
type CollectRequest struct {
	DryRun bool `json:"dry_run,omitempty"`
	// Remote collects the remote content store (esfd --cas-remote) instead
	// of the local one; RemoteGraceSeconds keeps keys younger than that
	// (default 3600).
	Remote             bool  `json:"remote,omitempty"`
	RemoteGraceSeconds int64 `json:"remote_grace_seconds,omitempty"`
}

// CollectReport is what a collection found and reclaimed.
type CollectReport struct {
	GCReport
	Millis int64 `json:"ms"`
	// Remote is the remote collection's report (CollectRequest.Remote).
	Remote *RemoteCollectReport `json:"remote,omitempty"`
}

// GCReport is what a collection found and did.
type GCReport struct {
	// Examined counts the objects the walk listed.
	Examined int64 `json:"examined"`
	// Live counts the objects marked reachable (set by Collect).
	Live int64 `json:"live"`
	// Deleted counts the objects deleted, or that a dry run would delete.
	Deleted int64 `json:"deleted"`
	// BytesReclaimed sums their sizes.
	BytesReclaimed int64 `json:"bytes_reclaimed"`
	// Spared counts candidates found protected (or live, or already gone)
	// when their turn to be deleted came.
	Spared int64 `json:"spared"`
	// DryRun tells whether anything was actually deleted.
	DryRun bool `json:"dry_run"`
}

// RemoteCollectReport says what Collect did (or would do).
type RemoteCollectReport struct {
	Examined       int64 `json:"examined"`
	Deleted        int64 `json:"deleted"`
	BytesReclaimed int64 `json:"bytes_reclaimed"`
	PacksRewritten int64 `json:"packs_rewritten"`
	PacksDeleted   int64 `json:"packs_deleted"`
	Orphans        int64 `json:"orphans_deleted"`
	KeptYoung      int64 `json:"kept_young"`
}

// RemoteStatus describes the remote content store and the cache.
type RemoteStatus struct {
	Location   string `json:"location"`
	Durability string `json:"durability"` // sync or async
	// Queue: writes and objects waiting for upload (async), and the last
	// upload failure ("" once one succeeded).
	QueueFiles   int    `json:"queue_files"`
	QueueObjects int    `json:"queue_objects"`
	QueueError   string `json:"queue_error,omitempty"`
	// Traffic since the daemon started.
	Fetches       int64 `json:"fetches"`
	FetchedBytes  int64 `json:"fetched_bytes"`
	Uploads       int64 `json:"uploads"`
	UploadedBytes int64 `json:"uploaded_bytes"`
	Corrupt       int64 `json:"corrupt_fetches"`
	Evictions     int64 `json:"evictions"`
	// CacheSize is the bound (0: none), CacheUsed what the tier counts.
	CacheSize int64 `json:"cache_size"`
	CacheUsed int64 `json:"cache_used"`
}

// Dropped says what an export left out because it could give privilege on
// the host. A dropped device is not written at all; a file that lost its
// setuid or setgid bit or a security.* xattr is written without them.
type Dropped struct {
	SetID   int64 `json:"setid"`   // non-directories whose setuid/setgid bits were cleared
	Xattrs  int64 `json:"xattrs"`  // security.* xattrs left out
	Devices int64 `json:"devices"` // character and block devices left out
	// Paths are the first MaxDroppedPaths paths (relative to the root)
	// that lost something, in export order, never null.
	Paths []string `json:"paths"`
}

// Any reports whether anything was dropped.
func (d Dropped) Any() bool { return d.SetID+d.Xattrs+d.Devices > 0 }

// String says what was dropped in a few words, "" when nothing was.
func (d Dropped) String() string {
	var parts []string
	if d.SetID > 0 {
		parts = append(parts, fmt.Sprintf("%d setuid/setgid bits", d.SetID))
	}
	if d.Xattrs > 0 {
		parts = append(parts, fmt.Sprintf("%d security.* xattrs", d.Xattrs))
	}
	if d.Devices > 0 {
		parts = append(parts, fmt.Sprintf("%d device nodes", d.Devices))
	}
	return strings.Join(parts, ", ")
}
