package e2b

import (
	"bytes"
	"errors"
	"net/http"
	"os"
	"path"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/e2b/envdwire"
	"github.com/esf-dev/esf/internal/rootfs"
)

// WatchDir: inotify on the attempt's root (the overlay the container
// writes through, so its changes are seen), each directory opened inside
// the root as the sandbox's root before it is watched. Recursive watches
// add directories as they appear.

const watchMask = unix.IN_CREATE | unix.IN_MOVED_TO | unix.IN_MODIFY | unix.IN_DELETE | unix.IN_MOVED_FROM |
	unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_ONLYDIR

func (s *Server) fsWatchDir(r *http.Request, req *envdwire.WatchDirRequest, st *stream) error {
	sb, user, _ := s.envdCall(r)
	p, err := sandboxPath(req.Path, user)
	if err != nil {
		return err
	}
	ifd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return rpcErr(codeInternal, "inotify: %v", err)
	}
	f := os.NewFile(uintptr(ifd), "inotify")
	var closeOnce sync.Once
	closeF := func() { closeOnce.Do(func() { f.Close() }) }
	defer closeF()

	var mu sync.Mutex
	dirs := map[int]string{} // watch descriptor → directory relative to p
	add := func(rel string) error {
		return s.withRoot(sb, func(root *rootfs.Root) error {
			var walk func(rel string, top bool) error
			walk = func(rel string, top bool) error {
				fd, err := root.OpenFD(path.Join(p, rel), unix.O_RDONLY|unix.O_DIRECTORY, 0)
				if err != nil {
					return err
				}
				wd, err := unix.InotifyAddWatch(ifd, rootfs.ProcPath(fd), watchMask)
				if err != nil {
					unix.Close(fd)
					return err
				}
				mu.Lock()
				dirs[wd] = rel
				mu.Unlock()
				var subs []string
				if req.Recursive {
					d := os.NewFile(uintptr(fd), rel)
					ents, _ := d.ReadDir(-1)
					d.Close()
					for _, e := range ents {
						if e.IsDir() {
							subs = append(subs, path.Join(rel, e.Name()))
						}
					}
				} else {
					unix.Close(fd)
				}
				for _, sub := range subs {
					if err := walk(sub, false); err != nil && top {
						return err
					}
				}
				return nil
			}
			return walk(rel, true)
		})
	}
	if err := add(""); err != nil {
		return fsError("watch", p, err)
	}
	if err := st.send(&envdwire.WatchDirResponse{Start: &struct{}{}}); err != nil {
		return err
	}

	events := make(chan *envdwire.FilesystemEvent)
	readErr := make(chan error, 1)
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := f.Read(buf)
			if err != nil {
				readErr <- err
				return
			}
			for off := 0; off+unix.SizeofInotifyEvent <= n; {
				ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
				name := string(bytes.TrimRight(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)], "\x00"))
				off += unix.SizeofInotifyEvent + int(ev.Len)
				mu.Lock()
				dir, ok := dirs[int(ev.Wd)]
				mu.Unlock()
				if !ok || name == "" {
					continue
				}
				rel := path.Join(dir, name)
				if req.Recursive && ev.Mask&unix.IN_ISDIR != 0 && ev.Mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0 {
					add(rel)
				}
				for _, t := range eventTypes(ev.Mask) {
					fe := &envdwire.FilesystemEvent{Name: rel, Type: t}
					if req.IncludeEntry && t != envdwire.EventRemove && t != envdwire.EventRename {
						s.withRoot(sb, func(root *rootfs.Root) error {
							fe.Entry, _ = entry(root, path.Join(p, rel), s.opts.RootUID)
							return nil
						})
					}
					select {
					case events <- fe:
					case <-r.Context().Done():
						return
					}
				}
			}
		}
	}()
	tick := time.NewTicker(keepaliveOf(r.Header))
	defer tick.Stop()
	for {
		select {
		case fe := <-events:
			if err := st.send(&envdwire.WatchDirResponse{Filesystem: fe}); err != nil {
				return err
			}
		case <-tick.C:
			if err := st.send(&envdwire.WatchDirResponse{Keepalive: &struct{}{}}); err != nil {
				return err
			}
		case err := <-readErr:
			if errors.Is(err, os.ErrClosed) {
				return nil
			}
			return rpcErr(codeInternal, "watch: %v", err)
		case <-r.Context().Done():
			closeF()
			return nil
		}
	}
}

func eventTypes(m uint32) []string {
	var out []string
	if m&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0 {
		out = append(out, envdwire.EventCreate)
	}
	if m&unix.IN_MODIFY != 0 {
		out = append(out, envdwire.EventWrite)
	}
	if m&unix.IN_DELETE != 0 {
		out = append(out, envdwire.EventRemove)
	}
	if m&unix.IN_MOVED_FROM != 0 {
		out = append(out, envdwire.EventRename)
	}
	if m&unix.IN_ATTRIB != 0 {
		out = append(out, envdwire.EventChmod)
	}
	return out
}
