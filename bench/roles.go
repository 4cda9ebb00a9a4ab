package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas/local"
	s3store "github.com/esf-dev/esf/cas/s3"
	"github.com/esf-dev/esf/cas/tier"
	"github.com/esf-dev/esf/fusefs"
)

// RoleArg, as the first argument, makes the benchmark binary a helper
// process instead (see RunRole): FUSE servers must not run in the process
// that reads their mounts, and esfd runs its projection as a child too.
const RoleArg = "esf-bench-role"

const (
	roleFuseServer = "fuse-server" // STATE_DIR [PROFILE] [--cas-remote=URL]: the projection of STATE_DIR/cas at STATE_DIR/mnt
	roleLoopback   = "loopback"    // SRC MNT [PROFILE]: go-fuse's stock loopback of SRC at MNT
)

// RunRole runs the helper role args[0] with the rest as its arguments and
// returns the process exit code. Each role writes "ready\n" to fd 3 once
// its mount answers and serves until it is unmounted or gets SIGTERM.
func RunRole(args []string) int {
	if len(args) < 1 {
		fmt.Fprintln(os.Stderr, "bench role: missing role")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var err error
	switch args[0] {
	case roleFuseServer:
		err = serveProjection(ctx, args[1:])
	case roleLoopback:
		err = serveLoopback(ctx, args[1:])
	default:
		err = fmt.Errorf("unknown role %q", args[0])
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench role %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

// withProfile runs fn under a CPU profile written to path (if not empty).
func withProfile(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := pprof.StartCPUProfile(f); err != nil {
		return err
	}
	defer pprof.StopCPUProfile()
	return fn()
}

// serveProjection is what `esfd fuse-server` does: the projection of the
// state dir's store, in a process of its own.
func serveProjection(ctx context.Context, args []string) error {
	if len(args) < 1 {
		return errors.New("usage: fuse-server STATE_DIR [PROFILE]")
	}
	// --cas-remote=URL (anywhere): fetch misses from that S3 store, as
	// `esfd fuse-server --cas-remote` does (credentials from the AWS
	// environment variables).
	remote := ""
	args = slices.DeleteFunc(slices.Clone(args), func(a string) bool {
		if v, ok := strings.CutPrefix(a, "--cas-remote="); ok {
			remote = v
			return true
		}
		return false
	})
	state := args[0]
	profile := ""
	if len(args) > 1 {
		profile = args[1]
	}
	// A reader of the daemon's store: it must not remove the daemon's temp
	// files, however old.
	st, err := local.Open(filepath.Join(state, "cas"), &local.Options{StaleTempAge: -1})
	if err != nil {
		return err
	}
	var store fusefs.PathStore = st
	if remote != "" {
		u, err := s3store.ParseURL(remote)
		if err != nil {
			return err
		}
		c, err := s3store.NewClient(ctx, u)
		if err != nil {
			return err
		}
		rs, err := s3store.New(s3store.Options{Client: c, Bucket: u.Bucket, Prefix: u.Prefix})
		if err != nil {
			return err
		}
		if store, err = tier.New(tier.Options{Local: st, Remote: rs}); err != nil {
			return err
		}
	}
	fsys, err := fusefs.New(fusefs.Options{Store: store})
	if err != nil {
		return err
	}
	return withProfile(profile, func() error {
		return fusefs.Serve(ctx, filepath.Join(state, "mnt"), fsys, os.NewFile(3, "ready"))
	})
}

// serveLoopback mounts go-fuse's loopback file system with the options of
// its example/loopback program (1 s entry and attribute timeouts, like
// libfuse's defaults): the stock FUSE baseline.
func serveLoopback(ctx context.Context, args []string) error {
	if len(args) < 2 {
		return errors.New("usage: loopback SRC MNT [PROFILE]")
	}
	src, mnt := args[0], args[1]
	profile := ""
	if len(args) > 2 {
		profile = args[2]
	}
	root, err := fs.NewLoopbackRoot(src)
	if err != nil {
		return err
	}
	sec := time.Second
	return withProfile(profile, func() error {
		srv, err := fs.Mount(mnt, root, &fs.Options{
			AttrTimeout:     &sec,
			EntryTimeout:    &sec,
			NullPermissions: true,
			MountOptions: fuse.MountOptions{
				FsName:      src,
				Name:        "loopback",
				DirectMount: true, // as root; no fusermount needed
			},
		})
		if err != nil {
			return err
		}
		if _, err := io.WriteString(os.NewFile(3, "ready"), "ready\n"); err != nil {
			srv.Unmount()
			return err
		}
		done := make(chan struct{})
		go func() { srv.Wait(); close(done) }()
		select {
		case <-done:
			return nil
		case <-ctx.Done():
		}
		for {
			if err := srv.Unmount(); err == nil {
				<-done
				return nil
			}
			select {
			case <-done:
				return nil
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
}

// startRole starts a helper role as a child and waits until it is ready.
// The returned stop unmounts mnt (which ends the role) and waits for the
// child; it kills it if it does not exit.
func (e *Env) startRole(ctx context.Context, mnt string, args ...string) (stop func() error, err error) {
	if len(e.cfg.SelfCommand) == 0 {
		return nil, fmt.Errorf("no SelfCommand to run the %s role: %w", args[0], errSkip)
	}
	argv := append(slices.Clone(e.cfg.SelfCommand), args...)
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.ExtraFiles = []*os.File{w}
	cmd.Stderr = os.Stderr
	cmd.Dir = "/"
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, err
	}
	w.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(r).ReadString('\n')
		line <- s
	}()
	select {
	case s := <-line:
		if s != "ready\n" {
			return nil, fmt.Errorf("%s role exited before it was ready: %v", args[0], <-exited)
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-exited
		return nil, fmt.Errorf("%s role not ready after 30s", args[0])
	case <-ctx.Done():
		cmd.Process.Kill()
		<-exited
		return nil, ctx.Err()
	}
	return func() error {
		uerr := unix.Unmount(mnt, 0)
		if uerr != nil && !errors.Is(uerr, unix.EINVAL) {
			cmd.Process.Signal(syscall.SIGTERM)
		}
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-exited
			unix.Unmount(mnt, unix.MNT_DETACH)
			return fmt.Errorf("%s role at %s did not exit; killed", args[0], mnt)
		}
		if uerr != nil && !errors.Is(uerr, unix.EINVAL) {
			return fmt.Errorf("unmount %s: %w", mnt, uerr)
		}
		return nil
	}, nil
}

// errSkip marks a measurement this machine cannot make (no root, no
// helper binary); scenarios turn it into a skip row.
var errSkip = errors.New("skipped")
