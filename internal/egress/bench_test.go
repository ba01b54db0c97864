package egress

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

const benchSize = 64 << 20

func bigServer() *httptest.Server {
	buf := make([]byte, 256<<10)
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(benchSize))
		for n := benchSize; n > 0; n -= len(buf) {
			if _, err := w.Write(buf[:min(n, len(buf))]); err != nil {
				return
			}
		}
	}))
}

func download(b *testing.B, c *http.Client, url string) {
	resp, err := c.Get(url)
	if err != nil {
		b.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || n != benchSize {
		b.Fatalf("got %d bytes: %v", n, err)
	}
}

// BenchmarkDownloadDirect downloads 64 MiB from a loopback test host.
func BenchmarkDownloadDirect(b *testing.B) {
	ts := bigServer()
	defer ts.Close()
	c := &http.Client{Transport: &http.Transport{Proxy: nil}}
	b.SetBytes(benchSize)
	for b.Loop() {
		download(b, c, ts.URL)
	}
}

// BenchmarkDownloadProxy downloads the same through the host-side egress
// proxy (policy checks, counting, tracking), with a CONNECT tunnel as
// HTTPS clients use it.
func BenchmarkDownloadProxy(b *testing.B) {
	ts := bigServer()
	defer ts.Close()
	env := newTestEnv(b, Policy{Internet: true, Allow: []string{"good.test"}}, map[string]string{"good.test": "127.0.0.1"})
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(env.proxyURL)}}
	url := "http://good.test:" + ts.URL[len("http://127.0.0.1:"):] + "/"
	b.SetBytes(benchSize)
	for b.Loop() {
		download(b, c, url)
	}
}

// bigBody is what BenchmarkInterceptThroughput downloads.
var bigBody = make([]byte, 1<<20)

// BenchmarkInterceptThroughput downloads 1 MiB over HTTPS through a CONNECT
// tunnel of the gate, HTTP/2 end to end: intercepted (TLS terminated and
// made again, each request proxied) and plain (piped).
func BenchmarkInterceptThroughput(b *testing.B) {
	e := newInterceptEnv(b)
	for _, bc := range []struct{ name, host string }{{"intercepted", "api.test"}, {"plain", "plain.test"}} {
		b.Run(bc.name, func(b *testing.B) {
			c := e.client(true)
			url := e.url(bc.host, "/big")
			b.SetBytes(int64(len(bigBody)))
			for b.Loop() {
				resp, err := c.Get(url)
				if err != nil {
					b.Fatal(err)
				}
				n, err := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err != nil || n != int64(len(bigBody)) {
					b.Fatalf("got %d bytes: %v", n, err)
				}
			}
		})
	}
}
