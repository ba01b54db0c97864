package housekeeping

import (
	"go/ast"
	"go/build/constraint"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestPackageDocs checks that every directory of Go files in the module and
// the modules nested in it (sdk/go), testdata and test-only packages
// included, has exactly one package doc comment, in a file that is not a
// test unless the package has only tests, and that it starts "Package
// <name> ", or "Command <directory> " for a command.
func TestPackageDocs(t *testing.T) {
	root, _ := moduleRoot(t)
	dirs := map[string][]string{} // directory → its .go files
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			// The go command ignores these. A nested module (sdk/go) is the
			// repository's and held to the same rule.
			if path != root && (strings.HasPrefix(d.Name(), ".") || strings.HasPrefix(d.Name(), "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(d.Name(), ".go") {
			dir := filepath.Dir(path)
			dirs[dir] = append(dirs[dir], path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) == 0 {
		t.Fatal("no Go files found")
	}
	for _, dir := range slices.Sorted(maps.Keys(dirs)) {
		rel, _ := filepath.Rel(root, dir)
		if err := checkPackageDoc(dir, dirs[dir]); err != "" {
			t.Errorf("%s: %s", filepath.ToSlash(rel), err)
		}
	}
}

// checkPackageDoc checks the files of one directory and describes what is
// wrong, or returns "".
func checkPackageDoc(dir string, files []string) string {
	fset := token.NewFileSet()
	var docs []string // base names of the files with a doc comment
	var name, doc string
	hasNonTest := false
	for _, path := range files {
		f, err := parser.ParseFile(fset, path, nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			return err.Error()
		}
		if ignored(f) {
			continue
		}
		isTest := strings.HasSuffix(path, "_test.go")
		hasNonTest = hasNonTest || !isTest
		if f.Doc == nil {
			continue
		}
		docs = append(docs, filepath.Base(path))
		if isTest {
			docs[len(docs)-1] += " (a test)"
		}
		name, doc = f.Name.Name, f.Doc.Text()
	}
	slices.Sort(docs)
	switch {
	case len(docs) == 0:
		return "no package doc comment"
	case len(docs) > 1:
		return "package doc comments in " + strings.Join(docs, ", ") + "; keep one"
	case hasNonTest && strings.HasSuffix(docs[0], " (a test)"):
		return "the package doc comment is in " + docs[0] + "; move it to a file the package is built from"
	}
	want := "Package " + name + " "
	if name == "main" {
		want = "Command " + filepath.Base(dir) + " "
	}
	if first, _, _ := strings.Cut(doc, "\n"); !strings.HasPrefix(first+" ", want) {
		return "the package doc comment in " + docs[0] + " should start " + strings.TrimSpace(want) + ", not " + first
	}
	return ""
}

// ignored reports whether f has the constraint "//go:build ignore": a file
// that is no part of its directory's package.
func ignored(f *ast.File) bool {
	for _, g := range f.Comments {
		if g.Pos() > f.Package {
			break
		}
		for _, c := range g.List {
			if constraint.IsGoBuild(c.Text) {
				if x, err := constraint.Parse(c.Text); err == nil && x.String() == "ignore" {
					return true
				}
			}
		}
	}
	return false
}
