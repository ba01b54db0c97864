package integration

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// secretValue is the egress secret the tests store; it must appear in no
// answer, event, log line or database file.
const secretValue = "sk-live-emberbox-8c41f0d2a97b6e53"

// startEchoHost serves HTTPS on 127.0.0.1 with cert: /echo (any method)
// answers what it received, as JSON; /big a 64 MiB body.
func startEchoHost(t testing.TB, cert tls.Certificate) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Not a ServeMux: it would redirect a path that is not canonical
	// instead of showing what arrived.
	mux := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			w.Header().Set("Content-Length", fmt.Sprint(64<<20))
			buf := make([]byte, 256<<10)
			for range 256 {
				if _, err := w.Write(buf); err != nil {
					return
				}
			}
			return
		}
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		_ = json.NewEncoder(w).Encode(map[string]string{"proto": r.Proto, "method": r.Method, "host": r.Host,
			"path": r.URL.Path, "query": r.URL.RawQuery, "authorization": r.Header.Get("Authorization"),
			"other": r.Header.Get("X-Other"), "body": string(body)})
	})
	srv := &http.Server{Handler: mux, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}

// sdk runs a Python snippet with the real withruntime SDK against s and
// returns its stdout.
func sdk(t testing.TB, s *server, code string) string {
	t.Helper()
	cmd := exec.Command("python3", "-c", "import json\nfrom withruntime import Runtime\nruntime = Runtime()\n"+code)
	cmd.Env = append(os.Environ(), "RUNTIME_API_URL="+s.URL, "RUNTIME_API_KEY="+s.AdminKey,
		"NO_PROXY=127.0.0.1,localhost", "no_proxy=127.0.0.1,localhost")
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("withruntime: %v\n%s%s", err, out, stderr)
	}
	return strings.TrimSpace(string(out))
}

// echoed is what the echo host saw of one request.
type echoed struct {
	Proto, Method, Host, Path, Query, Authorization, Other, Body string
}

// TestEgressSecrets: a secret set with the real SDK is a placeholder in
// the sandbox and its value only in the credential header of a request
// to its host that its rules allow; nowhere else, and nowhere after it
// is deleted; the value is in no answer, event, log line or database
// file.
func TestEgressSecrets(t *testing.T) {
	needVMs(t)
	ca := newNetTestCA(t, "api.secrets.test", "other.secrets.test")
	port := startEchoHost(t, ca.leaf)
	dir := t.TempDir()
	caFile := filepath.Join(dir, "test-ca.pem")
	bundle, _ := os.ReadFile("/etc/ssl/certs/ca-certificates.crt")
	if err := os.WriteFile(caFile, append(append(bundle, '\n'), ca.caPEM...), 0o644); err != nil {
		t.Fatal(err)
	}
	// The test-only part: the gate may reach 127.0.0.1, the names point
	// there, and the test CA vouches for the far end (for the gate) and
	// for the host no secret names (for the guest).
	s := startServerArgs(t, t.TempDir(), []string{"--egress-open", "127.0.0.1/32",
		"--egress-resolve", "api.secrets.test=127.0.0.1", "--egress-resolve", "other.secrets.test=127.0.0.1",
		"--egress-upstream-ca-file", caFile, "--extra-ca-file", caFile})
	c := s.client(s.AdminKey)
	before := c.createRunning(t, map[string]any{"vcpu": 1, "memoryMiB": 1024})
	defer c.delete(t, before.ID)

	set := sdk(t, s, `s = runtime.secrets.set("API_TOKEN", value="`+secretValue+`", hosts=["api.secrets.test"],
    rules=[{"methods": ["GET", "POST"], "paths": ["/echo", "/v1/*"]}])
print(json.dumps(s))`)
	var sc struct {
		Name, Placeholder string
		Hosts             []string
	}
	if err := json.Unmarshal([]byte(set), &sc); err != nil || !strings.HasPrefix(sc.Placeholder, "emberbox-secret-") {
		t.Fatalf("secrets.set answered %s (%v)", set, err)
	}
	// A sandbox running before the set has the placeholder within seconds;
	// one created after, from its first command.
	if !waitUntil(30*time.Second, 200*time.Millisecond, func() bool {
		return c.sh(t, before.ID, "echo $API_TOKEN") == sc.Placeholder+"\n"
	}) {
		t.Fatalf("the running sandbox's $API_TOKEN is %q, want the placeholder", c.sh(t, before.ID, "echo $API_TOKEN"))
	}
	sb := c.createRunning(t, map[string]any{"vcpu": 1, "memoryMiB": 1024})
	defer c.delete(t, sb.ID)
	if got := c.sh(t, sb.ID, "echo $API_TOKEN"); got != sc.Placeholder+"\n" {
		t.Fatalf("a new sandbox's $API_TOKEN is %q, want the placeholder", got)
	}

	curl := func(args string) echoed {
		t.Helper()
		out := c.sh(t, sb.ID, `curl -sS --max-time 30 -H "Authorization: Bearer $API_TOKEN" -H "X-Other: $API_TOKEN" `+args+` 2>&1`)
		var e echoed
		if err := json.Unmarshal([]byte(out), &e); err != nil {
			t.Fatalf("curl %s: %s", args, out)
		}
		return e
	}
	url := func(host, path string) string { return fmt.Sprintf("https://%s:%d%s", host, port, path) }
	bearer, kept := "Bearer "+secretValue, "Bearer "+sc.Placeholder

	e := curl(`-d "token=$API_TOKEN" "` + url("api.secrets.test", "/echo") + `?k=$API_TOKEN"`)
	if e.Authorization != bearer {
		t.Errorf("to its host, by its rules: Authorization %q, want the value", e.Authorization)
	}
	if e.Other != sc.Placeholder || !strings.Contains(e.Query, sc.Placeholder) || !strings.Contains(e.Body, sc.Placeholder) {
		t.Errorf("the placeholder outside a credential header was replaced: %+v", e)
	}
	if e := curl(`--http2 ` + url("api.secrets.test", "/v1/models")); e.Authorization != bearer {
		t.Errorf("HTTP/2, a path under /v1/*: Authorization %q", e.Authorization)
	}
	for _, tc := range []struct{ what, args string }{
		{"another host", url("other.secrets.test", "/echo")},
		{"a method its rules do not name", `-X DELETE ` + url("api.secrets.test", "/echo")},
		{"a path outside its rules", url("api.secrets.test", "/admin")},
		{"a path that is not canonical", `--path-as-is ` + url("api.secrets.test", "/v1/../admin")},
	} {
		if e := curl(tc.args); e.Authorization != kept {
			t.Errorf("%s: Authorization %q, want the placeholder", tc.what, e.Authorization)
		}
	}

	// A budget: one call an hour per sandbox, no writes; past it the gate
	// answers 429 itself and sends nothing.
	sdk(t, s, `runtime.secrets.set("BUDGET", value="`+secretValue+`", hosts=["api.secrets.test"], api={"callsPerHour": 1, "writesPerHour": 0})`)
	if !waitUntil(30*time.Second, 200*time.Millisecond, func() bool { return strings.HasPrefix(c.sh(t, sb.ID, "echo $BUDGET"), "emberbox-secret-") }) {
		t.Fatal("the BUDGET placeholder did not reach the sandbox")
	}
	budget := func(method string) string {
		return c.sh(t, sb.ID, `curl -sS --max-time 30 -o /dev/null -w '%{http_code}' -X `+method+` -H "X-Api-Key: $BUDGET" `+url("api.secrets.test", "/echo")+` 2>&1`)
	}
	if got := []string{budget("POST"), budget("GET"), budget("GET")}; got[0] != "429" || got[1] != "200" || got[2] != "429" {
		t.Errorf("a write, a call, a second call under a budget of no writes and one call: %v, want [429 200 429]", got)
	}

	checkCARotation(t, c, sb.ID, before.ID, url("api.secrets.test", "/echo"), bearer)

	// What the server says of it, in its answers and events.
	answers := []string{
		sdk(t, s, `print(json.dumps(runtime.secrets.list()))`),
		string(c.raw(t, "GET", "/v1/sandboxes/"+sb.ID+"/events?limit=1000", nil, nil, requestTimeout).Body),
		string(c.raw(t, "GET", "/v1/events?limit=100", nil, nil, requestTimeout).Body),
	}
	if !strings.Contains(answers[1], `"secret_used"`) || !strings.Contains(answers[1], `"secret_refused"`) || !strings.Contains(answers[1], "API_TOKEN") {
		t.Errorf("the sandbox's events have no secret_used and secret_refused of API_TOKEN: %.2000s", answers[1])
	}

	sdk(t, s, `runtime.secrets.delete("API_TOKEN")`)
	// The placeholder is worth nothing at once (sent as it is, from a
	// program that kept it), and leaves the environment within seconds.
	out := c.sh(t, sb.ID, `curl -sS --max-time 30 -H "Authorization: Bearer `+sc.Placeholder+`" `+url("api.secrets.test", "/echo")+` 2>&1`)
	if e := (echoed{}); json.Unmarshal([]byte(out), &e) != nil || e.Authorization != kept {
		t.Errorf("after delete: %s, want the placeholder to arrive as it is", out)
	}
	if !waitUntil(30*time.Second, 200*time.Millisecond, func() bool { return c.sh(t, sb.ID, "echo $API_TOKEN") == "\n" }) {
		t.Errorf("after delete, $API_TOKEN is still %q", c.sh(t, sb.ID, "echo $API_TOKEN"))
	}
	for i, a := range answers {
		if strings.Contains(a, secretValue) {
			t.Errorf("answer %d holds the value: %.300s", i, a)
		}
	}
	logb, _ := os.ReadFile(s.LogPath)
	if strings.Contains(string(logb), secretValue) {
		t.Error("the server's log holds the value")
	}
	for _, f := range []string{"emberbox.db", "emberbox.db-wal"} {
		b, err := os.ReadFile(filepath.Join(s.DataDir, f))
		if err == nil && strings.Contains(string(b), secretValue) {
			t.Errorf("%s holds the value in clear", f)
		}
	}
}

// egressCA is what the test reads of GET /v1/egress-ca.
type egressCA struct {
	ID          string
	Certificate string
	RetireAt    *string
	Newest      bool
	Guests      struct{ Trusting, NotKnown int }
}

func (c *client) egressCAs(t testing.TB) []egressCA {
	t.Helper()
	r := c.raw(t, "GET", "/v1/egress-ca", nil, nil, requestTimeout)
	var out struct{ CAs []egressCA }
	if r.err != nil || r.Status != http.StatusOK || json.Unmarshal(r.Body, &out) != nil {
		t.Fatalf("GET /v1/egress-ca: %v", r)
	}
	return out.CAs
}

// guestFile reads a file of sandbox id whole (the system bundle is
// larger than a command's output).
func (c *client) guestFile(t testing.TB, id, path string) string {
	t.Helper()
	b, r := c.readFile(t, id, path)
	if r.Status != http.StatusOK {
		t.Fatalf("reading %s: %v", path, r)
	}
	return string(b)
}

func (c *client) rotateCA(t testing.TB, keep int) (egressCA, []egressCA) {
	t.Helper()
	r := c.raw(t, "POST", "/v1/egress-ca:rotate", map[string]any{"keepPreviousSeconds": keep}, nil, requestTimeout)
	var out struct {
		New      egressCA
		Previous []egressCA
	}
	if r.err != nil || r.Status != http.StatusOK || json.Unmarshal(r.Body, &out) != nil {
		t.Fatalf("rotating the egress CA: %v", r)
	}
	return out.New, out.Previous
}

// checkCARotation rotates the egress CA under running sandbox id and
// paused sandbox other, both holding a secret for target: each keeps its
// secret working throughout, is answered with the new CA's leaves once it
// holds it (a running one before the rotation is answered, a paused one
// when it wakes), and trusts the old CA only until it is retired.
func checkCARotation(t *testing.T, c *client, id, other, target, bearer string) {
	t.Helper()
	first := c.egressCAs(t)
	if len(first) != 1 || !first[0].Newest || first[0].Guests.Trusting != 2 {
		t.Fatalf("before the rotation: %+v, want one CA two running guests are known to trust", first)
	}
	c.lifecycle(t, other, "pause", nil)
	// swapVia is the request with the secret, trusting only the CA pem
	// (written to the guest): it fails unless that CA signed the leaf.
	swapVia := func(sbx, pem string) error {
		t.Helper()
		c.writeFile(t, sbx, "/tmp/only-ca.pem", []byte(pem))
		out := c.sh(t, sbx, `curl -sS --max-time 30 --cacert /tmp/only-ca.pem -H "Authorization: Bearer $API_TOKEN" `+target+` 2>&1 || true`)
		var e echoed
		if err := json.Unmarshal([]byte(out), &e); err != nil {
			return fmt.Errorf("%s", strings.TrimSpace(out))
		}
		if e.Authorization != bearer {
			return fmt.Errorf("the far end saw Authorization %q", e.Authorization)
		}
		return nil
	}
	if err := swapVia(id, first[0].Certificate); err != nil {
		t.Fatalf("before the rotation, trusting the first CA: %v", err)
	}

	next, prev := c.rotateCA(t, 3600)
	if len(prev) != 1 || prev[0].ID != first[0].ID || prev[0].RetireAt == nil || next.ID == first[0].ID || next.Guests.Trusting != 1 {
		t.Fatalf("rotation: new %+v, previous %+v; want the first kept with a retirement and the running guest holding the new one", next, prev)
	}
	extra := c.guestFile(t, id, "/usr/local/share/ca-certificates/emberbox-extra.crt")
	system := c.guestFile(t, id, "/etc/ssl/certs/ca-certificates.crt")
	for _, pem := range []string{first[0].Certificate, next.Certificate} {
		if !strings.Contains(extra, pem) || strings.Count(system, pem) != 1 {
			t.Errorf("during the rotation the guest does not trust both CAs once each")
		}
	}
	if err := swapVia(id, next.Certificate); err != nil {
		t.Errorf("after the rotation, trusting the new CA alone: %v", err)
	}
	if err := swapVia(id, first[0].Certificate); err == nil {
		t.Error("after the rotation the running guest was still answered with the old CA's leaf")
	}
	// The paused one holds the old set until it wakes, and the new one
	// from its first command after.
	c.lifecycle(t, other, "wake", nil)
	if err := swapVia(other, next.Certificate); err != nil {
		t.Errorf("a woken sandbox, trusting the new CA alone: %v", err)
	}

	// A rotation that keeps nothing (a key that may have leaked): the
	// earlier CAs leave every running guest's trust at once.
	last, prev := c.rotateCA(t, 0)
	if len(prev) != 0 || last.Guests.Trusting != 2 {
		t.Errorf("a rotation keeping nothing: previous %+v, new %+v", prev, last)
	}
	for _, sbx := range []string{id, other} {
		system := c.guestFile(t, sbx, "/etc/ssl/certs/ca-certificates.crt")
		if strings.Contains(system, first[0].Certificate) || strings.Contains(system, next.Certificate) || !strings.Contains(system, last.Certificate) {
			t.Errorf("%s: after retiring the others its bundle does not hold the newest CA alone", sbx)
		}
		if err := swapVia(sbx, last.Certificate); err != nil {
			t.Errorf("%s: with the newest CA alone: %v", sbx, err)
		}
	}
}
