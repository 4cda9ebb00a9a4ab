package testenv

import (
	"testing"

	"golang.org/x/sys/unix"
)

// ReadOnlyBind bind-mounts dir read-only at mountpoint (an existing empty
// directory) until t ends. A read-only bind refuses writes after the
// permission check, where a read-only filesystem refuses them first
// (EROFS): compare write access across the two with care. Needs root.
func ReadOnlyBind(t testing.TB, dir, mountpoint string) {
	t.Helper()
	if err := unix.Mount(dir, mountpoint, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind %s at %s: %v", dir, mountpoint, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mountpoint, 0); err != nil {
			t.Errorf("unmount %s: %v", mountpoint, err)
		}
	})
	if err := unix.Mount("", mountpoint, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("remount %s read-only: %v", mountpoint, err)
	}
}
