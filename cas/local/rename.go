package local

import "os"

// linkAndRemove publishes oldpath as newpath without ever replacing newpath:
// link(2) fails with EEXIST when the name is taken.
func linkAndRemove(oldpath, newpath string) error {
	if err := os.Link(oldpath, newpath); err != nil {
		return err
	}
	// The object is published; a temp name left behind is only garbage that
	// Open removes later.
	_ = os.Remove(oldpath)
	return nil
}
