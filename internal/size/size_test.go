package size

import "testing"

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{
		"": 0, "0": 0, "4096": 4096, "1B": 1, "64K": 64 << 10, "64k": 64 << 10, "512M": 512 << 20, "512MiB": 512 << 20,
		"512MB": 512 << 20, "512Mi": 512 << 20, "2G": 2 << 30, "1T": 1 << 40, "8388607T": 8388607 << 40,
	} {
		if got, err := Parse(in); err != nil || got != want {
			t.Errorf("Parse(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"M", "B", "iB", "-1M", "1.5G", "12X", "1MM", "5i", "8388608T", "0x10"} {
		if got, err := Parse(in); err == nil {
			t.Errorf("Parse(%q) = %d, want an error", in, got)
		}
	}
}
