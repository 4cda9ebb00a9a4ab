package executor

import (
	"errors"
	"math"
	"slices"
	"testing"
)

func TestParseUser(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want User
		ok   bool
	}{
		{"0", User{0, 0}, true},
		{"1000", User{1000, 0}, true},
		{"1000:1001", User{1000, 1001}, true},
		{"4294967295:4294967295", User{math.MaxUint32, math.MaxUint32}, true},
		{"", User{}, false},
		{"root", User{}, false},
		{"1000:", User{}, false},
		{":1000", User{}, false},
		{"-1", User{}, false},
		{"4294967296", User{}, false},
		{"1:2:3", User{}, false},
	} {
		got, err := ParseUser(tc.in)
		if tc.ok != (err == nil) || got != tc.want {
			t.Errorf("ParseUser(%q) = %v, %v; want %v ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("ParseUser(%q): %v is not invalid argument", tc.in, err)
		}
		if err == nil {
			if back, err := ParseUser(got.String()); err != nil || back != got {
				t.Errorf("round trip of %v: %v %v", got, back, err)
			}
		}
	}
}

func TestSpecValidate(t *testing.T) {
	ok := Spec{Rootfs: "/r"}
	for _, tc := range []struct {
		name string
		mod  func(*Spec)
		ok   bool
	}{
		{"minimal", func(*Spec) {}, true},
		{"full", func(s *Spec) {
			s.Env = []string{"A=1", "B="}
			s.Workdir = "/w"
			s.Limits = Limits{MemoryBytes: MinMemoryBytes, Pids: MinPids, CPUs: 0.5}
			s.Mounts = []Mount{{Source: "/x", Destination: "/.esf/lower", ReadOnly: true}, {Source: "/y", Destination: "/data"}}
			s.Hostname = "box"
		}, true},
		{"relative rootfs", func(s *Spec) { s.Rootfs = "r" }, false},
		{"empty rootfs", func(s *Spec) { s.Rootfs = "" }, false},
		{"env without =", func(s *Spec) { s.Env = []string{"A"} }, false},
		{"env empty key", func(s *Spec) { s.Env = []string{"=1"} }, false},
		{"env NUL", func(s *Spec) { s.Env = []string{"A=\x00"} }, false},
		{"relative workdir", func(s *Spec) { s.Workdir = "w" }, false},
		{"negative pids", func(s *Spec) { s.Limits.Pids = -1 }, false},
		{"1M of memory", func(s *Spec) { s.Limits.MemoryBytes = 1 << 20 }, false},
		{"3 pids", func(s *Spec) { s.Limits.Pids = 3 }, false},
		{"CapAdd of a capability never dropped", func(s *Spec) { s.CapAdd = []string{"CAP_SYS_ADMIN"} }, false},
		{"CapAdd of a dropped one", func(s *Spec) { s.CapAdd = []string{"CAP_MKNOD"} }, true},
		{"tiny cpus", func(s *Spec) { s.Limits.CPUs = 0.001 }, false},
		{"NaN cpus", func(s *Spec) { s.Limits.CPUs = math.NaN() }, false},
		{"relative mount source", func(s *Spec) { s.Mounts = []Mount{{Source: "x", Destination: "/d"}} }, false},
		{"mount on /", func(s *Spec) { s.Mounts = []Mount{{Source: "/x", Destination: "/"}} }, false},
		{"mount on /proc", func(s *Spec) { s.Mounts = []Mount{{Source: "/x", Destination: "/proc/x"}} }, false},
		{"mount on /.esf", func(s *Spec) { s.Mounts = []Mount{{Source: "/x", Destination: "/.esf"}} }, false},
		{"mount on the init", func(s *Spec) { s.Mounts = []Mount{{Source: "/x", Destination: "/.esf/init/"}} }, false},
		{"mount under /dev", func(s *Spec) { s.Mounts = []Mount{{Source: "/x", Destination: "/dev/x"}} }, false},
		{"mount next to /dev", func(s *Spec) { s.Mounts = []Mount{{Source: "/x", Destination: "/devices"}} }, true},
		{"hostname with slash", func(s *Spec) { s.Hostname = "a/b" }, false},
	} {
		s := ok
		tc.mod(&s)
		err := s.Validate()
		if tc.ok != (err == nil) {
			t.Errorf("%s: Validate() = %v, want ok=%v", tc.name, err, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v is not invalid argument", tc.name, err)
		}
	}
}

func TestExecSpecValidate(t *testing.T) {
	for _, tc := range []struct {
		x  ExecSpec
		ok bool
	}{
		{ExecSpec{Args: []string{"true"}}, true},
		{ExecSpec{Args: []string{"sh", "-c", ""}, Env: []string{"A=1", "UNSET"}, Workdir: "/"}, true},
		{ExecSpec{}, false},
		{ExecSpec{Args: []string{""}}, false},
		{ExecSpec{Args: []string{"a\x00b"}}, false},
		{ExecSpec{Args: []string{"true"}, Workdir: "rel"}, false},
		{ExecSpec{Args: []string{"true"}, Env: []string{"=x"}}, false},
	} {
		if err := tc.x.Validate(); tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrInvalidArgument)) {
			t.Errorf("%+v: Validate() = %v, want ok=%v", tc.x, err, tc.ok)
		}
	}
}

func TestFootprint(t *testing.T) {
	fp := Footprint()
	if !slices.IsSorted(fp) || !slices.Contains(fp, "/.esf") || len(fp) != 5 {
		t.Fatalf("Footprint() = %v", fp)
	}
	s := Spec{Rootfs: "/r", Mounts: []Mount{{Source: "/x", Destination: "/data/"}, {Source: "/x", Destination: "/.esf/lower"}}}
	got := s.Footprint()
	want := []string{"/.esf", "/.esf/lower", "/data", "/dev", "/proc", "/run", "/sys"}
	if !slices.Equal(got, want) {
		t.Fatalf("Spec.Footprint() = %v, want %v", got, want)
	}
	// The caller's slice is not the package's.
	fp[0] = "x"
	if Footprint()[0] != "/.esf" {
		t.Fatal("Footprint shares its slice")
	}
}

func TestLimitsCPUQuota(t *testing.T) {
	for cpus, want := range map[float64]int64{0: 0, 1: 100000, 0.5: 50000, 1.5: 150000, 0.01: 1000, 2.000001: 200000} {
		if got := (Limits{CPUs: cpus}).CPUQuota(); got != want {
			t.Errorf("CPUQuota(%v) = %d, want %d", cpus, got, want)
		}
	}
}
