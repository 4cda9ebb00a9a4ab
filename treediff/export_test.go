package treediff

// SetTextLimit lowers the size past which Patch treats files as binary, so
// tests reach that path with small files. It returns the old limit's
// restorer.
func SetTextLimit(n int64) (restore func()) {
	old := textLimit
	textLimit = n
	return func() { textLimit = old }
}
