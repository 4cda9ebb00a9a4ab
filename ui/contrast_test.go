package ui

import (
	"math"
	"regexp"
	"strconv"
	"testing"
)

// TestContrast holds the view's colours to WCAG 2 contrast ratios: text
// at least 4.5:1 on what it is drawn on (AA), body text 7:1 (AAA), and the
// tree's node fills 3:1 against the canvas (non-text AA), except pruned
// nodes, which are dimmed on purpose and carry their status in the panel.
func TestContrast(t *testing.T) {
	b, err := assets.ReadFile("assets/app.css")
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{}
	for _, m := range regexp.MustCompile(`--([a-z]+):\s*(#[0-9a-fA-F]{6})`).FindAllStringSubmatch(string(b), -1) {
		vars[m[1]] = m[2]
	}
	const white = "#ffffff"
	for _, c := range []struct {
		what   string
		fg, bg string
		min    float64
	}{
		{"body text", vars["fg"], vars["bg"], 7},
		{"muted text", vars["muted"], vars["bg"], 4.5},
		{"links", vars["accent"], vars["bg"], 4.5},
		{"draft label", white, vars["draft"], 4.5},
		{"sealed label", white, vars["sealed"], 4.5},
		{"terminal label", white, vars["terminal"], 4.5},
		{"pruned label", white, "#6b7280", 4.5},
		{"header", white, "#1a202c", 7},
		{"draft node", vars["draft"], vars["bg"], 3},
		{"sealed node", vars["sealed"], vars["bg"], 3},
		{"terminal node", vars["terminal"], vars["bg"], 3},
		{"canonical ring", vars["canonical"], vars["bg"], 3},
		{"selection ring", vars["sel"], vars["bg"], 3},
	} {
		if c.fg == "" || c.bg == "" {
			t.Errorf("%s: colour missing from app.css (%q on %q)", c.what, c.fg, c.bg)
			continue
		}
		if r := contrast(c.fg, c.bg); r < c.min {
			t.Errorf("%s: %s on %s is %.2f:1, want at least %.1f:1", c.what, c.fg, c.bg, r, c.min)
		}
	}
}

func contrast(a, b string) float64 {
	la, lb := luminance(a), luminance(b)
	return (math.Max(la, lb) + 0.05) / (math.Min(la, lb) + 0.05)
}

func luminance(hex string) float64 {
	ch := func(i int) float64 {
		v, _ := strconv.ParseUint(hex[i:i+2], 16, 8)
		c := float64(v) / 255
		if c <= 0.03928 {
			return c / 12.92
		}
		return math.Pow((c+0.055)/1.055, 2.4)
	}
	return 0.2126*ch(1) + 0.7152*ch(3) + 0.0722*ch(5)
}
