package agent

import (
	"strings"
	"testing"

	"github.com/emberbox/emberbox/internal/egress"
)

func TestWithCABlock(t *testing.T) {
	const roots = "ROOT-A\nROOT-B\n"
	one := withCABlock(roots, "", "CA-1\n")
	if one != roots+caBlockBegin+"CA-1\n"+caBlockEnd {
		t.Fatalf("first install:\n%s", one)
	}
	// A rotation: the block is replaced, not appended to.
	two := withCABlock(one, "CA-1\n", "CA-1\nCA-2\n")
	if two != roots+caBlockBegin+"CA-1\nCA-2\n"+caBlockEnd {
		t.Fatalf("during a rotation:\n%s", two)
	}
	// The old CA retired: it leaves the bundle.
	three := withCABlock(two, "CA-1\nCA-2\n", "CA-2\n")
	if strings.Contains(three, "CA-1") || !strings.HasSuffix(three, caBlockBegin+"CA-2\n"+caBlockEnd) {
		t.Fatalf("after retiring CA-1:\n%s", three)
	}
	if got := withCABlock(three, "CA-2\n", ""); got != roots {
		t.Fatalf("with none: %q, want the roots alone", got)
	}
	// A bundle an agent without markers appended to: its CAs are taken
	// out once, the roots kept.
	legacy := "ROOT-A\nCA-0\nROOT-B\n"
	if got := withCABlock(legacy, "CA-0\n", "CA-1\n"); got != roots+caBlockBegin+"CA-1\n"+caBlockEnd {
		t.Fatalf("from an unmarked bundle:\n%s", got)
	}
	// No trailing newline on the roots.
	if got := withCABlock("ROOT", "", "CA\n"); got != "ROOT\n"+caBlockBegin+"CA\n"+caBlockEnd {
		t.Fatalf("roots without a final newline:\n%s", got)
	}
}

func TestCheckCertBundle(t *testing.T) {
	for _, bad := range []string{
		"not pem",
		"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
		"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
	} {
		if checkCertBundle(bad) == nil {
			t.Errorf("checkCertBundle(%q) accepted it", bad)
		}
	}
	a, errA := egress.NewCA()
	b, errB := egress.NewCA()
	if errA != nil || errB != nil {
		t.Fatal(errA, errB)
	}
	for _, good := range []string{"", a.CertPEM(), a.CertPEM() + "\n" + b.CertPEM()} {
		if err := checkCertBundle(good); err != nil {
			t.Errorf("checkCertBundle of %d bytes: %v", len(good), err)
		}
	}
}
