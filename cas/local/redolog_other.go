//go:build !linux

package local

// redoLog is Linux's (redolog.go): elsewhere the store has no batches.
type redoLog struct{}

func openRedoLog(*Store) (*redoLog, error) { return nil, nil }

func (*redoLog) close() error { return nil }
