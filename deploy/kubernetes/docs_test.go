package kubernetes

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
)

// TestDocsCommandLine keeps the node's command line in docs/cluster.md
// equal to the one the rendered DaemonSet runs.
func TestDocsCommandLine(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "cluster.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(doc), "Every node runs:\n\n```\n")
	block, _, ok2 := strings.Cut(after, "```")
	if !ok || !ok2 {
		t.Fatal(`docs/cluster.md has no code block after "Every node runs:"`)
	}
	ds, err := only[*appsv1.DaemonSet](readManifest(t, filepath.Join("manifests", "emberbox.yaml")))
	if err != nil {
		t.Fatal(err)
	}
	c := ds.Spec.Template.Spec.Containers[0]
	want := append(slices.Clone(c.Command), c.Args...)
	if got := strings.Fields(block); !slices.Equal(got, want) {
		t.Errorf("docs/cluster.md says a node runs\n  %s\nthe DaemonSet runs\n  %s", strings.Join(got, " "), strings.Join(want, " "))
	}
}
