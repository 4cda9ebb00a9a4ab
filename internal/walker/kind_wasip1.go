//go:build wasip1

package main

import (
	"io/fs"
	"syscall"
)

// kindOther reports a file WASI could not type: Go on wasip1 gives it no
// type bits, as it does a regular file, but keeps the WASI file type.
func kindOther(fi fs.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Filetype != syscall.FILETYPE_REGULAR_FILE
}
