package fabric

import (
	"encoding/json"
	"fmt"

	"github.com/esf-dev/esf/journal"
)

// rtData is what an attempt's runtime record keeps beside the paths.
type rtData struct {
	// BaseRootID is the root mounted as the overlay's lower layer: the
	// tree that seal compares the upper directory against.
	BaseRootID string `json:"base_root_id,omitempty"`
	// TTLMillis and MemoryBytes are what a queued attempt starts with;
	// MemoryBytes stays as its reservation against the memory quota.
	TTLMillis   int64 `json:"ttl_ms,omitempty"`
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	// DiskBytes is the limit of the delta, set when it is made (0: none).
	DiskBytes int64 `json:"disk_bytes,omitempty"`
	// Container is the runc attempt's container configuration.
	Container *ContainerConfig `json:"container,omitempty"`
	// BootID is the machine's boot (delta.BootID) when the delta was
	// mounted: its volatile upper directory is whole only if the machine
	// has not restarted since.
	BootID string `json:"boot_id,omitempty"`
}

func (d rtData) json() json.RawMessage {
	b, _ := json.Marshal(d)
	return b
}

// runtimeData decodes the data of attempt runtime record rt: the one place
// that reads it. Data that does not decode is corrupt (errdefs.ErrCorrupt):
// read as zero values it would lose the attempt's base root (a seal
// against the wrong tree, a GC that frees the root under its mount), its
// limits or its container. No record, or one without data, is the zero
// rtData.
func runtimeData(rt *journal.AttemptRuntime) (rtData, error) {
	var d rtData
	if rt == nil || len(rt.Data) == 0 {
		return d, nil
	}
	if err := json.Unmarshal(rt.Data, &d); err != nil {
		return rtData{}, fmt.Errorf("attempt %s: runtime record: %v: %w", rt.AttemptID, err, journal.ErrCorrupt)
	}
	return d, nil
}

// baseRoot is the lower root of an attempt: recorded at mount time, or the
// node's root for an attempt not mounted yet.
func baseRoot(n journal.Node, rt *journal.AttemptRuntime) (string, error) {
	d, err := runtimeData(rt)
	if err != nil {
		return "", err
	}
	if d.BaseRootID != "" {
		return d.BaseRootID, nil
	}
	return n.RootID, nil
}
