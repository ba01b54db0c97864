package sandbox_test

import (
	"os"
	"strings"
	"testing"

	"github.com/emberbox/emberbox/internal/sandbox"
)

// TestStateTableInDocs keeps the state table in docs/ARCHITECTURE.md equal
// to the code's. To update it, replace the lines between the state-table
// markers with the output of sandbox.StateTableMarkdown (the failure
// message prints it).
func TestStateTableInDocs(t *testing.T) {
	doc, err := os.ReadFile("../../docs/ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- state-table:begin", "<!-- state-table:end -->"
	text := string(doc)
	i, j := strings.Index(text, begin), strings.Index(text, end)
	if i < 0 || j < i {
		t.Fatalf("docs/ARCHITECTURE.md has no %q … %q block", begin, end)
	}
	got := text[i:j]
	got = got[strings.Index(got, "\n")+1:]
	if want := sandbox.StateTableMarkdown(); got != want {
		t.Errorf("the state table in docs/ARCHITECTURE.md differs from the code; it should read:\n%s", want)
	}
}

// TestStateTable checks the table's own rules: every state once, exactly
// one state serves guest calls, terminal states refuse.
func TestStateTable(t *testing.T) {
	seen := map[sandbox.State]bool{}
	serving := 0
	for _, st := range sandbox.States() {
		if seen[st.State] {
			t.Errorf("state %s listed twice", st.State)
		}
		seen[st.State] = true
		if st.Refusal == nil {
			serving++
		} else if st.Refusal.Code == "" || st.Refusal.Class == nil {
			t.Errorf("state %s refuses without a code or class", st.State)
		}
		if st.Terminal && st.Refusal == nil {
			t.Errorf("terminal state %s serves guest calls", st.State)
		}
		if err := sandbox.Refusal(&sandbox.Sandbox{ID: "x", State: st.State}); (err == nil) != (st.Refusal == nil) {
			t.Errorf("Refusal(%s) = %v, table says %+v", st.State, err, st.Refusal)
		}
	}
	if serving != 1 || !seen[sandbox.StateRunning] {
		t.Errorf("%d states serve guest calls, want only running", serving)
	}
}
