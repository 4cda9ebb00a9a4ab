//go:build !wasip1

package main

import "io/fs"

// kindOther: outside wasip1 a file with no type bits is a regular file.
func kindOther(fs.FileInfo) bool { return false }
