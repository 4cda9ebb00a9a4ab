package v1

import (
	"net/url"
	"strconv"
	"time"
)

// StatusResponse is the body of GET /v1/status.
type StatusResponse struct {
	Version  string `json:"version"`
	StateDir string `json:"state_dir"`
	Objects  int64  `json:"objects"`
	Bytes    int64  `json:"bytes"`
	// Remote describes the remote content store (esfd --cas-remote).
	Remote *RemoteStatus `json:"remote,omitempty"`
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
	RootID     ID       `json:"root_id"`
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
	RootID   ID     `json:"root_id"`
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
	Dropped Dropped `json:"dropped"`
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
	Checked  int64 `json:"checked"`
	Bytes    int64 `json:"bytes"`
	Vanished int64 `json:"vanished"` // listed, then deleted before it was read
	Bad      []ID  `json:"bad"`      // sorted, never null
	// Missing lists, sorted, reachable objects the remote lacks (remote
	// checks only).
	Missing []ID `json:"missing,omitempty"`
}

// TreeResponse is the body of GET /v1/tree/{group_id}: the group's graph
// and, for each node that has evaluations, the reward of its newest one.
type TreeResponse struct {
	TreeView
	Rewards map[string]float64 `json:"rewards"` // node_id -> reward, never null
}

// EvidenceResponse is the result of POST /v1/evidence: the stored object.
type EvidenceResponse struct {
	ID   ID    `json:"id"`
	Size int64 `json:"size"`
	New  bool  `json:"new"` // false when the same bytes were stored already
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
	// (Dropped).
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

// DiffResponse is the body of GET /v1/diff: every change from tree A to
// tree B, each after its parent directory, in name order.
type DiffResponse struct {
	A       string   `json:"a"` // the root id a resolved to
	B       string   `json:"b"`
	Changes []Change `json:"changes"`
}

// Change is one difference of a DiffResponse, its kind and meta as their
// names.
type Change struct {
	Path string `json:"path"` // "" is the root directory
	// Kind: added, deleted, modified, type_changed or meta_changed.
	Kind string `json:"kind"`
	// Meta lists the attributes that differ (mode,owner,mtime,xattrs,link).
	Meta string `json:"meta,omitempty"`
	Old  *Entry `json:"old,omitempty"`
	New  *Entry `json:"new,omitempty"`
}

// EventsQuery selects events: GET /v1/events?after=N&group=G&node=N&
// attempt=A&type=T&follow=1. Zero fields select everything.
type EventsQuery struct {
	// After is the sequence number to continue from: only events with a
	// larger Seq are sent.
	After     uint64
	GroupID   string
	NodeID    string
	AttemptID string
	// Types are exact types ("node.forked") or "record.*" prefixes.
	Types []string
	// Follow keeps the stream open and sends events as they commit.
	Follow bool
}

// Values encodes q as the query string of GET /v1/events.
func (q EventsQuery) Values() url.Values {
	v := url.Values{}
	if q.After > 0 {
		v.Set("after", strconv.FormatUint(q.After, 10))
	}
	for k, s := range map[string]string{"group": q.GroupID, "node": q.NodeID, "attempt": q.AttemptID} {
		if s != "" {
			v.Set(k, s)
		}
	}
	for _, t := range q.Types {
		v.Add("type", t)
	}
	if q.Follow {
		v.Set("follow", "1")
	}
	return v
}

// The kinds of a Change.
const (
	ChangeAdded       = "added"
	ChangeDeleted     = "deleted"
	ChangeModified    = "modified"
	ChangeTypeChanged = "type_changed"
	ChangeMetaChanged = "meta_changed"
)

// POST /v1/exec has two forms, told apart by the request's Content-Type.
// Both stream the command's output back as frames:
//
//	[1 byte frame id][4 bytes big-endian payload length][payload]
//
// Stdout and stderr frames carry output as the command produces it; the
// last frame is always an exit frame, whose payload is the JSON
// ExecResult, or the {"code","message"} error that ended the command (a
// timeout, a cancelled request). A body that ends without an exit frame
// was cut short.
//
// The plain form (application/json) sends the ExecRequest as its body and
// takes no stdin and no terminal. Failures before the command produced
// anything are ordinary JSON error responses.
//
// The interactive form (MediaExecStream) carries frames in both directions
// on one HTTP/1.1 exchange: stdin, end of stdin and window sizes go up in
// the request body while output comes down.
const (
	FrameStdin  byte = 0 // up: stdin bytes; an empty payload ends stdin
	FrameStdout byte = 1 // down
	FrameStderr byte = 2 // down
	FrameExit   byte = 3 // down, last: the result or the error
	FrameResize byte = 4 // up: rows, cols, big-endian uint16 each
	// FrameRequest is the first frame of an interactive request body: the
	// JSON ExecRequest.
	FrameRequest byte = 5
	// FrameStdinAck returns stdin credit: a big-endian uint32 count of
	// stdin bytes the command's stdin took (or dropped, once it was
	// closed). See StdinWindow.
	FrameStdinAck byte = 6
)

// StdinWindow is how many bytes of stdin a client of the interactive exec
// may have sent and not yet acknowledged.
const StdinWindow = 256 << 10
