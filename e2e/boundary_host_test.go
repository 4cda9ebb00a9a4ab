package e2e

import (
	"archive/tar"
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
)

// The host side of issue 15: what a sandbox leaves in a sealed tree must
// give nothing to a user of the host, through an export or a mount view.
// The privileged files are planted directly in the imported tree (as a
// sandbox root could make them), so these tests need no runc.

const nobody = 65534

// privilegedTree writes a tree an attacker would like the host to run:
//
//	bin/id-suid  a copy of id(1), root-owned, setuid and setgid
//	bin/cat-cap  a copy of cat(1) with file capability CAP_DAC_READ_SEARCH
//	dev/null0    a world-writable character device (1:3, like /dev/null)
//	dev/loop0    a world-writable block device (7:0)
//	plain        an ordinary file, which must come through untouched
func privilegedTree(t *testing.T) string {
	t.Helper()
	src := filepath.Join(hostDir(t), "src")
	for _, d := range []string{src, filepath.Join(src, "bin"), filepath.Join(src, "dev")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(t, "/usr/bin/id", filepath.Join(src, "bin/id-suid"))
	if err := os.Chown(filepath.Join(src, "bin/id-suid"), 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Chmod(filepath.Join(src, "bin/id-suid"), 0o6755); err != nil { // os.Chmod would drop the bits
		t.Fatal(err)
	}
	copyFile(t, "/usr/bin/cat", filepath.Join(src, "bin/cat-cap"))
	if err := unix.Setxattr(filepath.Join(src, "bin/cat-cap"), "security.capability", capDacReadSearch(), 0); err != nil {
		t.Fatalf("set file capability: %v", err)
	}
	for name, dev := range map[string]uint32{"null0": unix.S_IFCHR | 0o666, "loop0": unix.S_IFBLK | 0o666} {
		major := uint32(1)
		minor := uint32(3)
		if name == "loop0" {
			major, minor = 7, 0
		}
		p := filepath.Join(src, "dev", name)
		if err := unix.Mknod(p, dev, int(unix.Mkdev(major, minor))); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, 0o666); err != nil { // past the umask
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(src, "plain"), "plain\n")
	return src
}

// hostDir is a fresh directory other users can traverse (t.TempDir is
// 0700), removed after the test.
func hostDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "esf-boundary-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// capDacReadSearch is a VFS_CAP_REVISION_2 security.capability value with
// CAP_DAC_READ_SEARCH permitted and effective.
func capDacReadSearch() []byte {
	b := make([]byte, 20)
	binary.LittleEndian.PutUint32(b[0:], 0x02000001) // revision 2, effective
	binary.LittleEndian.PutUint32(b[4:], 1<<unix.CAP_DAC_READ_SEARCH)
	return b
}

// asNobody runs a program as the unprivileged host user nobody and returns
// its combined output.
func asNobody(name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// privilegeUsable reports, as nobody, what of the planted tree at dir
// still works: the setuid binary runs with euid 0, the capability binary
// runs with a capability, the device opens for writing.
func privilegeUsable(t *testing.T, dir string) (setuid, fcap, device bool) {
	t.Helper()
	out, err := asNobody(filepath.Join(dir, "bin/id-suid"))
	if err != nil {
		t.Fatalf("run %s/bin/id-suid as nobody: %v\n%s", dir, err, out)
	}
	setuid = strings.Contains(out, "euid=0")
	out, err = asNobody(filepath.Join(dir, "bin/cat-cap"), "/proc/self/status")
	if err != nil {
		t.Fatalf("run %s/bin/cat-cap as nobody: %v\n%s", dir, err, out)
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "CapEff:"); ok && strings.Trim(strings.TrimSpace(v), "0") != "" {
			fcap = true
		}
	}
	_, err = asNobody("/bin/sh", "-c", ": > "+filepath.Join(dir, "dev/null0"))
	device = err == nil
	return setuid, fcap, device
}

// TestBoundary_ExportDropsPrivileged: an export to a directory, a tar file
// or stdout leaves setuid/setgid bits, file capabilities and device nodes
// out by default and says so; a host user gains nothing from what it
// wrote. --preserve-privileged writes them as stored.
func TestBoundary_ExportDropsPrivileged(t *testing.T) {
	src := privilegedTree(t)
	// The attack works on the source: without the fix an export that
	// copies it faithfully hands out root.
	if s, c, d := privilegeUsable(t, src); !s || !c || !d {
		t.Fatalf("the planted tree does not work on the host filesystem (setuid %v, capability %v, device %v): the test proves nothing", s, c, d)
	}
	d := startDaemon(t)
	root := strings.TrimSpace(d.mustCtl(nil, "import", src).stdout)
	wantPaths := []any{"bin/cat-cap", "bin/id-suid", "dev/loop0", "dev/null0"}

	// To a directory.
	dest := filepath.Join(hostDir(t), "out")
	r := d.mustCtl(nil, "export", root, "--to", dest)
	if !strings.Contains(r.stderr, "dropped 1 setuid/setgid bits, 1 security.* xattrs, 2 device nodes") ||
		!strings.Contains(r.stderr, "bin/id-suid") || !strings.Contains(r.stderr, "--preserve-privileged") {
		t.Errorf("export to a directory does not say what it dropped: stdout %q stderr %q", r.stdout, r.stderr)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dest, "bin/id-suid"), &st); err != nil || st.Mode&0o7777 != 0o755 || st.Uid != 0 {
		t.Errorf("exported bin/id-suid: mode %o uid %d (%v), want 0755 root-owned", st.Mode&0o7777, st.Uid, err)
	}
	if _, err := unix.Getxattr(filepath.Join(dest, "bin/cat-cap"), "security.capability", nil); !errors.Is(err, unix.ENODATA) {
		t.Errorf("exported bin/cat-cap kept its capability (%v)", err)
	}
	for _, dev := range []string{"dev/null0", "dev/loop0"} {
		if _, err := os.Lstat(filepath.Join(dest, dev)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s exported: %v", dev, err)
		}
	}
	if got := readFile(t, filepath.Join(dest, "plain")); got != "plain\n" {
		t.Errorf("plain: %q", got)
	}
	if s, c, _ := privilegeUsable(t, dest); s || c {
		t.Errorf("as nobody, the export gives setuid root %v, a capability %v", s, c)
	}
	// -o json carries the same report.
	var res struct {
		Dropped map[string]any `json:"dropped"`
	}
	decode(t, d.mustCtl(nil, "-o", "json", "export", root, "--to", filepath.Join(hostDir(t), "json")), &res)
	if res.Dropped["setid"] != 1.0 || res.Dropped["xattrs"] != 1.0 || res.Dropped["devices"] != 2.0 ||
		jsonNumber(res.Dropped["paths"]) != jsonNumber(wantPaths) {
		t.Errorf("export -o json: dropped %v", res.Dropped)
	}

	// To a tar file, and to stdout.
	tarFile := filepath.Join(hostDir(t), "out.tar")
	decode(t, d.mustCtl(nil, "-o", "json", "export", root, "--to", tarFile), &res)
	if res.Dropped["devices"] != 2.0 || jsonNumber(res.Dropped["paths"]) != jsonNumber(wantPaths) {
		t.Errorf("export to a tar file -o json: dropped %v", res.Dropped)
	}
	b, err := os.ReadFile(tarFile)
	if err != nil {
		t.Fatal(err)
	}
	checkTarUnprivileged(t, b, false)
	r = d.mustCtl(nil, "export", root, "--to", "-")
	if !strings.Contains(r.stderr, "2 device nodes") {
		t.Errorf("export --to - does not say what it dropped on stderr: %q", r.stderr)
	}
	checkTarUnprivileged(t, []byte(r.stdout), false)

	// --preserve-privileged: everything as stored, nothing reported.
	kept := filepath.Join(hostDir(t), "kept")
	r = d.mustCtl(nil, "export", root, "--to", kept, "--preserve-privileged")
	if strings.Contains(r.stderr, "dropped") {
		t.Errorf("--preserve-privileged reports drops: %q", r.stderr)
	}
	if s, c, dv := privilegeUsable(t, kept); !s || !c || !dv {
		t.Errorf("--preserve-privileged lost something: setuid %v, capability %v, device %v", s, c, dv)
	}
	r = d.mustCtl(nil, "export", root, "--to", "-", "--preserve-privileged")
	checkTarUnprivileged(t, []byte(r.stdout), true)
}

// checkTarUnprivileged reads a tar and checks that it has no setuid/setgid
// file, no security.* xattr and no device, or, with want, all of them.
func checkTarUnprivileged(t *testing.T, b []byte, want bool) {
	t.Helper()
	var setid, caps, devs int
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag != tar.TypeDir && h.Mode&0o6000 != 0 {
			setid++
		}
		for k := range h.PAXRecords {
			if strings.HasPrefix(k, "SCHILY.xattr.security.") {
				caps++
			}
		}
		if h.Typeflag == tar.TypeChar || h.Typeflag == tar.TypeBlock {
			devs++
		}
	}
	if want && (setid != 1 || caps != 1 || devs != 2) || !want && setid+caps+devs != 0 {
		t.Errorf("tar holds %d setuid/setgid files, %d security xattrs, %d devices (privileged kept: %v)", setid, caps, devs, want)
	}
}

// TestBoundary_MountViewsNosuidNodev: the projection and every mount view
// (read-only, and --rw overlays) are nosuid,nodev, so an unprivileged host
// user gets no root from a planted setuid-root binary, no capability from
// a file capability and cannot open a device node through them.
func TestBoundary_MountViewsNosuidNodev(t *testing.T) {
	requireFUSE(t)
	src := privilegedTree(t)
	d := startDaemon(t)
	g := createGroup(t, d, src)
	base := hostDir(t)
	ro, rw := filepath.Join(base, "ro"), filepath.Join(base, "rw")
	for _, dir := range []string{ro, rw} {
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	d.mustCtl(nil, "mount", g.Node.NodeID, ro)
	t.Cleanup(func() { d.ctl(nil, "umount", ro) })
	d.mustCtl(nil, "mount", "--rw", g.Node.NodeID, rw)
	t.Cleanup(func() { d.ctl(nil, "umount", rw) })

	projection := filepath.Join(d.state, "mnt")
	for _, view := range []string{projection, ro, rw} {
		opts := mountOptions(t, view)
		if !opts["nosuid"] || !opts["nodev"] {
			t.Errorf("%s is mounted without nosuid,nodev: %v", view, opts)
		}
	}
	for _, view := range []string{ro, rw} {
		if got := readFile(t, filepath.Join(view, "plain")); got != "plain\n" {
			t.Fatalf("%s/plain: %q", view, got)
		}
		if s, c, dv := privilegeUsable(t, view); s || c || dv {
			t.Errorf("as nobody through %s: setuid root %v, capability %v, device opened %v", view, s, c, dv)
		}
	}
	// Not even root opens a device through a view.
	for _, view := range []string{ro, rw} {
		if f, err := os.OpenFile(filepath.Join(view, "dev/null0"), os.O_WRONLY, 0); err == nil {
			f.Close()
			t.Errorf("root opened %s/dev/null0", view)
		}
	}
}

// mountOptions returns the per-mount options of the mount at dir (the
// last one mounted there), from /proc/self/mountinfo.
func mountOptions(t *testing.T, dir string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var opts map[string]bool
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || unescapeMountPath(f[4]) != dir {
			continue
		}
		opts = map[string]bool{}
		for _, o := range strings.Split(f[5], ",") {
			opts[o] = true
		}
	}
	if opts == nil {
		t.Fatalf("nothing mounted at %s", dir)
	}
	return opts
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var c byte
			ok := true
			for _, d := range s[i+1 : i+4] {
				if d < '0' || d > '7' {
					ok = false
				}
				c = c*8 + byte(d-'0')
			}
			if ok {
				b.WriteByte(c)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// TestBoundary_StateDirPrivate: a state dir created 0755 (with a readable
// file already in it) is made private at start, so an unprivileged user
// reads nothing of it: no journal, no store object, no key, not even a
// listing. And esfctl umount refuses the daemon's own mounts.
func TestBoundary_StateDirPrivate(t *testing.T) {
	requireFUSE(t)
	state := filepath.Join(hostDir(t), "state")
	if err := os.MkdirAll(filepath.Join(state, "journal"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{state, filepath.Join(state, "journal")} {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	planted := filepath.Join(state, "journal", "planted")
	if err := os.WriteFile(planted, []byte("secret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := asNobody("/bin/cat", planted); err != nil {
		t.Fatalf("control: nobody cannot read the planted file before the daemon starts: %v %s", err, out)
	}
	src := filepath.Join(hostDir(t), "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(src, "secret.txt"), "content only the daemon may read\n")
	d := startDaemonWith(t, state)
	g := createGroup(t, d, src)
	a := activate(t, d, g.Node.NodeID)
	writeFile(t, filepath.Join(a.Root, "more.txt"), "attempt data\n")
	suspend(t, d, a.AttemptID)

	var st unix.Stat_t
	if err := unix.Stat(state, &st); err != nil || st.Mode&0o7777 != 0o700 {
		t.Errorf("state dir mode %o (%v), want 0700", st.Mode&0o7777, err)
	}
	if err := unix.Stat(planted, &st); err != nil || st.Mode&0o077 != 0 {
		t.Errorf("pre-existing file mode %o (%v), want no group or other bits", st.Mode&0o7777, err)
	}
	// Every regular file and directory of the state, as nobody: nothing
	// opens, and the state dir does not list.
	if out, err := asNobody("/bin/ls", state); err == nil {
		t.Errorf("nobody lists the state dir:\n%s", out)
	}
	var files []string
	filepath.WalkDir(state, func(p string, e os.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if e.IsDir() && p != state && mounted(p) {
			return filepath.SkipDir // a view, not state
		}
		if e.Type().IsRegular() {
			files = append(files, p)
		}
		return nil
	})
	if len(files) < 5 {
		t.Fatalf("only %d files in the state dir: %v", len(files), files)
	}
	for _, p := range files {
		if out, err := asNobody("/bin/cat", p); err == nil {
			t.Errorf("nobody read %s: %q", p, out)
		}
	}

	// umount refuses the projection and attempt roots with a stable code,
	// through a symlink too, and leaves them mounted.
	link := filepath.Join(hostDir(t), "link")
	if err := os.Symlink(filepath.Join(state, "mnt"), link); err != nil {
		t.Fatal(err)
	}
	b := activate(t, d, g.Node.NodeID)
	for _, dir := range []string{filepath.Join(state, "mnt"), link, b.Root} {
		r := d.ctl(nil, "-o", "json", "umount", dir)
		if r.code != 2 {
			t.Errorf("umount %s: exit %d, want 2: %s", dir, r.code, r.stderr)
		}
		jsonErr(t, r, "invalid_argument")
	}
	if !mounted(filepath.Join(state, "mnt")) || !mounted(b.Root) {
		t.Errorf("umount of esf's own mounts unmounted them")
	}
}

// TestBoundary_FlippedByteAfterFirstReadIsEIO: a blob read once (and
// verified) through the projection, then damaged in the store, is never
// served again: the next read through a read-only view, through the
// attempt that read it first and through a new attempt is EIO, and the
// daemon logs a cas.corrupt event naming the blob and counts it.
func TestBoundary_FlippedByteAfterFirstReadIsEIO(t *testing.T) {
	requireFUSE(t)
	content := "verified once, then damaged: " + strings.Repeat("x", 5000) + "\n"
	src := filepath.Join(hostDir(t), "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(src, "data.txt"), content)
	d := startDaemon(t)
	g := createGroup(t, d, src)
	ro := filepath.Join(hostDir(t), "ro")
	if err := os.Mkdir(ro, 0o755); err != nil {
		t.Fatal(err)
	}
	d.mustCtl(nil, "mount", g.Node.NodeID, ro)
	t.Cleanup(func() { d.ctl(nil, "umount", ro) })
	old := activate(t, d, g.Node.NodeID)
	for _, dir := range []string{ro, old.Root} {
		if got := readFile(t, filepath.Join(dir, "data.txt")); got != content {
			t.Fatalf("first read through %s: %d bytes", dir, len(got))
		}
	}

	blob := cas.Sum([]byte(content))
	obj := objectFile(t, d, blob)
	f, err := os.OpenFile(obj, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("X"), 100); err != nil {
		t.Fatal(err)
	}
	f.Close()

	fresh := activate(t, d, g.Node.NodeID)
	for _, dir := range []string{ro, old.Root, fresh.Root} {
		b, err := os.ReadFile(filepath.Join(dir, "data.txt"))
		if !errors.Is(err, syscall.EIO) {
			t.Errorf("read through %s after the damage: %d bytes, err %v; want EIO", dir, len(b), err)
		}
	}

	// The event, once the daemon has read what the projection recorded.
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := d.mustCtl(nil, "events", "--type", "cas.corrupt")
		if strings.Contains(r.stdout, `"blob_id":"`+blob.String()+`"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no cas.corrupt event for %s after 30s:\n%s", blob, r.stdout)
		}
		time.Sleep(100 * time.Millisecond)
	}
	stats, err := os.ReadFile(filepath.Join(d.state, "mnt", ".stats"))
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		CorruptBlobs int64 `json:"corrupt_blobs"`
	}
	if err := json.Unmarshal(stats, &s); err != nil || s.CorruptBlobs < 1 {
		t.Errorf("projection stats %s: corrupt_blobs %d (%v)", stats, s.CorruptBlobs, err)
	}
}
