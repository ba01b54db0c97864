package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// BenchmarkE2B: five sandboxes made and used through E2B's protocol as its
// SDKs do, each timed: the v2 create until it answers (running), the first
// code run (which starts the kernel), a second code run, and a unary envd
// RPC (Connect JSON). It reports figures and asserts nothing about time.
//
//	go test -run '^$' -bench BenchmarkE2B -benchtime 1x ./internal/integration/
func BenchmarkE2B(b *testing.B) {
	s := startServer(b, b.TempDir())
	hc := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 5 * time.Minute}
	do := func(method, path string, hdr map[string]string, body string) (int, []byte) {
		b.Helper()
		req, _ := http.NewRequest(method, s.URL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := hc.Do(req)
		if err != nil {
			b.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, out
	}
	const n = 5
	b.ResetTimer()
	for range b.N {
		var create, first, second, stat []float64
		for i := range n {
			t0 := time.Now()
			st, body := do("POST", "/v2/sandboxes", map[string]string{"X-API-KEY": s.AdminKey}, `{"templateID":"code-interpreter-v1","timeout":600}`)
			if st != 201 {
				b.Fatalf("create: %d %s", st, body)
			}
			create = append(create, ms(time.Since(t0)))
			var sb struct{ SandboxID, EnvdAccessToken string }
			_ = json.Unmarshal(body, &sb)
			sandboxHdr := func(port string) map[string]string {
				return map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": port, "X-Access-Token": sb.EnvdAccessToken}
			}
			run := func(code, want string) float64 {
				t := time.Now()
				st, body := do("POST", "/execute", sandboxHdr("49999"), `{"code":`+quote(code)+`}`)
				d := ms(time.Since(t))
				if st != 200 || !bytes.Contains(body, []byte(want)) {
					b.Fatalf("execute %q: %d %s", code, st, body)
				}
				sc := bufio.NewScanner(bytes.NewReader(body))
				for sc.Scan() {
					if bytes.Contains(sc.Bytes(), []byte(`"type":"error"`)) {
						b.Fatalf("execute %q: %s", code, sc.Bytes())
					}
				}
				return d
			}
			first = append(first, run("1+1", `"text":"2"`))
			second = append(second, run("2+2", `"text":"4"`))
			t1 := time.Now()
			st, body = do("POST", "/filesystem.Filesystem/Stat", sandboxHdr("49983"), `{"path":"/workspace"}`)
			if st != 200 || !bytes.Contains(body, []byte(`"name":"workspace"`)) {
				b.Fatalf("envd Stat: %d %s", st, body)
			}
			stat = append(stat, ms(time.Since(t1)))
			b.Logf("sandbox %d: create %.0f ms, first code %.0f ms, second %.0f ms, envd stat %.1f ms", i+1, create[i], first[i], second[i], stat[i])
			b.StopTimer()
			if st, body := do("DELETE", "/sandboxes/"+sb.SandboxID, map[string]string{"X-API-KEY": s.AdminKey}, ""); st != 204 {
				b.Fatalf("kill: %d %s", st, body)
			}
			b.StartTimer()
		}
		b.ReportMetric(percentile(create, 50), "create-p50-ms")
		b.ReportMetric(percentile(first, 50), "first-code-p50-ms")
		b.ReportMetric(percentile(second, 50), "code-p50-ms")
		b.ReportMetric(percentile(stat, 50), "envd-stat-p50-ms")
	}
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
