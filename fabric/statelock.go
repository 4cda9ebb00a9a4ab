package fabric

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// StateLock is a held lock of a state dir: while it is held, no other
// process of that dir lives. Its ID names the dir's holder; an etcd worker
// registers under it (journal/etcd Worker.State), so that a daemon
// restarted on the same state dir, which holds the lock and so knows its
// predecessor is dead, takes the worker's registration back at once
// instead of waiting for the dead one's lease to end.
type StateLock struct {
	dir string
	f   *os.File
	id  string
}

// stateIDFile holds the state dir's random identity, made once.
const stateIDFile = "state-id"

// LockState creates dir if needed and takes its lock (as Open does: a
// dir another process holds fails with errdefs.ErrFailedPrecondition).
// Pass it to Open as Options.StateLock; Open then owns it.
func LockState(dir string) (*StateLock, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("lock state %s: %w", dir, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("lock state %s: %w", dir, err)
	}
	f, err := lockStateDir(dir)
	if err != nil {
		return nil, err
	}
	id, err := stateID(dir)
	if err == nil {
		// The lock file itself: the flock proves only that no process
		// holds this inode, so a copy of the dir (state-id and all) is
		// another identity.
		var st unix.Stat_t
		if err = unix.Fstat(int(f.Fd()), &st); err == nil {
			id = fmt.Sprintf("%s/%d:%d", id, st.Dev, st.Ino)
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock state %s: %w", dir, err)
	}
	return &StateLock{dir: dir, f: f, id: id}, nil
}

// stateID reads the dir's random identity, making it on first use (under
// the lock), and adds the host's boot id: the lock proves only that no
// process of this boot of this host holds the dir, so the dir on another
// host or boot (or with the boot id unreadable) has another identity.
func stateID(dir string) (string, error) {
	p := filepath.Join(dir, stateIDFile)
	b, err := os.ReadFile(p)
	id := strings.TrimSpace(string(b))
	if errors.Is(err, fs.ErrNotExist) || (err == nil && id == "") {
		var r [16]byte
		if _, err := rand.Read(r[:]); err != nil {
			return "", fmt.Errorf("state %s: make its id: %w", dir, err)
		}
		id = hex.EncodeToString(r[:])
		tmp := p + ".tmp"
		if err := os.WriteFile(tmp, []byte(id+"\n"), 0o600); err != nil {
			return "", fmt.Errorf("state %s: write its id: %w", dir, err)
		}
		if err := os.Rename(tmp, p); err != nil {
			return "", fmt.Errorf("state %s: write its id: %w", dir, err)
		}
	} else if err != nil {
		return "", fmt.Errorf("state %s: read its id: %w", dir, err)
	}
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		r := make([]byte, 16)
		rand.Read(r)
		boot = []byte("unknown-" + hex.EncodeToString(r))
	}
	return id + "@" + strings.TrimSpace(string(boot)), nil
}

// ID is the identity of the state dir's holder: the dir's random id, the
// host's boot id and the lock file's device and inode.
func (l *StateLock) ID() string { return l.id }

// Close releases the lock (Open's Close does, once it owns it); closing
// twice is harmless.
func (l *StateLock) Close() error {
	if err := l.f.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
		return err
	}
	return nil
}
