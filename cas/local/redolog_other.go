//go:build !linux

package local

import (
	"fmt"

	"github.com/esf-dev/esf/cas"
)

// redoLog is Linux's (redolog.go): elsewhere the store has no batches.
type redoLog struct{}

func openRedoLog(*Store) (*redoLog, error) { return nil, nil }

func (*redoLog) close() error { return nil }

// Redo is Linux's (redolog.go).
func (s *Store) Redo(id cas.ID, data []byte) error {
	return fmt.Errorf("redo %s: %w", id, cas.ErrUnsupported)
}

// Sync is Linux's (redolog.go).
func (s *Store) Sync() error { return fmt.Errorf("sync: %w", cas.ErrUnsupported) }
