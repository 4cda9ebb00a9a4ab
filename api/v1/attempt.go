package v1

import "encoding/json"

// Attempts: activation, leases, sealing, mounts and exec.

// ActivateRequest leases a node for one attempt.
type ActivateRequest struct {
	NodeID string `json:"node_id"`
	// Worker pins the attempt to that worker of the graph (the API
	// forwards the call to it); empty lets the API place it.
	Worker   string `json:"worker,omitempty"`
	Executor string `json:"executor,omitempty"` // "none" (default)
	// TTLMillis is the lease's time to live; DefaultLeaseTTL when zero.
	TTLMillis int64 `json:"ttl_ms,omitempty"`
	// Root, if set, is where the writable root is mounted (esfctl mount
	// --rw); it must be an empty directory. Default: under the state dir.
	Root string `json:"root,omitempty"`
	// RetryOf names the failed attempt this one retries.
	RetryOf string `json:"retry_of,omitempty"`
	// MemoryBytes is the attempt's memory limit, reserved against the
	// daemon's memory quota. When zero: the daemon's default memory limit
	// for a runc attempt, else DefaultAttemptMemory when a memory quota is
	// set. A runc attempt's cgroup gets the same number.
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	// DiskBytes limits the bytes (data and metadata, so also the number
	// of files) the attempt's delta may hold: writes past it fail inside
	// with EDQUOT. Default: the daemon's DefaultDiskBytes.
	DiskBytes int64 `json:"disk_bytes,omitempty"`
	// NoQueue refuses with quota_exceeded instead of queueing when the
	// daemon is at capacity.
	NoQueue bool `json:"no_queue,omitempty"`
	// For runc attempts: the container's limits (zero: the daemon's
	// defaults, Options.DefaultLimits) and defaults for execs.
	Pids    int64    `json:"pids,omitempty"`
	CPUs    float64  `json:"cpus,omitempty"`
	Env     []string `json:"env,omitempty"`
	Workdir string   `json:"workdir,omitempty"`
	User    string   `json:"user,omitempty"` // UID[:GID]
	// CapAdd gives the container capabilities dropped by default
	// (executor.DroppedCapabilities); anything else is invalid_argument.
	CapAdd []string `json:"cap_add,omitempty"`
	// Labels are kept on the attempt record and so in the provenance of
	// the nodes it seals (at most 64; keys 1..256 bytes).
	Labels map[string]string `json:"labels,omitempty"`
}

// ReleaseRequest ends an attempt.
type ReleaseRequest struct {
	AttemptID string `json:"attempt_id"`
	// Token, if set, must be the attempt's current lease token.
	Token uint64 `json:"token,omitempty"`
}

// RetryRequest starts a new attempt where a failed one ended.
type RetryRequest struct {
	AttemptID string `json:"attempt_id"`
	TTLMillis int64  `json:"ttl_ms,omitempty"`
}

// RenewRequest extends a lease.
type RenewRequest struct {
	LeaseID   string `json:"lease_id"`
	Token     uint64 `json:"token"`
	TTLMillis int64  `json:"ttl_ms,omitempty"`
}

// SuspendRequest seals an attempt's delta into a node.
type SuspendRequest struct {
	AttemptID string `json:"attempt_id"`
	// LogicalState of the sealed node; the attempt node's when absent.
	LogicalState json.RawMessage `json:"logical_state,omitempty"`
	// KeepRunning seals a checkpoint and leaves the attempt active; its
	// next seal becomes a child of this one.
	KeepRunning bool `json:"keep_running,omitempty"`
	// Token, if set, must be the attempt's current lease token.
	Token uint64 `json:"token,omitempty"`
}

// SuspendResult is the sealed node and the attempt after the seal.
type SuspendResult struct {
	Node    Node        `json:"node"`
	Attempt AttemptView `json:"attempt"`
}

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

// UmountRequest undoes a Mount.
type UmountRequest struct {
	Dir string `json:"dir"`
}

// ExecRequest runs one command in an attempt.
type ExecRequest struct {
	AttemptID string   `json:"attempt_id"`
	Args      []string `json:"args"`
	Env       []string `json:"env,omitempty"`
	Workdir   string   `json:"workdir,omitempty"`
	User      string   `json:"user,omitempty"`
	TTY       bool     `json:"tty,omitempty"`
	Rows      uint16   `json:"rows,omitempty"`
	Cols      uint16   `json:"cols,omitempty"`
	Stdin     bool     `json:"stdin,omitempty"`
	// TimeoutMillis kills the command after that long (deadline_exceeded).
	TimeoutMillis int64 `json:"timeout_ms,omitempty"`
	// For wasi attempts: Module runs a module stored in the CAS (hex id)
	// instead of Args[0] read from the root; MemoryLimitPages caps its
	// linear memory (64 KiB pages).
	Module           string `json:"module,omitempty"`
	MemoryLimitPages uint32 `json:"memory_limit_pages,omitempty"`
}

// ExecResult is how a command ended.
type ExecResult struct {
	ExitCode int   `json:"exit_code"`
	Millis   int64 `json:"ms"`
	// OOMKilled: the kernel's OOM killer ended the command (exit 137)
	// because the attempt hit its memory limit.
	OOMKilled bool `json:"oom_killed,omitempty"`
}
