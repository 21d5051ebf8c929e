package main

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestReadmeProgramIsThisOne: the README's first ```go block is this
// package's main.go from its package clause on. This test's binary compiles
// main.go, so a README program that would not compile (or that drifted from
// what compiles) fails here.
func TestReadmeProgramIsThisOne(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(readme), "\n```go\n")
	if !ok {
		t.Fatal("README.md has no ```go block")
	}
	block, _, ok = strings.Cut(block, "\n```\n")
	if !ok {
		t.Fatal("README.md's first ```go block is not closed")
	}
	i := strings.Index(string(src), "\npackage main\n")
	if i < 0 {
		t.Fatal("main.go has no package clause on a line of its own")
	}
	prog := strings.TrimSuffix(string(src[i+1:]), "\n")
	if block != prog {
		t.Errorf("README.md's first ```go block differs from examples/embed/main.go (from `package main` on): make them the same\n%s",
			firstDiff(block, prog))
	}
}

// firstDiff names the first line where a (the README) and b (main.go) differ.
func firstDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range max(len(al), len(bl)) {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y {
			return fmt.Sprintf("line %d of the program:\n  README:  %s\n  main.go: %s", i+1, x, y)
		}
	}
	return ""
}
