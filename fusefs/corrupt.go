package fusefs

import (
	"log/slog"
	"os"

	"github.com/esf-dev/esf/cas"
)

// CorruptLogName is the file, in the daemon's state dir, where a
// projection server appends the id of every blob it found corrupt, one
// hex id per line. The daemon reads it to emit cas.corrupt events: the
// server knows no journal, and it outlives daemon restarts.
const CorruptLogName = "corrupt-blobs"

// AppendCorruptLog returns an Options.OnCorrupt that appends to path. A
// failure to write is logged: the open has failed with EIO regardless.
func AppendCorruptLog(path string, log *slog.Logger) func(cas.ID) {
	return func(id cas.ID) {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err == nil {
			// One write of a whole line: O_APPEND keeps lines whole.
			_, err = f.Write([]byte(id.String() + "\n"))
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil && log != nil {
			log.Error("record corrupt blob", "blob", id.String(), "file", path, "err", err)
		}
	}
}
