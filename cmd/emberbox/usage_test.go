package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestUsageCommand(t *testing.T) {
	var asked string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer k1" {
			w.WriteHeader(http.StatusUnauthorized)
			w.Write([]byte(`{"error":{"code":"unauthorized","message":"no key"}}`))
			return
		}
		asked = r.URL.RawQuery
		w.Write([]byte(`{"from":"2026-12-01T00:00:00.000Z","to":"2026-12-02T00:00:00.000Z","groupBy":"day",
			"totals":{"runningSeconds":"90","activeCpuSeconds":"15.5","guestCpuSeconds":"15","memoryGiBSeconds":"360","egressBytes":2048,"chargedMicros":"858"},
			"groups":[{"key":"2026-12-01","runningSeconds":"90","activeCpuSeconds":"15.5","guestCpuSeconds":"15","memoryGiBSeconds":"360","egressBytes":2048,"chargedMicros":"858"}]}`))
	}))
	defer srv.Close()
	run := func(args ...string) (string, error) {
		root := newRootCommand()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetArgs(append([]string{"usage", "--server", srv.URL}, args...))
		err := root.Execute()
		return out.String(), err
	}
	out, err := run("--key", "k1", "--by", "day", "--from", "2026-12-01")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(asked, "groupBy=day") || !strings.Contains(asked, "from=2026-12-01T00%3A00%3A00Z") {
		t.Errorf("query %q", asked)
	}
	for _, want := range []string{"2026-12-01", "1m30s", "15.50", "0.100", "2.0 KiB", "$0.000858", "TOTAL"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if out, err := run("--key", "k1", "--json"); err != nil || !strings.Contains(out, `"groupBy":"day"`) {
		t.Errorf("--json: %v %s", err, out)
	}
	if _, err := run("--key", "wrong", "--data-dir", t.TempDir()); err == nil || !strings.Contains(err.Error(), "unauthorized") {
		t.Errorf("wrong key: %v", err)
	}
	if _, err := run("--key", "k1", "--from", "yesterday"); err == nil {
		t.Error("a bad --from was accepted")
	}
}
