package api

import (
	"bufio"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// specOperations reads the operations (method and path) of
// docs/openapi.yaml: the path keys under paths: and the method keys under
// each. A line scan is enough for the file's fixed layout, and keeps a
// YAML library out of the module.
func specOperations(t *testing.T) [][2]string {
	t.Helper()
	f, err := os.Open("../docs/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pathRE := regexp.MustCompile(`^  (/\S*):\s*$`)
	methodRE := regexp.MustCompile(`^    (get|put|post|delete|patch|head|options):\s*$`)
	var ops [][2]string
	var inPaths bool
	var path string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "paths:":
			inPaths = true
		case inPaths && line != "" && !strings.HasPrefix(line, " "):
			inPaths = false
		case !inPaths:
		case pathRE.MatchString(line):
			path = pathRE.FindStringSubmatch(line)[1]
		case methodRE.MatchString(line) && path != "":
			ops = append(ops, [2]string{strings.ToUpper(methodRE.FindStringSubmatch(line)[1]), path})
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(ops) == 0 {
		t.Fatal("no operations found in docs/openapi.yaml")
	}
	return ops
}

// TestOpenAPIMatchesRoutes holds docs/openapi.yaml and the server's mux
// to each other: every documented operation reaches a registered route
// (not the catch-all not_found), and every registered route is documented.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	s := NewServer(nil, ServerOptions{})
	documented := map[string]bool{}
	param := regexp.MustCompile(`\{[^}]+\}`)
	for _, op := range specOperations(t) {
		// A concrete path for the template: each {param} becomes a value.
		path := param.ReplaceAllString(op[1], "p1")
		_, pattern := s.mux.Handler(httptest.NewRequest(op[0], path, nil))
		if pattern == "" || pattern == "/" {
			t.Errorf("docs/openapi.yaml documents %s %s, which no route serves", op[0], op[1])
			continue
		}
		documented[pattern] = true
	}
	for _, p := range s.patterns {
		if p == "/" {
			continue
		}
		if !documented[p] {
			t.Errorf("route %q is not in docs/openapi.yaml", p)
		}
	}
	if !slices.Contains(s.patterns, "POST /v1/exec") {
		t.Fatalf("registered patterns %v: the test reads the wrong list", s.patterns)
	}
}
