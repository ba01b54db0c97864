package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// BenchmarkEgressSecrets: HTTPS download speed from one guest through the
// egress gate, to a host an egress secret names (TLS terminated at the
// gate, the request swapped and sent on over a second TLS connection)
// and to a host none names (piped as before), alternating, 64 MiB each
// time. Reports both medians and their ratio.
func BenchmarkEgressSecrets(b *testing.B) {
	ca := newNetTestCA(b, "api.secrets.test", "other.secrets.test")
	port := startEchoHost(b, ca.leaf)
	caFile := filepath.Join(b.TempDir(), "test-ca.pem")
	bundle, _ := os.ReadFile("/etc/ssl/certs/ca-certificates.crt")
	if err := os.WriteFile(caFile, append(append(bundle, '\n'), ca.caPEM...), 0o644); err != nil {
		b.Fatal(err)
	}
	s := startServerArgs(b, b.TempDir(), []string{"--egress-open", "127.0.0.1/32",
		"--egress-resolve", "api.secrets.test=127.0.0.1", "--egress-resolve", "other.secrets.test=127.0.0.1",
		"--egress-upstream-ca-file", caFile, "--extra-ca-file", caFile})
	c := s.client(s.AdminKey)
	call[map[string]any](b, c, "PUT", "/v1/egress-secrets/API_TOKEN",
		map[string]any{"value": secretValue, "hosts": []string{"api.secrets.test"}}, nil)
	sb := c.createRunning(b, map[string]any{"vcpu": 2, "memoryMiB": 2048})
	defer c.delete(b, sb.ID)
	speed := func(host string) float64 {
		out := c.sh(b, sb.ID, fmt.Sprintf(`curl -sS -o /dev/null --max-time 300 -H "Authorization: Bearer $API_TOKEN" -w '%%{speed_download}' https://%s:%d/big`, host, port))
		v, err := strconv.ParseFloat(strings.TrimSpace(out), 64)
		if err != nil {
			b.Fatalf("curl to %s: %q", host, out)
		}
		return v / (1 << 20)
	}
	speed("api.secrets.test") // the first connection pays for the leaf and the translation of new code
	speed("other.secrets.test")
	b.ResetTimer()
	for range b.N {
		var in, plain []float64
		for range 5 {
			in = append(in, speed("api.secrets.test"))
			plain = append(plain, speed("other.secrets.test"))
		}
		b.Logf("intercepted MiB/s %v; plain MiB/s %v", in, plain)
		b.ReportMetric(percentile(in, 50), "intercepted-MiB/s")
		b.ReportMetric(percentile(plain, 50), "plain-MiB/s")
		b.ReportMetric(percentile(in, 50)/percentile(plain, 50), "ratio")
	}
}
