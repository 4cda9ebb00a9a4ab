package api

import (
	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/ingest"
)

// The request and response bodies of /v1/ are in api/v1; convert.go
// turns the daemon's records into them.

// tarMediaTypes are the Content-Types POST /v1/import takes as a tar stream;
// the importer detects compression from the bytes, not from the type.
var tarMediaTypes = map[string]bool{
	v1.MediaTar:                true,
	"application/x-gtar":       true,
	"application/gzip":         true,
	"application/x-gzip":       true,
	"application/zstd":         true,
	"application/octet-stream": true,
}

func importResponse(r ingest.Result) v1.ImportResponse {
	skipped := r.Skipped
	if skipped == nil {
		skipped = []string{}
	}
	return v1.ImportResponse{
		RootID:     idView(r.Root),
		Files:      r.Files,
		Dirs:       r.Dirs,
		Symlinks:   r.Symlinks,
		Others:     r.Others,
		Bytes:      r.Bytes,
		NewObjects: r.NewObjects,
		NewBytes:   r.NewBytes,
		Skipped:    skipped,
	}
}
