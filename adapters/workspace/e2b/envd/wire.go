package envd

import "github.com/esf-dev/esf/e2b/envdwire"

// The wire types live in the main module's e2b/envdwire, shared with
// esfd's E2B front door (the server side of this protocol); these names
// keep this package's API as it was.

// Procedures served by envd.
const (
	ProcStart      = envdwire.ProcStart
	ProcSendInput  = envdwire.ProcSendInput
	ProcCloseStdin = envdwire.ProcCloseStdin
	ProcSendSignal = envdwire.ProcSendSignal

	FsStat    = envdwire.FsStat
	FsListDir = envdwire.FsListDir
	FsMakeDir = envdwire.FsMakeDir
	FsRemove  = envdwire.FsRemove
	FsMove    = envdwire.FsMove
)

// Header names and versions.
const (
	HeaderAccessToken   = envdwire.HeaderAccessToken
	HeaderSandboxID     = envdwire.HeaderSandboxID
	HeaderSandboxPort   = envdwire.HeaderSandboxPort
	HeaderKeepalive     = envdwire.HeaderKeepalive
	HeaderTimeoutMs     = envdwire.HeaderTimeoutMs
	DefaultPort         = envdwire.DefaultPort
	TrafficTokenE2B     = envdwire.TrafficTokenE2B
	TrafficTokenCube    = envdwire.TrafficTokenCube
	MinVersionStdinFlag = envdwire.MinVersionStdinFlag
	MinVersionStdinEOF  = envdwire.MinVersionStdinEOF
)

// Signal and file type names.
const (
	SignalTerm      = envdwire.SignalTerm
	SignalKill      = envdwire.SignalKill
	FileTypeFile    = envdwire.FileTypeFile
	FileTypeDir     = envdwire.FileTypeDir
	FileTypeSymlink = envdwire.FileTypeSymlink
)

// Messages and codec.
type (
	Codec             = envdwire.Codec
	Int64             = envdwire.Int64
	ProcessConfig     = envdwire.ProcessConfig
	StartRequest      = envdwire.StartRequest
	StartResponse     = envdwire.StartResponse
	ProcessEvent      = envdwire.ProcessEvent
	StartEvent        = envdwire.StartEvent
	DataEvent         = envdwire.DataEvent
	EndEvent          = envdwire.EndEvent
	ProcessSelector   = envdwire.ProcessSelector
	ProcessInput      = envdwire.ProcessInput
	SendInputRequest  = envdwire.SendInputRequest
	CloseStdinRequest = envdwire.CloseStdinRequest
	SendSignalRequest = envdwire.SendSignalRequest
	Empty             = envdwire.Empty
	EntryInfo         = envdwire.EntryInfo
	PathRequest       = envdwire.PathRequest
	ListDirRequest    = envdwire.ListDirRequest
	ListDirResponse   = envdwire.ListDirResponse
	EntryResponse     = envdwire.EntryResponse
	MoveRequest       = envdwire.MoveRequest
	UploadedEntry     = envdwire.UploadedEntry
	HTTPErrorBody     = envdwire.HTTPErrorBody
)
