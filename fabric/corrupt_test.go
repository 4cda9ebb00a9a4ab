package fabric

import (
	"context"
	"encoding/json"
	"os"
	"testing"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/ingest"
	"github.com/esf-dev/esf/journal"
)

// TestReportCorrupt: each whole line the projection appended to its log
// becomes one cas.corrupt event, once; a partial line waits for its end.
func TestReportCorrupt(t *testing.T) {
	ctx := context.Background()
	f, err := Open(ctx, Options{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	a, b := cas.Sum([]byte("a")), cas.Sum([]byte("b"))
	log, err := os.OpenFile(f.projection.corruptLog, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	log.WriteString(a.String() + "\n" + b.String()[:10])
	if n, err := f.ReportCorrupt(ctx); err != nil || n != 1 {
		t.Fatalf("report: %d, %v; want 1", n, err)
	}
	log.WriteString(b.String()[10:] + "\n")
	if n, err := f.ReportCorrupt(ctx); err != nil || n != 1 {
		t.Fatalf("report of the completed line: %d, %v; want 1", n, err)
	}
	if n, err := f.ReportCorrupt(ctx); err != nil || n != 0 {
		t.Fatalf("report with nothing new: %d, %v", n, err)
	}
	var got []string
	if err := f.journal.View(ctx, func(r journal.Reader) error {
		return r.Events(0, func(ev journal.Event) error {
			if ev.Type == EventCASCorrupt {
				var d struct {
					BlobID string `json:"blob_id"`
				}
				json.Unmarshal(ev.Data, &d)
				got = append(got, d.BlobID)
			}
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != a.String() || got[1] != b.String() {
		t.Errorf("events %v", got)
	}
}

// A large import hands its memory back at once; a small one does not pay
// for a forced collection.
func TestLargeImportReturnsMemory(t *testing.T) {
	calls := 0
	old := freeOSMemory
	freeOSMemory = func() { calls++ }
	defer func() { freeOSMemory = old }()
	f := &Fabric{}
	f.returnMemory(ingest.Stats{Files: 10, Dirs: 2})
	if calls != 0 {
		t.Errorf("a small import forced a collection")
	}
	f.returnMemory(ingest.Stats{Files: largeTree})
	if calls != 1 {
		t.Errorf("a large import did not return its memory")
	}
}
