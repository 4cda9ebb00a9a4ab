//go:build !linux

package local

func renameNoReplace(oldpath, newpath string) error { return linkAndRemove(oldpath, newpath) }
