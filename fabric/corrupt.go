package fabric

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/journal"
)

// EventCASCorrupt is logged when a blob's content no longer matches its
// id: the projection refused to serve it (readers got EIO). Data:
// {"blob_id": hex, "source": "projection"}.
const EventCASCorrupt = "cas.corrupt"

// maxCorruptRead bounds what one ReportCorrupt reads of the log.
const maxCorruptRead = 1 << 20

// ReportCorrupt turns what the projection server recorded in its corrupt
// log since the last call into cas.corrupt events, and returns how many.
// esfd runs it every second; tests call it directly. Only whole lines are
// consumed: a line being written is read next time.
func (f *Fabric) ReportCorrupt(ctx context.Context) (int, error) {
	f.corruptMu.Lock()
	defer f.corruptMu.Unlock()
	file, err := os.Open(f.projection.corruptLog)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("report corrupt blobs: %w", err)
	}
	defer file.Close()
	buf := make([]byte, maxCorruptRead)
	n, err := file.ReadAt(buf, f.corruptOff)
	if err != nil && err != io.EOF {
		return 0, fmt.Errorf("report corrupt blobs: %w", err)
	}
	buf = buf[:n]
	end := bytes.LastIndexByte(buf, '\n')
	if end < 0 {
		return 0, nil
	}
	var ids []cas.ID
	for line := range bytes.SplitSeq(buf[:end], []byte{'\n'}) {
		id, err := cas.ParseID(string(line))
		if err != nil {
			f.log.Warn("corrupt blob log: bad line", "line", string(line))
			continue
		}
		ids = append(ids, id)
	}
	if len(ids) > 0 {
		err := f.journal.Update(ctx, func(tx journal.Tx) error {
			for _, id := range ids {
				data, _ := json.Marshal(map[string]string{"blob_id": id.String(), "source": "projection"})
				if err := tx.AppendEvent(journal.Event{Type: EventCASCorrupt, Data: data}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("report corrupt blobs: %w", err)
		}
	}
	f.corruptOff += int64(end + 1)
	return len(ids), nil
}
