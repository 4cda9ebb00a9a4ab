package runc

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"

	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/executor"
)

const (
	footprintFile = "footprint.json"
	// annotationWorkdir keeps the execs' default workdir in the bundle.
	// The init itself runs in "/": runc would create a missing cwd of the
	// init inside the rootfs, one more footprint.
	annotationWorkdir = "dev.esf.workdir"
	// annotationRootfs keeps the caller's rootfs when runc is given
	// another path to it (bindRootfs).
	annotationRootfs = "dev.esf.rootfs"
	defaultHostname  = "esf"
)

// containerSpec is containerd's default spec (namespaces with a fresh
// network namespace, default capabilities, masked and read-only paths,
// devices) plus the rootfs, the init, limits, no-new-privileges and the
// default seccomp profile.
func (e *Executor) containerSpec(ctx context.Context, id string, s executor.Spec) (*specs.Spec, error) {
	ctx = namespaces.WithNamespace(ctx, e.opts.Namespace)
	hostname := s.Hostname
	if hostname == "" {
		hostname = defaultHostname
	}
	workdir := s.Workdir
	if workdir == "" {
		workdir = "/"
	}
	mounts := []specs.Mount{{
		Destination: executor.InitPath,
		Type:        "bind",
		Source:      e.opts.Init,
		Options:     []string{"rbind", "ro", "nosuid", "nodev"},
	}}
	for _, m := range s.Mounts {
		mode := "rw"
		if m.ReadOnly {
			mode = "ro"
		}
		mounts = append(mounts, specs.Mount{
			Destination: path.Clean(m.Destination),
			Type:        "bind",
			Source:      m.Source,
			Options:     []string{"rbind", mode, "nosuid", "nodev"},
		})
	}
	opts := []oci.SpecOpts{
		oci.WithRootFSPath(s.Rootfs),
		oci.WithProcessArgs(executor.InitPath),
		oci.WithProcessCwd("/"),
		oci.WithDefaultPathEnv,
		oci.WithEnv(s.Env),
		oci.WithUIDGID(s.User.UID, s.User.GID),
		oci.WithHostname(hostname),
		oci.WithMounts(mounts),
		oci.WithDefaultUnixDevices,
		oci.WithNoNewPrivileges,
		oci.WithAnnotations(map[string]string{annotationWorkdir: workdir}),
	}
	var drop []string
	for _, c := range executor.DroppedCapabilities() {
		if !slices.Contains(s.CapAdd, c) {
			drop = append(drop, c)
		}
	}
	opts = append(opts, oci.WithDroppedCapabilities(drop))
	if r := e.opts.UserNS; r.Count > 0 {
		for _, id := range []uint32{s.User.UID, s.User.GID} {
			if _, err := r.host(id); err != nil {
				return nil, fmt.Errorf("user %s: %w", s.User, err)
			}
		}
		m := []specs.LinuxIDMapping{{ContainerID: 0, HostID: r.Start, Size: r.Count}}
		opts = append(opts, oci.WithUserNamespace(m, m))
	}
	if l := s.Limits; l.MemoryBytes > 0 {
		opts = append(opts, oci.WithMemoryLimit(uint64(l.MemoryBytes)))
	}
	if l := s.Limits; l.Pids > 0 {
		opts = append(opts, oci.WithPidsLimit(l.Pids))
	}
	if l := s.Limits; l.CPUs > 0 {
		opts = append(opts, oci.WithCPUCFS(l.CPUQuota(), uint64(executor.CPUPeriod.Microseconds())))
	}
	// The profile depends on the capabilities, so it comes last.
	opts = append(opts, seccomp.WithDefaultProfile())
	spec, err := oci.GenerateSpec(ctx, nil, &containers.Container{ID: id}, opts...)
	if err != nil {
		return nil, err
	}
	// The init must never be the OOM killer's choice: its death ends the
	// container, and with it the attempt. It holds a few MiB, the
	// sandbox's processes hold the rest and stay killable (processSpec).
	// Lowering a score takes CAP_SYS_RESOURCE, which runc lacks when the
	// daemon does (some sandboxed CI hosts); runc would then fail the
	// start, so the init keeps the default there.
	if canLowerOOMScore() {
		adj := initOOMScoreAdj
		spec.Process.OOMScoreAdj = &adj
	}
	return spec, nil
}

// initOOMScoreAdj exempts the init from the OOM killer.
const initOOMScoreAdj = -1000

// canLowerOOMScore reports whether this process holds CAP_SYS_RESOURCE.
var canLowerOOMScore = sync.OnceValue(func() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[unix.CAP_SYS_RESOURCE/32].Effective&(1<<(unix.CAP_SYS_RESOURCE%32)) != 0
})

// processSpec derives an exec's process from the container's spec, so that
// capabilities, rlimits and no-new-privileges carry over; runc exec takes
// the seccomp filter from the container itself.
func (e *Executor) processSpec(ctx context.Context, id string, cs *specs.Spec, x executor.ExecSpec) (specs.Process, error) {
	if cs.Process == nil {
		return specs.Process{}, errors.New("container spec has no process")
	}
	workdir := x.Workdir
	if workdir == "" {
		workdir = cs.Annotations[annotationWorkdir]
	}
	if workdir == "" {
		workdir = "/"
	}
	env := x.Env
	if x.TTY && !hasEnv(cs.Process.Env, "TERM") && !hasEnv(x.Env, "TERM") {
		env = append([]string{"TERM=xterm"}, env...)
	}
	opts := []oci.SpecOpts{
		oci.WithProcessArgs(x.Args...),
		oci.WithProcessCwd(workdir),
		oci.WithEnv(env),
	}
	if x.User != nil {
		opts = append(opts, oci.WithUIDGID(x.User.UID, x.User.GID))
	}
	if x.TTY && x.Size.Rows > 0 && x.Size.Cols > 0 {
		opts = append(opts, oci.WithTTYSize(int(x.Size.Cols), int(x.Size.Rows)))
	}
	ctx = namespaces.WithNamespace(ctx, e.opts.Namespace)
	if err := oci.ApplyOpts(ctx, nil, &containers.Container{ID: id}, cs, opts...); err != nil {
		return specs.Process{}, err
	}
	// oci.WithTTY would add a second TERM after one the caller set.
	cs.Process.Terminal = x.TTY
	// The init's OOM exemption is not the exec's: a runc that applies it
	// to execs would make the sandbox unkillable.
	cs.Process.OOMScoreAdj = nil
	return *cs.Process, nil
}

func hasEnv(env []string, key string) bool {
	return slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, key+"=") })
}

// footprintEntry is a path runc is about to create in a rootfs: Leaf is a
// mountpoint, Top the first component of it the rootfs lacked (Top == Leaf
// or an ancestor of it).
type footprintEntry struct {
	Top  string `json:"top"`
	Leaf string `json:"leaf"`
}

// mountLeaves are the mountpoints runc needs inside the rootfs itself: the
// destinations of a spec's mounts that do not lie inside an earlier mount
// (/dev/pts lies in the /dev tmpfs, not in the rootfs).
func mountLeaves(ms []specs.Mount) []string {
	var leaves []string
	for i, m := range ms {
		d := path.Clean(m.Destination)
		inside := false
		for _, o := range ms[:i] {
			od := path.Clean(o.Destination)
			if strings.HasPrefix(d, od+"/") {
				inside = true
				break
			}
		}
		if !inside && d != "/" {
			leaves = append(leaves, d)
		}
	}
	return leaves
}

func components(p string) []string {
	return strings.Split(strings.TrimPrefix(path.Clean(p), "/"), "/")
}

// absentFootprint finds, for each leaf, the first component the rootfs
// lacks. It never follows a symlink: a leaf under a symlink is resolved by
// runc inside the container's root, and what is made there is not ours to
// remove later.
func absentFootprint(rootfs string, leaves []string) ([]footprintEntry, error) {
	root, err := unix.Open(rootfs, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("rootfs %s: %w", rootfs, err)
	}
	defer unix.Close(root)
	var out []footprintEntry
	for _, leaf := range leaves {
		comps := components(leaf)
		i, err := firstAbsent(root, comps)
		if err != nil {
			return nil, fmt.Errorf("rootfs %s: %s: %w", rootfs, leaf, err)
		}
		if i >= 0 {
			out = append(out, footprintEntry{Top: "/" + strings.Join(comps[:i+1], "/"), Leaf: leaf})
		}
	}
	return out, nil
}

// firstAbsent is the index of the first missing component, -1 when all
// exist or a symlink or non-directory stands in the way.
func firstAbsent(root int, comps []string) (int, error) {
	dir := root
	defer func() {
		if dir != root {
			unix.Close(dir)
		}
	}()
	for i, c := range comps {
		var st unix.Stat_t
		err := unix.Fstatat(dir, c, &st, unix.AT_SYMLINK_NOFOLLOW)
		if errors.Is(err, unix.ENOENT) {
			return i, nil
		}
		if err != nil {
			return -1, err
		}
		if i == len(comps)-1 || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return -1, nil
		}
		next, err := unix.Openat(dir, c, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, err
		}
		if dir != root {
			unix.Close(dir)
		}
		dir = next
	}
	return -1, nil
}

// removeCreated removes a footprint entry bottom-up: the leaf if it is an
// empty directory or an empty regular file (a file bind's mountpoint), then
// each parent up to Top while it is an empty directory. Whatever the
// sandbox put there stays. It walks with O_NOFOLLOW, so it never leaves the
// rootfs.
func removeCreated(rootfs string, e footprintEntry) error {
	comps := components(e.Leaf)
	top := len(components(e.Top)) - 1
	if top < 0 || top >= len(comps) || !strings.HasPrefix(e.Leaf+"/", e.Top+"/") {
		return fmt.Errorf("bad footprint entry %+v", e)
	}
	dirs := make([]int, 0, len(comps))
	defer func() {
		for _, d := range dirs {
			unix.Close(d)
		}
	}()
	root, err := unix.Open(rootfs, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil // the rootfs is gone (unmounted after a crash): nothing to clean
	}
	dirs = append(dirs, root)
	for _, c := range comps[:len(comps)-1] {
		d, err := unix.Openat(dirs[len(dirs)-1], c, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil
		}
		dirs = append(dirs, d)
	}
	for i := len(comps) - 1; i >= top; i-- {
		parent, name := dirs[i], comps[i]
		var st unix.Stat_t
		err := unix.Fstatat(parent, name, &st, unix.AT_SYMLINK_NOFOLLOW)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return err
		}
		switch {
		case st.Mode&unix.S_IFMT == unix.S_IFDIR:
			err = unix.Unlinkat(parent, name, unix.AT_REMOVEDIR)
			if errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) {
				return nil
			}
		case st.Mode&unix.S_IFMT == unix.S_IFREG && st.Size == 0 && i == len(comps)-1:
			err = unix.Unlinkat(parent, name, 0)
		default:
			return nil
		}
		if err != nil {
			return err
		}
	}
	return nil
}
