package envd

import "testing"

func TestVersionAtLeast(t *testing.T) {
	for _, tc := range []struct {
		v, min string
		want   bool
	}{
		{"0.6.13", "0.5.2", true},
		{"0.5.2", "0.5.2", true},
		{"0.5.1", "0.5.2", false},
		{"0.10.0", "0.5.2", true},
		{"1.0", "0.5.2", true},
		{"v0.3.0-rc1", "0.3.0", true},
		{"0.2.9", "0.3.0", false},
		{"", "0.5.2", true},
		{"garbage", "0.5.2", true},
	} {
		if got := VersionAtLeast(tc.v, tc.min); got != tc.want {
			t.Errorf("VersionAtLeast(%q, %q) = %v", tc.v, tc.min, got)
		}
	}
}
