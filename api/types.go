package api

import (
	"time"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/export"
	"github.com/esf-dev/esf/fabric"
	"github.com/esf-dev/esf/ingest"
	"github.com/esf-dev/esf/treediff"
)

// The request and response bodies of /v1/. Field names are the spec's
// (snake_case, root_id, ...) and never change meaning; docs/openapi.yaml
// describes the same shapes.

// StatusResponse is the body of GET /v1/status.
type StatusResponse struct {
	Version  string `json:"version"`
	StateDir string `json:"state_dir"`
	Objects  int64  `json:"objects"`
	Bytes    int64  `json:"bytes"`
	// Remote describes the remote content store (esfd --cas-remote).
	Remote *fabric.RemoteStatus `json:"remote,omitempty"`
}

// Worker is one worker of the graph in GET /v1/workers: its id, API
// address, capacity (live attempts at once, 0 unbounded) and load.
type Worker struct {
	ID       string    `json:"id"`
	Addr     string    `json:"addr,omitempty"`
	Capacity int       `json:"capacity"`
	Live     int       `json:"live"`
	Started  time.Time `json:"started,omitzero"`
	TTLMS    int64     `json:"ttl_ms,omitempty"`
	// Self marks the worker that answered.
	Self bool `json:"self,omitempty"`
}

// WorkersResponse is the body of GET /v1/workers.
type WorkersResponse struct {
	Workers []Worker `json:"workers"`
	// Fenced says the answering worker lost its registration: it can
	// change nothing and has stopped its sandboxes (restart it).
	Fenced bool `json:"fenced,omitempty"`
}

// ImportRequest is the JSON body of POST /v1/import: a path on the daemon's
// host (a directory, a tar of any compression, an OCI layout or archive).
type ImportRequest struct {
	Source string `json:"source"`
}

// ImportResponse is the result of POST /v1/import.
type ImportResponse struct {
	RootID     cas.ID   `json:"root_id"`
	Files      int64    `json:"files"`
	Dirs       int64    `json:"dirs"`
	Symlinks   int64    `json:"symlinks"`
	Others     int64    `json:"others"` // fifos and devices
	Bytes      int64    `json:"bytes"`  // file content read
	NewObjects int64    `json:"new_objects"`
	NewBytes   int64    `json:"new_bytes"`
	Skipped    []string `json:"skipped"` // what could not be represented (e.g. sockets), never null
}

// ExportRequest is the body of POST /v1/export: write the tree of ID into
// the directory To on the daemon's host.
type ExportRequest struct {
	ID string `json:"id"`
	To string `json:"to"`
	// PreservePrivileged keeps setuid/setgid bits, security.* xattrs and
	// device nodes, which are dropped by default.
	PreservePrivileged bool `json:"preserve_privileged,omitempty"`
}

// ExportResponse is the result of POST /v1/export.
type ExportResponse struct {
	RootID   cas.ID `json:"root_id"`
	To       string `json:"to"`
	Files    int64  `json:"files"`
	Dirs     int64  `json:"dirs"`
	Symlinks int64  `json:"symlinks"`
	Others   int64  `json:"others"`  // fifos and devices
	Links    int64  `json:"links"`   // extra names of hard-link groups
	Bytes    int64  `json:"bytes"`   // content bytes written
	Skipped  int64  `json:"skipped"` // devices and xattrs the destination refused
	// Dropped is what the export left out on purpose because it could
	// give privilege on the host.
	Dropped export.Dropped `json:"dropped"`
}

// FsckRequest is the (optional) body of POST /v1/fsck. Remote checks the
// remote content store instead of the local one: every object the graph
// reaches must be there and whole.
type FsckRequest struct {
	Remote bool `json:"remote,omitempty"`
}

// FsckResponse is the result of POST /v1/fsck. A non-empty Bad is still a
// 200: the check itself succeeded, and the client decides how to report it.
type FsckResponse struct {
	Checked  int64    `json:"checked"`
	Bytes    int64    `json:"bytes"`
	Vanished int64    `json:"vanished"` // listed, then deleted before it was read
	Bad      []cas.ID `json:"bad"`      // sorted, never null
	// Missing lists, sorted, reachable objects the remote lacks (remote
	// checks only).
	Missing []cas.ID `json:"missing,omitempty"`
}

// The graph and attempt endpoints take and return the fabric types as they
// are (fabric.ForkRequest, fabric.Inspection, journal.Group, ...); only the
// shapes below are the API's own.

// TreeResponse is the body of GET /v1/tree/{group_id}: the group's graph
// and, for each node that has evaluations, the reward of its newest one.
type TreeResponse struct {
	fabric.TreeView
	Rewards map[string]float64 `json:"rewards"` // node_id -> reward, never null
}

// EvidenceResponse is the result of POST /v1/evidence: the stored object.
type EvidenceResponse struct {
	ID   cas.ID `json:"id"`
	Size int64  `json:"size"`
	New  bool   `json:"new"` // false when the same bytes were stored already
}

// Headers of the API.
const (
	// HeaderIdempotencyKey names a mutation so that a retry returns the first
	// result instead of doing it twice (1 to 255 visible ASCII characters).
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderKeyGenerated: "true" says the client made its Idempotency-Key
	// up for this one call (as esfctl does when not given one), so the
	// daemon keeps its result as long as one it made up itself, not for
	// ever. Any other value is invalid.
	HeaderKeyGenerated = "Esf-Idempotency-Key-Generated"
	// HeaderTraceparent is the W3C trace context header.
	HeaderTraceparent = "Traceparent"
	// HeaderRootID is set on GET /v1/export/{id}.tar to the resolved root.
	HeaderRootID = "Esf-Root-Id"
	// TrailerStatus ends every streamed export: "ok" when the stream is
	// complete, "error" otherwise. A client that does not see "ok" after
	// the last byte must treat what it received as truncated.
	TrailerStatus = "Esf-Status"
	// TrailerError carries the {"code","message"} of a failure that happened
	// after the stream started (ASCII-only JSON).
	TrailerError = "Esf-Error"
	// TrailerDropped ends a complete GET /v1/export/{id}.tar: the JSON of
	// what the tar left out because it could give privilege on the host
	// (export.Dropped).
	TrailerDropped = "Esf-Dropped"
	// QueryPreservePrivileged=true on GET /v1/export/{id}.tar keeps
	// setuid/setgid bits, security.* xattrs and device nodes.
	QueryPreservePrivileged = "preserve_privileged"
)

// Media types.
const (
	MediaJSON   = "application/json"
	MediaTar    = "application/x-tar"
	MediaNDJSON = "application/x-ndjson" // GET /v1/events: one JSON event per line
	MediaBinary = "application/octet-stream"
	MediaPatch  = "text/x-diff" // GET /v1/patch: a git patch
	// MediaExecStream is the framed body of POST /v1/exec (see exec.go).
	MediaExecStream = "application/vnd.esf.exec-stream"
)

// tarMediaTypes are the Content-Types POST /v1/import takes as a tar stream;
// the importer detects compression from the bytes, not from the type.
var tarMediaTypes = map[string]bool{
	MediaTar:                   true,
	"application/x-gtar":       true,
	"application/gzip":         true,
	"application/x-gzip":       true,
	"application/zstd":         true,
	"application/octet-stream": true,
}

func importResponse(r ingest.Result) ImportResponse {
	skipped := r.Skipped
	if skipped == nil {
		skipped = []string{}
	}
	return ImportResponse{
		RootID:     r.Root,
		Files:      r.Files,
		Dirs:       r.Dirs,
		Symlinks:   r.Symlinks,
		Others:     r.Others,
		Bytes:      r.Bytes,
		NewObjects: r.NewObjects,
		NewBytes:   r.NewBytes,
		Skipped:    skipped,
	}
}

// DiffResponse is the body of GET /v1/diff: every change from tree A to
// tree B, each after its parent directory, in name order.
type DiffResponse struct {
	A       string   `json:"a"` // the root id a resolved to
	B       string   `json:"b"`
	Changes []Change `json:"changes"`
}

// Change is one difference of a DiffResponse: treediff.Change with its
// kind and meta as their names (treediff's types encode as text but do not
// decode), so clients need no treediff to read it.
type Change struct {
	Path string `json:"path"` // "" is the root directory
	// Kind: added, deleted, modified, type_changed or meta_changed.
	Kind string `json:"kind"`
	// Meta lists the attributes that differ (mode,owner,mtime,xattrs,link).
	Meta string     `json:"meta,omitempty"`
	Old  *cas.Entry `json:"old,omitempty"`
	New  *cas.Entry `json:"new,omitempty"`
}

func wireChange(c treediff.Change) Change {
	return Change{Path: c.Path, Kind: c.Kind.String(), Meta: c.Meta.String(), Old: c.Old, New: c.New}
}
