package envdwire

import "time"

// Procedures served by envd, as "/<package>.<Service>/<Method>".
const (
	ProcStart      = "/process.Process/Start"
	ProcSendInput  = "/process.Process/SendInput"
	ProcCloseStdin = "/process.Process/CloseStdin"
	ProcSendSignal = "/process.Process/SendSignal"
	ProcConnect    = "/process.Process/Connect"
	ProcList       = "/process.Process/List"
	ProcUpdate     = "/process.Process/Update"

	FsStat    = "/filesystem.Filesystem/Stat"
	FsListDir = "/filesystem.Filesystem/ListDir"
	FsMakeDir = "/filesystem.Filesystem/MakeDir"
	FsRemove  = "/filesystem.Filesystem/Remove"
	FsMove    = "/filesystem.Filesystem/Move"
	FsWatch   = "/filesystem.Filesystem/WatchDir"
)

// Header names envd and the edge proxy read.
const (
	HeaderAccessToken   = "X-Access-Token"
	HeaderSandboxID     = "E2b-Sandbox-Id"
	HeaderSandboxPort   = "E2b-Sandbox-Port"
	HeaderKeepalive     = "Keepalive-Ping-Interval" // seconds
	HeaderTimeoutMs     = "Connect-Timeout-Ms"
	DefaultPort         = 49983
	TrafficTokenE2B     = "e2b-traffic-access-token"
	TrafficTokenCube    = "cube-traffic-access-token"
	MinVersionStdinFlag = "0.3.0" // StartRequest.stdin understood
	MinVersionStdinEOF  = "0.5.2" // CloseStdin exists
)

// process.ProcessConfig.
type ProcessConfig struct {
	Cmd  string            `json:"cmd"`
	Args []string          `json:"args,omitempty"`
	Envs map[string]string `json:"envs,omitempty"`
	Cwd  *string           `json:"cwd,omitempty"`
}

// process.StartRequest. Stdin is optional on the wire: absent means true
// (envd's backward-compatible default), so false must be sent explicitly.
type StartRequest struct {
	Process *ProcessConfig `json:"process"`
	Pty     *PTY           `json:"pty,omitempty"`
	Tag     *string        `json:"tag,omitempty"`
	Stdin   *bool          `json:"stdin,omitempty"`
}

// process.PTY: a terminal of that size.
type PTY struct {
	Size *PTYSize `json:"size,omitempty"`
}

// process.PTY.Size.
type PTYSize struct {
	Cols uint32 `json:"cols,omitempty"`
	Rows uint32 `json:"rows,omitempty"`
}

// process.ConnectRequest: re-attach to a running process. The reply
// stream is StartResponse's.
type ConnectRequest struct {
	Process *ProcessSelector `json:"process"`
}

// process.ListResponse (ListRequest has no fields).
type ListResponse struct {
	Processes []*ProcessInfo `json:"processes,omitempty"`
}

// process.ProcessInfo.
type ProcessInfo struct {
	Config *ProcessConfig `json:"config,omitempty"`
	Pid    uint32         `json:"pid,omitempty"`
	Tag    *string        `json:"tag,omitempty"`
}

// process.UpdateRequest: a new terminal size.
type UpdateRequest struct {
	Process *ProcessSelector `json:"process"`
	Pty     *PTY             `json:"pty,omitempty"`
}

// process.StartResponse.
type StartResponse struct {
	Event *ProcessEvent `json:"event,omitempty"`
}

// process.ProcessEvent: exactly one field is set (a protobuf oneof).
type ProcessEvent struct {
	Start     *StartEvent `json:"start,omitempty"`
	Data      *DataEvent  `json:"data,omitempty"`
	End       *EndEvent   `json:"end,omitempty"`
	Keepalive *struct{}   `json:"keepalive,omitempty"`
}

// process.ProcessEvent.StartEvent.
type StartEvent struct {
	Pid uint32 `json:"pid,omitempty"`
}

// process.ProcessEvent.DataEvent: one of the byte fields is set.
type DataEvent struct {
	Stdout []byte `json:"stdout,omitempty"`
	Stderr []byte `json:"stderr,omitempty"`
	Pty    []byte `json:"pty,omitempty"`
}

// process.ProcessEvent.EndEvent. ExitCode is -1 when a signal ended the
// process; Status is Go's os.ProcessState text ("exit status 3",
// "signal: killed").
type EndEvent struct {
	ExitCode int32   `json:"exitCode,omitempty"`
	Exited   bool    `json:"exited,omitempty"`
	Status   string  `json:"status,omitempty"`
	Error    *string `json:"error,omitempty"`
}

// process.ProcessSelector (oneof pid | tag).
type ProcessSelector struct {
	Pid uint32  `json:"pid,omitempty"`
	Tag *string `json:"tag,omitempty"`
}

// process.ProcessInput (oneof stdin | pty).
type ProcessInput struct {
	Stdin []byte `json:"stdin,omitempty"`
	Pty   []byte `json:"pty,omitempty"`
}

// process.SendInputRequest.
type SendInputRequest struct {
	Process *ProcessSelector `json:"process"`
	Input   *ProcessInput    `json:"input"`
}

// process.CloseStdinRequest.
type CloseStdinRequest struct {
	Process *ProcessSelector `json:"process"`
}

// Signal names of process.Signal.
const (
	SignalTerm = "SIGNAL_SIGTERM"
	SignalKill = "SIGNAL_SIGKILL"
)

// process.SendSignalRequest.
type SendSignalRequest struct {
	Process *ProcessSelector `json:"process"`
	Signal  string           `json:"signal,omitempty"`
}

// Empty is every response (and request) without fields.
type Empty struct{}

// filesystem.FileType names.
const (
	FileTypeFile    = "FILE_TYPE_FILE"
	FileTypeDir     = "FILE_TYPE_DIRECTORY"
	FileTypeSymlink = "FILE_TYPE_SYMLINK"
)

// filesystem.EntryInfo. Mode holds permission bits only.
type EntryInfo struct {
	Name          string            `json:"name,omitempty"`
	Type          string            `json:"type,omitempty"`
	Path          string            `json:"path,omitempty"`
	Size          Int64             `json:"size,omitempty"`
	Mode          uint32            `json:"mode,omitempty"`
	Permissions   string            `json:"permissions,omitempty"`
	Owner         string            `json:"owner,omitempty"`
	Group         string            `json:"group,omitempty"`
	ModifiedTime  *time.Time        `json:"modifiedTime,omitempty"`
	SymlinkTarget *string           `json:"symlinkTarget,omitempty"`
	Metadata      map[string]string `json:"metadata,omitempty"`
}

// PathRequest is filesystem.{Stat,MakeDir,Remove}Request.
type PathRequest struct {
	Path string `json:"path"`
}

// filesystem.ListDirRequest; depth 0 means 1.
type ListDirRequest struct {
	Path  string `json:"path"`
	Depth uint32 `json:"depth,omitempty"`
}

// filesystem.ListDirResponse.
type ListDirResponse struct {
	Entries []*EntryInfo `json:"entries,omitempty"`
}

// EntryResponse is filesystem.{Stat,MakeDir,Move}Response.
type EntryResponse struct {
	Entry *EntryInfo `json:"entry,omitempty"`
}

// filesystem.MoveRequest.
type MoveRequest struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
}

// UploadedEntry is one element of the POST /files answer.
type UploadedEntry struct {
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type"`
}

// HTTPErrorBody is envd's (and the control plane's) JSON error body.
type HTTPErrorBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// filesystem.WatchDirRequest.
type WatchDirRequest struct {
	Path         string `json:"path"`
	Recursive    bool   `json:"recursive,omitempty"`
	IncludeEntry bool   `json:"includeEntry,omitempty"`
}

// filesystem.WatchDirResponse: exactly one field is set.
type WatchDirResponse struct {
	Start      *struct{}        `json:"start,omitempty"`
	Filesystem *FilesystemEvent `json:"filesystem,omitempty"`
	Keepalive  *struct{}        `json:"keepalive,omitempty"`
}

// filesystem.FilesystemEvent: Name is relative to the watched directory.
type FilesystemEvent struct {
	Name  string     `json:"name,omitempty"`
	Type  string     `json:"type,omitempty"`
	Entry *EntryInfo `json:"entry,omitempty"`
}

// filesystem.EventType names.
const (
	EventCreate = "EVENT_TYPE_CREATE"
	EventWrite  = "EVENT_TYPE_WRITE"
	EventRemove = "EVENT_TYPE_REMOVE"
	EventRename = "EVENT_TYPE_RENAME"
	EventChmod  = "EVENT_TYPE_CHMOD"
)
