package workspace

import (
	"context"
	"io"
	"time"

	"github.com/esf-dev/esf/sandbox"
	"github.com/esf-dev/esf/vfs"
)

// Spec asks a provider for a new session.
type Spec struct {
	// Image names what the session starts from, in the provider's terms: an
	// OCI image reference, a template id, an esf node or root id. "" means
	// the provider's default.
	Image string
	// WorkDir is the session's working directory: the cwd of Run and the
	// base of relative paths. "" means the provider's home directory.
	WorkDir string
	// Env is set for every command of the session.
	Env map[string]string
	// Timeout is the session's lifetime: the provider may reclaim it that
	// long after Create (or the last Resume) unless it was closed first.
	// Zero means the provider's default.
	Timeout time.Duration
	// Metadata is stored with the session and returned by Enumerator; keys
	// and values are opaque to the provider.
	Metadata map[string]string
}

// Session is one live workspace.
type Session interface {
	// ID is the session's opaque id, valid for Provider.Attach.
	ID() string

	sandbox.Sandbox
	vfs.Backend

	// Upload streams r into path, creating parent directories, and replaces
	// the file atomically when r is fully read: a failed or cancelled upload
	// leaves the old file (or none). The file gets mode 0644 when new.
	// Uploading onto a directory fails and leaves the directory.
	// Implementations do not hold the whole file in memory.
	Upload(ctx context.Context, path string, r io.Reader) error
	// Download opens path for streaming. The caller closes the reader;
	// cancelling ctx aborts the transfer. A directory is fs.ErrInvalid.
	Download(ctx context.Context, path string) (io.ReadCloser, error)

	// Close ends the session and frees everything it holds on the provider
	// (container, VM, lease). It is idempotent on the same handle; closing a
	// session another handle already closed returns ErrNotFound.
	Close(ctx context.Context) error
}

// Provider creates and finds sessions. Credentials, tenancy, endpoints and
// resource policy are the provider's configuration, never part of Spec.
type Provider interface {
	// Create starts a new session. When ctx ends before Create returns, no
	// session is left behind.
	Create(ctx context.Context, spec Spec) (Session, error)
	// Attach returns a handle to an existing session (running or paused)
	// without changing its state. An unknown id is ErrNotFound.
	Attach(ctx context.Context, id string) (Session, error)
}

// Pauser is the optional capability of suspending a session so it costs no
// compute, keeping its files (and, where the provider can, its processes).
type Pauser interface {
	// Pause suspends the session; pausing a paused session is a no-op.
	// While paused, Run and file operations return ErrPaused.
	Pause(ctx context.Context) error
	// Resume makes a paused session usable again under the same ID;
	// resuming a running session is a no-op.
	Resume(ctx context.Context) error
}

// Info describes a session without attaching to it.
type Info struct {
	ID       string
	Paused   bool
	Metadata map[string]string
}

// Enumerator is the optional Provider capability of listing the sessions the
// configured credentials can see: the way to find sessions a crashed caller
// left, and how the conformance suite proves nothing leaked.
type Enumerator interface {
	Sessions(ctx context.Context) ([]Info, error)
}
