package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// runCost runs emberbox cost with args and returns what it printed.
func runCost(t *testing.T, args ...string) string {
	t.Helper()
	root := newRootCommand()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(append([]string{"cost"}, args...))
	if err := root.Execute(); err != nil {
		t.Fatalf("cost %v: %v\n%s", args, err, out.String())
	}
	return out.String()
}

// TestCostProductPage: with its defaults, cost reproduces the product
// page's figures for Runtime (Emberbox's default rates), E2B, Modal and
// Blaxel.
func TestCostProductPage(t *testing.T) {
	out := runCost(t)
	for _, row := range []struct{ name, total string }{
		{"Runtime", "$34.17"},
		{"E2B", "$165.60"},
		{"Modal", "$237.96"},
		{"Blaxel ", "$193.20"},
	} {
		found := false
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, row.name) && strings.Contains(line, row.total) {
				found = true
			}
		}
		if !found {
			t.Errorf("no %s row with %s in:\n%s", row.name, row.total, out)
		}
	}
}

func TestCostJSON(t *testing.T) {
	var rep costReport
	if err := json.Unmarshal([]byte(runCost(t, "--json", "--provider", "e2b", "--provider", "modal")), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.EmberboxMicros != 34_166_667 || len(rep.Providers) != 2 {
		t.Fatalf("report: %+v", rep)
	}
	e2b := rep.Providers[0]
	if e2b.ID != "e2b" || e2b.TotalMicros != 165_600_000 || e2b.Total != "$165.60" ||
		e2b.SavingMicros != 165_600_000-34_166_667 || e2b.SavingPercent != 79 || e2b.Source == "" {
		t.Errorf("e2b row: %+v", e2b)
	}
}

func TestCostRefuses(t *testing.T) {
	for _, args := range [][]string{
		{"--provider", "nowhere"},
		{"--runs", "-1"},
		{"--vcpu", "0"},
		{"--memory-gib", "0"},
		{"--busy-cpu-seconds", "181"}, // more than 2 vCPU × 90 s
	} {
		root := newRootCommand()
		root.SetOut(&bytes.Buffer{})
		root.SetErr(&bytes.Buffer{})
		root.SetArgs(append([]string{"cost"}, args...))
		if err := root.Execute(); err == nil {
			t.Errorf("cost %v accepted", args)
		}
	}
}

func TestDollars(t *testing.T) {
	for _, tc := range []struct {
		micros int64
		want   string
	}{
		{34_166_667, "$34.17"}, {0, "$0.00"}, {-1_110_000, "-$1.11"}, {1_234_567_890, "$1,234.57"}, {4_999, "$0.00"},
	} {
		if got := dollars(tc.micros); got != tc.want {
			t.Errorf("dollars(%d) = %q, want %q", tc.micros, got, tc.want)
		}
	}
}
