package e2e

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestReadmeStaysInTheRepo: the README is short (under 200 lines) and
// every link in it and in the docs it points to (every docs/*.md) names a file of the
// repository that exists: nothing outside it (no ../, no URL), nothing
// stale.
func TestReadmeStaysInTheRepo(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n >= 200 {
		t.Errorf("README.md has %d lines, want under 200 (details go to docs/ or bench/README.md)", n)
	}
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil || len(docs) == 0 {
		t.Fatalf("no docs/*.md found (%v)", err)
	}
	for i, d := range docs {
		docs[i], _ = filepath.Rel(root, d)
	}
	for _, doc := range append([]string{"README.md", "bench/README.md", "clients/python/README.md"}, docs...) {
		b, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(b), -1) {
			target, _, _ := strings.Cut(m[1], "#")
			if target == "" {
				continue
			}
			if strings.Contains(target, "://") {
				t.Errorf("%s links outside the repository: %s", doc, m[1])
				continue
			}
			p := filepath.Join(root, filepath.Dir(doc), target)
			if rel, err := filepath.Rel(root, p); err != nil || strings.HasPrefix(rel, "..") {
				t.Errorf("%s links outside the repository: %s", doc, m[1])
				continue
			}
			if _, err := os.Stat(p); err != nil {
				t.Errorf("%s links to %s, which does not exist", doc, m[1])
			}
		}
	}
}

// TestFRTestsNameRequirementsOfTheDesign: every TestFRxx in the repository
// names a requirement that docs/design.md lists as a row "| FR-xx |", so a
// test never cites a requirement the repository does not state.
func TestFRTestsNameRequirementsOfTheDesign(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	design, err := os.ReadFile(filepath.Join(root, "docs", "design.md"))
	if err != nil {
		t.Fatal(err)
	}
	fr := regexp.MustCompile(`(?m)^func (TestFR(\d+)\w*)\(`)
	seen := 0
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range fr.FindAllStringSubmatch(string(b), -1) {
			seen++
			if !strings.Contains(string(design), "| FR-"+m[2]+" |") {
				rel, _ := filepath.Rel(root, p)
				t.Errorf("%s: %s cites FR-%s, which docs/design.md does not list", rel, m[1], m[2])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen < 10 {
		t.Fatalf("found %d TestFRxx functions; the walk missed them", seen)
	}
}
