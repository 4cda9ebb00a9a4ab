package failpoint

import (
	"errors"
	"os"
	"os/exec"
	"slices"
	"syscall"
	"testing"

	"github.com/esf-dev/esf/errdefs"
)

func TestSetAndInject(t *testing.T) {
	t.Cleanup(func() { _ = Set("") })
	if err := Inject("fp.none"); err != nil {
		t.Fatalf("disarmed failpoint: %v", err)
	}
	if err := Set("fp.a=error; fp.b=error@3 ,fp.c=off"); err != nil {
		t.Fatal(err)
	}
	if err := Inject("fp.a"); !errors.Is(err, ErrInjected) || !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("fp.a: %v, want ErrInjected (an ErrUnavailable)", err)
	}
	var got []bool
	for range 5 {
		got = append(got, Inject("fp.b") != nil)
	}
	if want := []bool{false, false, true, true, true}; !slices.Equal(got, want) {
		t.Errorf("fp.b=error@3 fired %v, want %v", got, want)
	}
	if err := Inject("fp.c"); err != nil {
		t.Errorf("off: %v", err)
	}
	// Set replaces the whole armed set.
	if err := Set("fp.c=error"); err != nil {
		t.Fatal(err)
	}
	if Inject("fp.a") != nil || Inject("fp.c") == nil {
		t.Error("Set did not replace the armed set")
	}
	if err := Set(""); err != nil || Inject("fp.c") != nil {
		t.Errorf("empty spec did not disarm: %v", err)
	}
}

func TestSetRejectsMalformedSpecs(t *testing.T) {
	t.Cleanup(func() { _ = Set("") })
	for _, spec := range []string{"noequals", "=crash", "a=explode", "a=error@0", "a=error@x", "a=crash@-1"} {
		if err := Set(spec); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Set(%q) = %v, want ErrInvalidArgument", spec, err)
		}
	}
}

func TestEnable(t *testing.T) {
	errBoom := errors.New("boom")
	calls := 0
	disable := Enable("fp.enable", func() error { calls++; return errBoom })
	if err := Inject("fp.enable"); !errors.Is(err, errBoom) {
		t.Errorf("enabled: %v", err)
	}
	disable()
	if err := Inject("fp.enable"); err != nil || calls != 1 {
		t.Errorf("after disable: %v, %d calls", err, calls)
	}
}

func TestDeclareNames(t *testing.T) {
	name := Declare("fp.declared.z")
	Declare("fp.declared.a")
	names := Names()
	if name != "fp.declared.z" || !slices.Contains(names, "fp.declared.a") || !slices.IsSorted(names) {
		t.Errorf("Names() = %v", names)
	}
}

const helperEnv = "ESF_FAILPOINT_HELPER"

// TestHelper runs in a child process (see TestCrashKillsProcess and
// TestMalformedEnv); the parent reads its fate.
func TestHelper(t *testing.T) {
	switch os.Getenv(helperEnv) {
	case "":
		t.Skip("helper process")
	case "crash":
		_ = Inject("fp.helper")
		t.Fatal("crash failpoint returned")
	case "malformed":
		if err := Inject("fp.anything"); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("malformed ESF_FAILPOINTS: Inject = %v, want the parse error", err)
		}
	}
}

func runHelper(t *testing.T, mode, spec string) ([]byte, error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelper$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, EnvVar+"="+spec)
	return cmd.CombinedOutput()
}

func TestCrashKillsProcess(t *testing.T) {
	out, err := runHelper(t, "crash", "fp.helper=crash")
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("helper survived: %v\n%s", err, out)
	}
	ws, ok := exit.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("helper ended with %v, want SIGKILL\n%s", err, out)
	}
}

func TestMalformedEnv(t *testing.T) {
	if out, err := runHelper(t, "malformed", "fp.x=explode"); err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
}
