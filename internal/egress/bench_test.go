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
