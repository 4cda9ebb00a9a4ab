package testenv

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

// RequireEnv is the environment variable that turns skips into failures.
const RequireEnv = "ESF_TEST_REQUIRE"

// BusyboxPath is where Debian's busybox-static installs its binary.
const BusyboxPath = "/bin/busybox"

// checks maps a capability name to the check that says why it is missing.
var checks = map[string]func() error{
	"root":    checkRoot,
	"fuse":    checkFUSE,
	"overlay": checkOverlay,
	"runc":    checkRunc,
	"busybox": checkBusybox,
	"etcd":    checkEtcd,
	"s3":      checkVersityGW,
}

var (
	mu    sync.Mutex
	cache = map[string]error{}
)

// Missing says why capability name is not available here, or nil. Names
// are those of checks, or "cmd:NAME" for a program on PATH. An unknown
// name is a programming error and panics.
func Missing(name string) error {
	mu.Lock()
	defer mu.Unlock()
	if err, ok := cache[name]; ok {
		return err
	}
	var err error
	if prog, ok := strings.CutPrefix(name, "cmd:"); ok {
		if _, lerr := exec.LookPath(prog); lerr != nil {
			err = fmt.Errorf("needs %s on PATH", prog)
		}
	} else {
		check, ok := checks[name]
		if !ok {
			panic("testenv: unknown capability " + name)
		}
		err = check()
	}
	cache[name] = err
	return err
}

// Required reports whether ESF_TEST_REQUIRE makes name mandatory.
func Required(name string) bool {
	for _, v := range strings.Split(os.Getenv(RequireEnv), ",") {
		v = strings.TrimSpace(v)
		if v == "all" || v == name {
			return true
		}
	}
	return false
}

// Require skips t unless every named capability is here, or fails it
// when ESF_TEST_REQUIRE makes a missing one mandatory.
func Require(t testing.TB, names ...string) {
	t.Helper()
	if err := Check(names...); err != nil {
		var m *MissingError
		if errors.As(err, &m) && m.Required {
			t.Fatalf("%v (%s=%s makes it mandatory)", err, RequireEnv, os.Getenv(RequireEnv))
		}
		t.Skip(err)
	}
}

// Has reports whether every named capability is here, for a test that
// checks more where it can (device nodes and ownership as root) rather
// than skipping. A missing capability that ESF_TEST_REQUIRE makes
// mandatory fails t: in CI the extra checks never drop out silently.
func Has(t testing.TB, names ...string) bool {
	t.Helper()
	err := Check(names...)
	var m *MissingError
	if errors.As(err, &m) && m.Required {
		t.Fatalf("%v (%s=%s makes it mandatory)", err, RequireEnv, os.Getenv(RequireEnv))
	}
	return err == nil
}

// MissingError names the capabilities a test lacks.
type MissingError struct {
	Reasons  []string
	Required bool // at least one missing capability is mandatory
}

func (e *MissingError) Error() string { return strings.Join(e.Reasons, "; ") }

// Check is Require for a TestMain or a fixture: nil when every named
// capability is here, else a *MissingError. A TestMain that gets a
// Required error should fail the run rather than skip its tests.
func Check(names ...string) error {
	var m MissingError
	for _, n := range names {
		if err := Missing(n); err != nil {
			m.Reasons = append(m.Reasons, err.Error())
			m.Required = m.Required || Required(n)
		}
	}
	if len(m.Reasons) == 0 {
		return nil
	}
	return &m
}

func checkRoot() error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (mounts, chown, device nodes, containers)")
	}
	return nil
}

func checkFUSE() error {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return errors.New("needs /dev/fuse")
	}
	if _, err := exec.LookPath("fusermount3"); err != nil {
		return errors.New("needs fusermount3 (apt-get install fuse3)")
	}
	return nil
}

func checkOverlay() error {
	b, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		return fmt.Errorf("read /proc/filesystems: %v", err)
	}
	if !bytes.Contains(b, []byte("\toverlay\n")) {
		// The module may load on first mount; modprobe is the honest test.
		if exec.Command("modprobe", "overlay").Run() != nil {
			return errors.New("needs overlayfs in the kernel")
		}
	}
	return nil
}

func checkRunc() error {
	if _, err := exec.LookPath("runc"); err != nil {
		return errors.New("needs runc (apt-get install runc)")
	}
	return nil
}

func checkBusybox() error {
	if _, err := os.Stat(BusyboxPath); err != nil {
		return errors.New("needs busybox-static (apt-get install busybox-static)")
	}
	out, err := exec.Command("file", "-L", BusyboxPath).Output()
	if err == nil && !bytes.Contains(out, []byte("statically linked")) {
		return fmt.Errorf("%s is not static (apt-get install busybox-static)", BusyboxPath)
	}
	return nil
}

// EtcdEnv names the etcd server binary the tests start (scripts/etcd.sh
// builds the pinned one; make test sets it).
const EtcdEnv = "ESF_ETCD"

// EtcdBinary is the etcd server binary the tests start, or why there is
// none.
func EtcdBinary() (string, error) {
	if err := Missing("etcd"); err != nil {
		return "", err
	}
	return os.Getenv(EtcdEnv), nil
}

// checkEtcd wants $ESF_ETCD to be an etcd server of a maintained release
// (3.6 or 3.7): Debian's etcd 3.4 is past its end of life.
func checkEtcd() error {
	bin := os.Getenv(EtcdEnv)
	if bin == "" {
		return fmt.Errorf("needs %s=$(scripts/etcd.sh) (make test sets it)", EtcdEnv)
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return fmt.Errorf("%s=%s: %v", EtcdEnv, bin, err)
	}
	if !bytes.Contains(out, []byte("etcd Version: 3.6.")) && !bytes.Contains(out, []byte("etcd Version: 3.7.")) {
		return fmt.Errorf("%s=%s is not etcd 3.6 or 3.7: %s", EtcdEnv, bin, bytes.TrimSpace(out))
	}
	return nil
}

// VersityGWEnv names the versitygw binary (an S3 server) the tests start
// (scripts/versitygw.sh installs the pinned one; make test sets it).
const VersityGWEnv = "ESF_VERSITYGW"

// VersityGWBinary is the versitygw binary the tests start, or why there is
// none.
func VersityGWBinary() (string, error) {
	if err := Missing("s3"); err != nil {
		return "", err
	}
	return os.Getenv(VersityGWEnv), nil
}

// checkVersityGW wants $ESF_VERSITYGW to be a versitygw that runs (a
// `go install` build reports no release in --version: the pin is
// scripts/versitygw.sh's).
func checkVersityGW() error {
	bin := os.Getenv(VersityGWEnv)
	if bin == "" {
		return fmt.Errorf("needs %s=$(scripts/versitygw.sh) (make test sets it)", VersityGWEnv)
	}
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s=%s: %v: %s", VersityGWEnv, bin, err, bytes.TrimSpace(out))
	}
	if !bytes.Contains(out, []byte("Version")) {
		return fmt.Errorf("%s=%s is not versitygw: %s", VersityGWEnv, bin, bytes.TrimSpace(out))
	}
	return nil
}
