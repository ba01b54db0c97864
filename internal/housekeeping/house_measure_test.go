package housekeeping

import (
	"go/importer"
	"go/parser"
	"go/token"
	"slices"
	"testing"
)

// houseSample is a package of two files that the house measures are
// checked against: one per platform, as x_linux.go and x_other.go.
var houseSample = []string{`package sample

import (
	"io"
	rd "io"
)

type T struct{}

func (T) A()  {}
func (*T) B() {}

type G[K comparable] struct{}

func (g *G[K]) C() {}

type Local interface{ Close() error; Extra() }

// Wide embeds io.ReadCloser (Read, Close), a local interface (Close, Extra)
// and rd.Writer (Write): five methods with Own, Close counted once.
type Wide interface {
	io.ReadCloser
	Local
	rd.Writer
	Own()
}

type Number interface{ ~int | ~float64 }

func f(a, b bool, xs []int, ch chan int) int {
	if a && b || a {
		return 1
	}
	for _, x := range xs {
		switch x {
		case 1, 2:
		case 3:
		default:
		}
	}
	for {
		select {
		case <-ch:
		default:
		}
		break
	}
	go func() {
		if a {
		}
	}()
	return 0
}
`, `package sample

func (T) A() {}

func f(a, b bool, xs []int, ch chan int) int {
	return 0
}
`}

// TestHouseCounters checks the counters of TestHouseRules on
// houseSample: methods counted once per name, interfaces with what they
// embed, complexity as gocyclo counts it, lines from func to brace.
func TestHouseCounters(t *testing.T) {
	fset := token.NewFileSet()
	p := &goPackage{dir: "sample"}
	for i, src := range houseSample {
		f, err := parser.ParseFile(fset, []string{"x_linux.go", "x_other.go"}[i], src, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		p.files = append(p.files, f)
	}
	ifaces := &interfaces{mod: "example.com/m", pkgs: map[string]*goPackage{"sample": p},
		std: importer.ForCompiler(fset, "source", nil)}
	widths, err := ifaces.widths(p)
	if err != nil {
		t.Fatal(err)
	}
	got := slices.Concat(methodCounts(p), widths, funcMeasures(fset, p))
	slices.SortFunc(got, compareMeasures)
	want := []measure{
		// f: 1 + if + && + || + range + switch's two cases + for + select's
		// one case + the closure's if.
		{funcComplexity, "sample.G.C", 1},
		{funcComplexity, "sample.T.A", 1},
		{funcComplexity, "sample.T.B", 1},
		{funcComplexity, "sample.f", 10},
		{funcLines, "sample.G.C", 1},
		{funcLines, "sample.T.A", 1},
		{funcLines, "sample.T.B", 1},
		{funcLines, "sample.f", 24},
		{interfaceWidth, "sample.Local", 2},
		{interfaceWidth, "sample.Number", 0},
		{interfaceWidth, "sample.Wide", 5},
		{typeMethods, "sample.G", 1},
		{typeMethods, "sample.T", 2},
	}
	if !slices.Equal(got, want) {
		t.Errorf("measures of the sample:\n got %v\nwant %v", got, want)
	}
}
