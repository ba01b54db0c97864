package integration

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/store"
)

// netTestCA is a throwaway CA and a leaf certificate for the test names.
type netTestCA struct {
	caPEM []byte
	leaf  tls.Certificate
}

func newNetTestCA(t testing.TB, names ...string) *netTestCA {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "emberbox network test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	leafKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &leafKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return &netTestCA{
		caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		leaf:  tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: leafKey},
	}
}

// netTestHost is an HTTPS test host on a loopback address.
type netTestHost struct {
	addr      string
	port      int
	plainPort int
	accepted  atomic.Int64 // TLS connections
}

func startNetTestHost(t testing.TB, ip string, cert tls.Certificate) *netTestHost {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	h := &netTestHost{addr: ln.Addr().String(), port: ln.Addr().(*net.TCPAddr).Port}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "hello from %s\n", r.Host) })
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		n := 64 << 20
		w.Header().Set("Content-Length", fmt.Sprint(n))
		buf := make([]byte, 256<<10)
		for n > 0 {
			k := min(n, len(buf))
			if _, err := w.Write(buf[:k]); err != nil {
				return
			}
			n -= k
		}
	})
	srv := &http.Server{Handler: mux, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}},
		ConnState: func(c net.Conn, s http.ConnState) {
			if s == http.StateNew {
				h.accepted.Add(1)
			}
		}}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	// The same over plain HTTP, for measuring without TLS.
	pln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	h.plainPort = pln.Addr().(*net.TCPAddr).Port
	psrv := &http.Server{Handler: mux}
	go psrv.Serve(pln)
	t.Cleanup(func() { psrv.Close() })
	return h
}

// startServerWith is startServer with extra `serve` flags (the shared
// helper takes none).
func startServerWith(t testing.TB, dataDir string, args ...string) *server {
	t.Helper()
	needVMs(t)
	port := freePort(t)
	s := &server{
		URL: fmt.Sprintf("http://127.0.0.1:%d", port), DataDir: dataDir,
		LogPath: filepath.Join(t.TempDir(), "server-net.log"), exited: make(chan struct{}), tr: trackerFor(dataDir),
	}
	logf, err := os.Create(s.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	s.cmd = exec.Command(filepath.Join(binDir, "emberbox"), append([]string{"serve",
		"--listen", fmt.Sprintf("127.0.0.1:%d", port), "--data-dir", dataDir}, args...)...)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		s.waitErr = s.cmd.Wait()
		logf.Close()
		close(s.exited)
	}()
	registerServer(s)
	t.Cleanup(func() { s.cleanup(t) })
	hc := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 5 * time.Second}
	ok := waitUntil(healthTimeout, 200*time.Millisecond, func() bool {
		if !s.alive() {
			return true
		}
		resp, err := hc.Get(s.URL + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	if !ok || !s.alive() {
		t.Fatalf("server did not start; log tail:\n%s", s.logTail(40))
	}
	key, err := os.ReadFile(filepath.Join(dataDir, "admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	s.AdminKey = strings.TrimSpace(string(key))
	return s
}

type networkJSON struct {
	SandboxID       string   `json:"sandboxId"`
	Internet        bool     `json:"internet"`
	Allow           []string `json:"allow"`
	Deny            []string `json:"deny"`
	Version         int64    `json:"version"`
	Enforced        bool     `json:"enforced"`
	EnforcedVersion int64    `json:"enforcedVersion"`
	Egress          struct {
		BytesIn, BytesOut, Refused, Dials int64
	} `json:"egress"`
}

// netEnv is one server with test hosts for the network tests.
type netEnv struct {
	s      *server
	c      *client
	good   *netTestHost // 127.0.0.1, opened by the operator
	hidden *netTestHost // 127.0.0.2, a host loopback service nobody opened
	caFile string       // host roots + the test CA
	args   []string     // the server's egress flags
}

func newNetEnv(t testing.TB) *netEnv {
	ca := newNetTestCA(t, "good.test", "bad.test", "sub.test", "www.sub.test", "hidden.test", "other.test")
	good := startNetTestHost(t, "127.0.0.1", ca.leaf)
	hidden := startNetTestHost(t, "127.0.0.2", ca.leaf)
	// The guests trust the host's roots (PyPI through an inspecting proxy)
	// and the test CA.
	bundle, _ := os.ReadFile("/etc/ssl/certs/ca-certificates.crt")
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, append(append(bundle, '\n'), ca.caPEM...), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"--extra-ca-file", caFile, "--egress-open", "127.0.0.1/32",
		"--egress-resolve", "good.test=127.0.0.1", "--egress-resolve", "bad.test=127.0.0.1",
		"--egress-resolve", "sub.test=127.0.0.1", "--egress-resolve", "www.sub.test=127.0.0.1",
		"--egress-resolve", "other.test=127.0.0.1", "--egress-resolve", "hidden.test=127.0.0.2",
		"--egress-resolve", "meta.test=169.254.169.254"}
	s := startServerWith(t, t.TempDir(), args...)
	return &netEnv{s: s, c: s.client(s.AdminKey), good: good, hidden: hidden, caFile: caFile, args: args}
}

func (e *netEnv) url(host string) string { return fmt.Sprintf("https://%s:%d/", host, e.good.port) }

// run runs command in the sandbox (as user unless root) and returns the
// exit code and stdout+stderr.
func (e *netEnv) run(t testing.TB, id, command string, root bool) (string, string) {
	t.Helper()
	req := execReq{Command: command + " 2>&1", TimeoutMs: 120_000}
	if root {
		req.User = "root"
	}
	res, _ := e.c.exec(t, id, req)
	return res.exit(), res.Stdout
}

func (e *netEnv) network(t testing.TB, id string) networkJSON {
	n, _ := call[networkJSON](t, e.c, "GET", "/v1/sandboxes/"+id+"/network", nil, nil)
	return n
}

// curl runs curl through the relay (--noproxy ”: even for loopback
// targets) and returns "ok", the refusal header's value, or "failed: …".
const curlCmd = `curl -sS -v --noproxy '' --max-time 20 %s 2>/tmp/curl.err; rc=$?; grep -i '^< x-emberbox-egress' /tmp/curl.err | tr -d '\r'; echo rc=$rc`

func (e *netEnv) curl(t testing.TB, id, url string) string {
	t.Helper()
	_, out := e.run(t, id, fmt.Sprintf(curlCmd, url), false)
	switch {
	case strings.Contains(out, "hello from"):
		return "ok"
	case strings.Contains(strings.ToLower(out), "x-emberbox-egress: "):
		i := strings.Index(strings.ToLower(out), "x-emberbox-egress: ")
		return strings.Fields(out[i+len("x-emberbox-egress: "):])[0]
	}
	return "failed: " + strings.TrimSpace(out)
}

// rawPy connects with a plain socket, ignoring proxy variables, sends a
// plain HTTP request and prints "answered" with the bytes it got back, or
// the error and how long it took. (A captured connection is accepted in
// the guest before the host decides, so a refusal shows as a reset.)
const rawPy = `import socket, sys, time
t = time.time()
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]) if len(sys.argv) > 3 else 20)
    s.sendall(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
    b = s.recv(100)
    if not b:
        raise ConnectionResetError(0, "closed without an answer")
    print("answered %d bytes %.2fs" % (len(b), time.time() - t))
except Exception as e:
    print("error %s %.2fs" % (type(e).__name__ if not isinstance(e, OSError) else (e.strerror or type(e).__name__), time.time() - t))
`

// dnsPy sends one UDP DNS query for argv[1] to argv[2]:53 and prints the
// answer's rcode and A records.
const dnsPy = `import socket, struct, sys
q = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + b"".join(bytes([len(l)]) + l.encode() for l in sys.argv[1].split(".")) + b"\0" + struct.pack(">HH", 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(5)
try:
    s.sendto(q, (sys.argv[2], 53)); r = s.recv(512)
    n = struct.unpack(">H", r[6:8])[0]
    print("rcode=%d answers=%d" % (r[3] & 15, n) + ("" if n == 0 else " a=%s" % socket.inet_ntoa(r[-4:])))
except OSError as e:
    print("error", e.strerror or type(e).__name__)
`

func TestNetwork(t *testing.T) {
	e := newNetEnv(t)
	var escapes []string
	record := func(attempt, result string) {
		escapes = append(escapes, fmt.Sprintf("| %s | %s |", attempt, result))
	}
	defer func() {
		t.Logf("escape table:\n| attempt | result |\n|---|---|\n%s", strings.Join(escapes, "\n"))
	}()

	sb := e.c.createRunning(t, map[string]any{"network": map[string]any{"allow": []string{"good.test", "*.sub.test", "hidden.test", "meta.test", "127.0.0.1/32"}}})
	id := sb.ID
	if n := e.network(t, id); !n.Internet || n.Version != 1 || !n.Enforced || len(n.Allow) != 5 {
		t.Fatalf("network at create = %+v", n)
	}
	e.c.writeFile(t, id, "/tmp/raw.py", []byte(rawPy))
	e.c.writeFile(t, id, "/tmp/dns.py", []byte(dnsPy))

	t.Run("allowlist", func(t *testing.T) {
		for _, tc := range []struct{ host, want string }{
			{"good.test", "ok"},
			{"www.sub.test", "ok"},
			{"bad.test", "rule-not-allowed"},
			{"sub.test", "rule-not-allowed"}, // *.sub.test does not admit the apex
			{"other.test", "rule-not-allowed"},
		} {
			if got := e.curl(t, id, e.url(tc.host)); got != tc.want {
				t.Errorf("curl %s = %s, want %s", tc.host, got, tc.want)
			}
		}
		_, out := e.run(t, id, "getent hosts good.test; echo rc=$?; getent hosts bad.test; echo rc=$?", false)
		if !strings.Contains(out, "198.19.") || !strings.Contains(out, "rc=2") {
			t.Errorf("DNS in the guest: %q, want good.test answered (a stand-in address) and bad.test not", out)
		}
		// Programs that ignore the proxy variables: captured, and checked
		// the same way.
		p := fmt.Sprint(e.good.port)
		_, out = e.run(t, id, "python3 /tmp/raw.py good.test "+p+"; python3 /tmp/raw.py bad.test "+p+"; python3 /tmp/raw.py sub.test "+p, false)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 3 || !strings.HasPrefix(lines[0], "answered") || !strings.HasPrefix(lines[1], "error") || !strings.HasPrefix(lines[2], "error") {
			t.Errorf("raw sockets to good.test, bad.test, sub.test: %q, want answered, error, error", out)
		}
		if got := e.curl(t, id, "--noproxy '*' "+e.url("good.test")); got != "ok" {
			t.Errorf("curl --noproxy '*' good.test (captured) = %s, want ok", got)
		}
		if got := e.curl(t, id, "--noproxy '*' "+e.url("bad.test")); !strings.Contains(got, "rc=6") {
			t.Errorf("curl --noproxy '*' bad.test (captured) = %s, want no such name (rc=6)", got)
		}
	})

	t.Run("escapes", func(t *testing.T) {
		before := e.hidden.accepted.Load()
		dialsBefore := e.network(t, id).Egress.Dials
		defer func() {
			// Every attempt above was refused before the host dialed.
			if n := e.network(t, id).Egress.Dials - dialsBefore; n != 0 {
				t.Errorf("the host dialed %d times during refused escape attempts", n)
			}
		}()
		for _, tc := range []struct{ name, url, want string }{
			{"host loopback service not opened (127.0.0.2) by name", e.url("hidden.test"), "address-forbidden"},
			{"host loopback service not opened (127.0.0.2) by IP", fmt.Sprintf("https://127.0.0.2:%d/", e.hidden.port), "address-forbidden"},
			{"metadata 169.254.169.254 via proxy", "http://169.254.169.254/latest/meta-data/", "address-forbidden"},
			{"allowed name resolving to metadata", "http://meta.test/", "address-forbidden"},
			{"private 10.0.0.1 via proxy", "http://10.0.0.1/", "address-forbidden"},
			{"IPv6 loopback [::1] via proxy", fmt.Sprintf("http://[::1]:%d/", e.good.port), "address-forbidden"},
			{"IPv4-mapped metadata [::ffff:169.254.169.254]", "http://[::ffff:169.254.169.254]/", "address-forbidden"},
			{"mail port 25 on an allowed name", "http://good.test:25/", "port-forbidden"},
			{"the emberbox API on the host (127.0.0.1: opened by the operator and allowed by the policy, yet closed)", e.s.URL + "/healthz", "address-forbidden"},
		} {
			got := e.curl(t, id, tc.url)
			if got != tc.want {
				t.Errorf("%s: %s → %s, want %s", tc.name, tc.url, got, tc.want)
			}
			record(tc.name+" (`curl "+tc.url+"`)", "403 "+got)
		}
		if n := e.hidden.accepted.Load() - before; n != 0 {
			t.Errorf("the unopened loopback service got %d connections", n)
		}
		// Without the proxy: captured and refused by the host (a reset
		// at once), or no route at all.
		for _, tc := range []struct{ name, host, port string }{
			{"raw socket to a public IP not on the allow list (1.1.1.1:443), proxy vars ignored", "1.1.1.1", "443"},
			{"raw socket to 169.254.169.254:80", "169.254.169.254", "80"},
			{"raw socket to 10.0.0.1:80", "10.0.0.1", "80"},
			{"raw socket to the host's 127.0.0.2 service by its allowed name hidden.test", "hidden.test", fmt.Sprint(e.hidden.port)},
			{"raw socket to an unmapped stand-in address 198.19.200.200:443", "198.19.200.200", "443"},
			{"raw socket to the test host's port on 127.0.0.1 (the guest's own loopback)", "127.0.0.1", fmt.Sprint(e.good.port)},
			{"raw socket to 2606:4700::1111:443 (IPv6)", "2606:4700::1111", "443"},
		} {
			_, out := e.run(t, id, "python3 /tmp/raw.py "+tc.host+" "+tc.port, false)
			out = strings.TrimSpace(out)
			if !strings.HasPrefix(out, "error") || !fastError(out) {
				t.Errorf("%s: %q, want a fast error", tc.name, out)
			}
			record(tc.name, out)
		}
		_, out := e.run(t, id, "python3 /tmp/dns.py example.com 8.8.8.8; python3 /tmp/dns.py bad.test 1.1.1.1", false)
		if strings.Count(out, "rcode=3 answers=0") != 2 {
			t.Errorf("UDP DNS to outside resolvers: %q, want both answered NXDOMAIN by the host's policy", out)
		}
		record("DNS to an outside resolver (UDP 8.8.8.8:53 example.com, 1.1.1.1:53 bad.test)", oneLine(out)+" (answered by the policy resolver)")
		_, out = e.run(t, id, `python3 -c "
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    s.sendto(b'x', ('1.1.1.1', 443)); print('sent')
except OSError as ex:
    print('error', ex.strerror)
"`, false)
		if !strings.Contains(out, "error") {
			t.Errorf("UDP to 1.1.1.1:443: %q, want an error", out)
		}
		record("UDP (QUIC) to 1.1.1.1:443", strings.TrimSpace(out))
		_, out = e.run(t, id, `echo nameserver 8.8.8.8 | sudo tee /etc/resolv.conf >/dev/null; getent hosts example.com; echo rc=$?; `+
			`env -u HTTPS_PROXY -u https_proxy -u HTTP_PROXY -u http_proxy curl -sS --max-time 10 https://bad.test:`+fmt.Sprint(e.good.port)+`/ ; echo rc=$?; `+
			`env -u HTTPS_PROXY -u https_proxy curl -sS --max-time 10 https://1.1.1.1/ ; echo rc=$?`, false)
		if strings.Contains(out, "hello from") || strings.Contains(out, "rc=0") {
			t.Errorf("after sudo edits: %q, want every attempt to fail", out)
		}
		record("`sudo` resolv.conf → 8.8.8.8, then getent example.com / curl bad.test and 1.1.1.1 without proxy vars", oneLine(out))
		// Root undoing the capture, in a sandbox of its own.
		other := e.c.createRunning(t, map[string]any{"network": map[string]any{"allow": []string{"good.test"}}})
		e.c.writeFile(t, other.ID, "/tmp/raw.py", []byte(rawPy))
		// Another sandbox: it has no address of its own to reach. Its
		// service on its loopback is invisible from this one (127.0.0.1
		// through the proxy would be the host's, never a sandbox's).
		e.c.spawn(t, other.ID, "mkdir -p /tmp/www && echo other-sandbox-secret > /tmp/www/index.html && cd /tmp/www && python3 -m http.server 8000 --bind 0.0.0.0")
		waitUntil(20*time.Second, 300*time.Millisecond, func() bool {
			_, o := e.run(t, other.ID, "curl -s --noproxy '*' http://127.0.0.1:8000/", false)
			return strings.Contains(o, "other-sandbox-secret")
		})
		_, out = e.run(t, id, "curl -sS --noproxy '*' -m 5 http://127.0.0.1:8000/; echo rc=$?; curl -sS --noproxy '*' -m 5 http://198.18.0.1:8000/; echo rc=$?", false)
		if strings.Contains(out, "other-sandbox-secret") {
			t.Errorf("reached another sandbox: %q", out)
		}
		record("another sandbox's service on :8000 (at 127.0.0.1, at the capture address 198.18.0.1)", oneLine(out))
		_, out = e.run(t, other.ID, `sudo nft flush ruleset; sudo ip route replace default dev lo; python3 /tmp/raw.py 1.1.1.1 443 3; sudo ip route del default; python3 /tmp/raw.py 1.1.1.1 443 3; ls /sys/class/net | tr '\n' ' '`, false)
		record("`sudo nft flush ruleset` + own routes, then raw socket to 1.1.1.1:443", oneLine(out)+" (no network card: nothing leaves)")
		if strings.Contains(out, "answered") {
			t.Errorf("after removing the capture: %q", out)
		}
		_, _ = e.run(t, id, `printf 'nameserver 127.0.0.1\n' | sudo tee /etc/resolv.conf >/dev/null`, false)
	})

	t.Run("live change cuts keep-alive", func(t *testing.T) {
		script := fmt.Sprintf(`import http.client, ssl, os, time
ctx = ssl.create_default_context()
c = http.client.HTTPSConnection("127.0.0.1", 10800, context=ctx, timeout=30)  # through the proxy
c.set_tunnel("good.test", %d)
d = http.client.HTTPSConnection("good.test", %d, context=ctx, timeout=30)  # captured
for name, x in (("proxied", c), ("captured", d)):
    x.request("GET", "/"); r = x.getresponse(); print("first", name, r.status, flush=True); r.read()
while not os.path.exists("/tmp/go"): time.sleep(0.05)
for name, x in (("proxied", c), ("captured", d)):
    try:
        x.request("GET", "/"); r = x.getresponse(); print("second", name, r.status, flush=True)
    except Exception as e:
        print("cut", name, type(e).__name__, flush=True)
`, e.good.port, e.good.port)
		e.c.writeFile(t, id, "/tmp/ka.py", []byte(script))
		e.c.writeFile(t, id, "/tmp/ka.out", nil)
		p := e.c.spawn(t, id, "python3 /tmp/ka.py > /tmp/ka.out 2>&1")
		if !waitUntil(60*time.Second, 200*time.Millisecond, func() bool {
			b, _ := e.c.readFile(t, id, "/tmp/ka.out")
			return strings.Contains(string(b), "first captured")
		}) {
			b, _ := e.c.readFile(t, id, "/tmp/ka.out")
			t.Fatalf("keep-alive client did not start: %q (process %+v)", b, p)
		}
		n, _ := call[networkJSON](t, e.c, "PUT", "/v1/sandboxes/"+id+"/network", map[string]any{"internet": true, "allow": []string{"other.test"}}, nil)
		if n.Version != 2 || !n.Enforced || n.EnforcedVersion != 2 || n.Allow[0] != "other.test" {
			t.Errorf("PUT network = %+v", n)
		}
		e.c.sh(t, id, "touch /tmp/go")
		var out string
		waitUntil(30*time.Second, 200*time.Millisecond, func() bool {
			b, _ := e.c.readFile(t, id, "/tmp/ka.out")
			out = string(b)
			return strings.Count(out, "second")+strings.Count(out, "cut") == 2
		})
		if !strings.Contains(out, "cut proxied") || !strings.Contains(out, "cut captured") {
			t.Errorf("open keep-alive connections after the PUT: %q, want both cut", out)
		}
		record("live PUT {allow:[other.test]} with keep-alive connections to good.test open (proxied and captured)", oneLine(out))
		if got := e.curl(t, id, e.url("good.test")); got != "rule-not-allowed" {
			t.Errorf("good.test after the PUT = %s", got)
		}
		if got := e.curl(t, id, e.url("other.test")); got != "ok" {
			t.Errorf("other.test after the PUT = %s", got)
		}
		if n := e.network(t, id); n.Egress.Refused == 0 || n.Egress.BytesIn == 0 {
			t.Errorf("counters = %+v, want refusals and bytes counted", n.Egress)
		}
		// Refusals are visible to the sandbox's owner in its events.
		resp := e.c.raw(t, "GET", "/v1/sandboxes/"+id+"/events?limit=1000", nil, nil, requestTimeout)
		var evs struct {
			Data []struct {
				Type string         `json:"type"`
				Data map[string]any `json:"data"`
			} `json:"data"`
		}
		if resp.Status != 200 || json.Unmarshal(resp.Body, &evs) != nil {
			t.Fatalf("GET events: %v", resp)
		}
		kinds := map[string]int{}
		for _, ev := range evs.Data {
			kinds[ev.Type]++
			if ev.Type == "egress_refused" && (ev.Data["reason"] == nil || ev.Data["target"] == nil) {
				t.Errorf("refusal event without reason or target: %+v", ev)
			}
		}
		if kinds["egress_refused"] == 0 || kinds["network_changed"] != 1 {
			t.Errorf("events: %v, want egress_refused events and one network_changed", kinds)
		}
		if other := e.s.client(e.s.createKey(t, "events-other")).raw(t, "GET", "/v1/sandboxes/"+id+"/events", nil, nil, requestTimeout); other.Status != 404 {
			t.Errorf("another key's GET events: %v, want 404", other)
		}
	})

	parent := t // the new server must outlive this subtest
	t.Run("after a server restart", func(t *testing.T) {
		// The reattached sandbox keeps its stored policy (version 2 from
		// the live change) and its egress works again.
		e.s.terminate(t)
		e.s = startServerWith(parent, e.s.DataDir, e.args...)
		e.c = e.s.client(e.s.AdminKey)
		waitUntil(60*time.Second, 500*time.Millisecond, func() bool {
			r := e.c.raw(t, "POST", "/v1/sandboxes/"+id+":exec", execReq{Command: "true"}, nil, requestTimeout)
			return r.Status == 200
		})
		n := e.network(t, id)
		if n.Version != 2 || !n.Enforced || n.EnforcedVersion != 2 || len(n.Allow) != 1 || n.Allow[0] != "other.test" {
			t.Errorf("network after restart = %+v, want version 2 enforced, allow [other.test]", n)
		}
		if got := e.curl(t, id, e.url("other.test")); got != "ok" {
			t.Errorf("other.test after restart = %s", got)
		}
		if got := e.curl(t, id, e.url("good.test")); got != "rule-not-allowed" {
			t.Errorf("good.test after restart = %s", got)
		}
		_, out := e.run(t, id, "python3 /tmp/raw.py other.test "+fmt.Sprint(e.good.port), false)
		if !strings.HasPrefix(out, "answered") {
			t.Errorf("captured connection to other.test after restart: %q", out)
		}
	})

	t.Run("internet off", func(t *testing.T) {
		sb := e.c.createRunning(t, map[string]any{"network": map[string]any{"internet": false}})
		e.c.writeFile(t, sb.ID, "/tmp/raw.py", []byte(rawPy))
		start := time.Now()
		if got := e.curl(t, sb.ID, e.url("good.test")); got != "internet-off" {
			t.Errorf("curl good.test with internet off = %s", got)
		}
		_, out := e.run(t, sb.ID, "getent hosts good.test; echo rc=$?; python3 /tmp/raw.py good.test 443; python3 /tmp/raw.py 1.1.1.1 443", false)
		if !strings.Contains(out, "rc=2") || strings.Contains(out, "connected") || strings.Count(out, "error") != 2 {
			t.Errorf("internet off: %q, want DNS and raw connections to fail", out)
		}
		if d := time.Since(start); d > 30*time.Second {
			t.Errorf("internet off: refusals took %s", d)
		}
		record("internet:false: curl via proxy / DNS / raw socket", "403 internet-off / "+oneLine(out))
		// Its totals are kept as an event when it goes away.
		e.c.delete(t, sb.ID)
		st, err := store.Open(context.Background(), filepath.Join(e.s.DataDir, "emberbox.db"))
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		evs, _ := st.ListEvents(context.Background(), sb.ID, 0)
		var totals map[string]any
		for _, ev := range evs {
			if ev.Type == "egress_totals" {
				totals = ev.Data
			}
		}
		if totals == nil || totals["refused"].(float64) < 3 {
			t.Errorf("egress_totals event: %v, want the refusals counted", totals)
		}
	})
}

func fastError(out string) bool {
	var secs float64
	f := strings.Fields(out)
	if len(f) == 0 {
		return false
	}
	fmt.Sscanf(strings.TrimSuffix(f[len(f)-1], "s"), "%g", &secs)
	return secs < 2
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "|", "/")), " ")
}

// TestNetworkPyPI installs a package from PyPI through the egress proxy with
// a PyPI-only allow list.
func TestNetworkPyPI(t *testing.T) {
	needVMs(t)
	hc := &http.Client{Timeout: 15 * time.Second}
	resp, err := hc.Get("https://pypi.org/simple/requests/")
	if err != nil {
		t.Skipf("PyPI is not reachable from this host: %v", err)
	}
	resp.Body.Close()
	s := startServerWith(t, t.TempDir())
	c := s.client(s.AdminKey)
	sb := c.createRunning(t, map[string]any{"network": map[string]any{"internet": true, "allow": []string{"pypi.org", "*.pythonhosted.org"}}})
	res, _ := c.exec(t, sb.ID, execReq{Command: "python3 -m venv /tmp/v && /tmp/v/bin/pip install -q --disable-pip-version-check requests 2>&1 && /tmp/v/bin/python -c 'import requests; print(\"requests\", requests.__version__)'", TimeoutMs: 600_000})
	if res.exit() != "0" || !strings.Contains(res.Stdout, "requests ") {
		t.Fatalf("pip install requests: exit %s: %s %s", res.exit(), res.Stdout, res.Stderr)
	}
	t.Logf("%s", strings.TrimSpace(res.Stdout))
	res, _ = c.exec(t, sb.ID, execReq{Command: "curl -sS -v --max-time 20 https://registry.npmjs.org/ 2>&1 | grep -i '^< x-emberbox-egress' | tr -d '\\r'"})
	if !strings.Contains(strings.ToLower(res.Stdout), "rule-not-allowed") {
		t.Errorf("npm registry: %q, want refused with rule-not-allowed", res.Stdout)
	}
	var n networkJSON
	n, _ = call[networkJSON](t, c, "GET", "/v1/sandboxes/"+sb.ID+"/network", nil, nil)
	t.Logf("egress counters: %+v", n.Egress)
}

// BenchmarkEgressDownload downloads 64 MiB over HTTPS from a test host on
// the host's loopback: with curl on the host, and with curl in a sandbox
// through the proxy and through the capture of a program ignoring it. It
// reports curl's own speed (MB/s) beside the wall time of each exec.
func BenchmarkEgressDownload(b *testing.B) {
	e := newNetEnv(b)
	sb := e.c.createRunning(b, map[string]any{"network": map[string]any{"allow": []string{"good.test"}}})
	url := fmt.Sprintf("https://good.test:%d/big", e.good.port)
	speed := func(b *testing.B, out string) {
		var v float64
		if _, err := fmt.Sscanf(strings.TrimSpace(out), "%g", &v); err != nil || v == 0 {
			b.Fatalf("curl: %q", out)
		}
		b.ReportMetric(v/1e6, "curl-MB/s")
	}
	b.Run("host", func(b *testing.B) {
		b.SetBytes(64 << 20)
		for b.Loop() {
			out, err := exec.Command("curl", "-sS", "-o", "/dev/null", "-w", "%{speed_download}", "--cacert", e.caFile,
				"--resolve", fmt.Sprintf("good.test:%d:127.0.0.1", e.good.port), url).Output()
			if err != nil {
				b.Fatal(err)
			}
			speed(b, string(out))
		}
	})
	plainURL := fmt.Sprintf("http://good.test:%d/big", e.good.plainPort)
	b.Run("host-http", func(b *testing.B) {
		b.SetBytes(64 << 20)
		for b.Loop() {
			out, err := exec.Command("curl", "-sS", "-o", "/dev/null", "-w", "%{speed_download}",
				"--resolve", fmt.Sprintf("good.test:%d:127.0.0.1", e.good.plainPort), plainURL).Output()
			if err != nil {
				b.Fatal(err)
			}
			speed(b, string(out))
		}
	})
	for _, mode := range []struct{ name, flags, url string }{
		{"guest-proxy", "", url}, {"guest-captured", "--noproxy '*'", url},
		{"guest-proxy-http", "", plainURL}, {"guest-captured-http", "--noproxy '*'", plainURL},
	} {
		b.Run(mode.name, func(b *testing.B) {
			b.SetBytes(64 << 20)
			for b.Loop() {
				code, out := e.run(b, sb.ID, "curl -sS -o /dev/null -w '%{speed_download}' "+mode.flags+" "+mode.url, false)
				if code != "0" {
					b.Fatalf("curl in the guest: exit %s: %s", code, out)
				}
				speed(b, out)
			}
		})
	}
}
