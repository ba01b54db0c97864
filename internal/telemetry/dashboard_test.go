package telemetry

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
)

// dashboard is the part of a Grafana dashboard the test reads.
type dashboard struct {
	Templating struct {
		List []struct {
			Name, Type, Query string
		}
	}
	Panels []struct {
		Title   string
		Type    string
		Targets []struct {
			Expr string
		}
	}
}

var metricNameRE = regexp.MustCompile(`emberbox_[a-z_]+`)

// TestDashboard checks that every query of the Grafana dashboard names
// only metrics this package exports, so that a renamed metric cannot leave
// a panel silently empty.
func TestDashboard(t *testing.T) {
	raw, err := os.ReadFile("../../deploy/grafana/emberbox.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("decode dashboard: %v", err)
	}

	hasDatasource := false
	for _, v := range d.Templating.List {
		hasDatasource = hasDatasource || (v.Name == "datasource" && v.Type == "datasource" && v.Query == "prometheus")
	}
	if !hasDatasource {
		t.Error(`no Prometheus datasource variable named "datasource"`)
	}

	m := New()
	touchAll(m)
	families, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, f := range families {
		exported[f.GetName()] = true
	}

	if len(d.Panels) == 0 {
		t.Fatal("dashboard has no panels")
	}
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no target", p.Title)
		}
		for _, tg := range p.Targets {
			names := metricNameRE.FindAllString(tg.Expr, -1)
			if len(names) == 0 {
				t.Errorf("panel %q: query %q names no emberbox metric", p.Title, tg.Expr)
			}
			for _, name := range names {
				if !exported[name] {
					// A histogram's series are named after it with a suffix.
					for _, suffix := range []string{"_bucket", "_sum", "_count"} {
						if base, ok := strings.CutSuffix(name, suffix); ok && exported[base] {
							name = base
							break
						}
					}
				}
				if !exported[name] {
					t.Errorf("panel %q: %s is not exported", p.Title, name)
				}
			}
		}
	}
}
