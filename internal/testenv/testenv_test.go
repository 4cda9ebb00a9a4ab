package testenv

import (
	"errors"
	"testing"
)

func TestRequired(t *testing.T) {
	for _, tc := range []struct {
		env, name string
		want      bool
	}{
		{"", "root", false},
		{"all", "root", true},
		{"fuse, root", "root", true},
		{"fuse", "root", false},
		{"cmd:git", "cmd:git", true},
	} {
		t.Setenv(RequireEnv, tc.env)
		if got := Required(tc.name); got != tc.want {
			t.Errorf("%s=%q: Required(%q) = %v, want %v", RequireEnv, tc.env, tc.name, got, tc.want)
		}
	}
}

func TestCheckNamesWhatIsMissing(t *testing.T) {
	t.Setenv(RequireEnv, "cmd:esf-no-such-program-here")
	err := Check("cmd:esf-no-such-program-here", "cmd:sh")
	var m *MissingError
	if !errors.As(err, &m) {
		t.Fatalf("Check = %v, want a *MissingError", err)
	}
	if len(m.Reasons) != 1 || !m.Required {
		t.Fatalf("Check = %+v, want one required reason", m)
	}
	t.Setenv(RequireEnv, "")
	if err := Check("cmd:esf-no-such-program-here"); !errors.As(err, &m) || m.Required {
		t.Fatalf("without %s: Check = %v, want a missing, optional capability", RequireEnv, err)
	}
}

// fatalRecorder is a testing.TB whose Fatalf records instead of stopping.
type fatalRecorder struct {
	testing.TB
	fatal string
}

func (r *fatalRecorder) Fatalf(format string, args ...any) { r.fatal = format }

func TestHasFailsOnlyWhenRequired(t *testing.T) {
	const missing = "cmd:esf-no-such-program-here"
	t.Setenv(RequireEnv, "")
	r := &fatalRecorder{TB: t}
	if Has(r, missing) || r.fatal != "" {
		t.Fatalf("optional and missing: Has = true or failed (%q)", r.fatal)
	}
	if !Has(r, "cmd:sh") || r.fatal != "" {
		t.Fatalf("present: Has = false or failed (%q)", r.fatal)
	}
	t.Setenv(RequireEnv, missing)
	if Has(r, missing); r.fatal == "" {
		t.Fatalf("%s=%s: Has did not fail the test", RequireEnv, missing)
	}
}
