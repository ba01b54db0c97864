package api

import (
	"strconv"
	"strings"
	"testing"

	"github.com/emberbox/emberbox/internal/sandbox"
)

// previewLabel is previewSandbox as a preview's host name carries it.
var previewLabel = hostLabelID(previewSandbox)

func TestParsePreviewDomain(t *testing.T) {
	for _, c := range []struct {
		in, url string // url of port 3000 of previewSandbox asked at host:8080
	}{
		{"", "http://3000-" + previewLabel + ".localhost:8080/"},
		{"preview.example.com", "https://3000-" + previewLabel + ".preview.example.com/"},
		{"Preview.Example.COM", "https://3000-" + previewLabel + ".preview.example.com/"},
		{"https://preview.example.com", "https://3000-" + previewLabel + ".preview.example.com/"},
		{"https://preview.example.com:443/", "https://3000-" + previewLabel + ".preview.example.com/"},
		{"http://preview.test:8081", "http://3000-" + previewLabel + ".preview.test:8081/"},
		{"preview.test:8443", "https://3000-" + previewLabel + ".preview.test:8443/"},
	} {
		d, err := parsePreviewDomain(c.in)
		if err != nil {
			t.Errorf("%q: %v", c.in, err)
			continue
		}
		if got := d.url(previewSandbox, 3000, "host:8080"); got != c.url {
			t.Errorf("%q: url %q, want %q", c.in, got, c.url)
		}
	}
	for _, bad := range []string{"ftp://preview.test", "http://preview.test/path", "https://u@preview.test", "preview.test:0",
		"preview.test:65536", "preview.test:08080", "-preview.test", "preview..test", "pre_view.test", "*.preview.test",
		"preview.test.", "http://", "https://preview.test?x=1", "préview.test"} {
		if _, err := parsePreviewDomain(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestParsePreviewHost(t *testing.T) {
	local, _ := parsePreviewDomain("")
	prod, _ := parsePreviewDomain("preview.example.com")
	for _, c := range []struct {
		d         previewDomain
		host      string
		id        string
		port      int
		under, ok bool
	}{
		{local, "3000-" + previewLabel + ".localhost:8080", previewSandbox, 3000, true, true},
		{local, "3000-" + previewLabel + ".localhost", previewSandbox, 3000, true, true},
		{local, "3000-" + strings.ToUpper(previewLabel) + ".LOCALHOST:8080", previewSandbox, 3000, true, true},
		{local, "1-" + previewLabel + ".localhost", previewSandbox, 1, true, true},
		{local, "65535-" + previewLabel + ".localhost", previewSandbox, 65535, true, true},
		{prod, "443-" + previewLabel + ".preview.example.com", previewSandbox, 443, true, true},
		// The API's and the console's hosts are not previews.
		{local, "localhost:8080", "", 0, false, false},
		{local, "127.0.0.1:8080", "", 0, false, false},
		{local, "[::1]:8080", "", 0, false, false},
		{prod, "emberbox.example.com", "", 0, false, false},
		{prod, "3000-" + previewLabel + ".example.com", "", 0, false, false},
		{prod, "3000-" + previewLabel + ".evilpreview.example.com", "", 0, false, false},
		// Below the domain but not exactly a preview: refused, never the API.
		{local, "x.localhost:8080", "", 0, true, false},
		{local, ".localhost", "", 0, true, false},
		{local, "3000-" + previewLabel + ".localhost.:8080", "", 0, true, false},
		{local, "a.3000-" + previewLabel + ".localhost", "", 0, true, false},
		{local, "0-" + previewLabel + ".localhost", "", 0, true, false},
		{local, "03000-" + previewLabel + ".localhost", "", 0, true, false},
		{local, "65536-" + previewLabel + ".localhost", "", 0, true, false},
		{local, "+3000-" + previewLabel + ".localhost", "", 0, true, false},
		{local, "3000" + previewLabel + ".localhost", "", 0, true, false},
		{local, "3000--" + previewLabel + ".localhost", "", 0, true, false},
		{local, "3000-sbx_0123.localhost", "", 0, true, false},
		// The id's "sbx_" is left out of host names: written in, refused.
		{local, "3000-" + previewSandbox + ".localhost", "", 0, true, false},
		{local, "3000-sbx_" + previewSandbox + ".localhost", "", 0, true, false},
		{local, "3000-" + previewLabel + "0.localhost", "", 0, true, false},
		{local, "3000-pv0123456789abcdef0123456789abcdef.localhost", "", 0, true, false},
		{local, "3000-" + previewLabel + ".localhost:80x", "", 0, true, false},
		{local, "3000-" + previewLabel + ".localhost:8080:1", "", 0, true, false},
		{prod, "3000-" + previewLabel + ".a.preview.example.com", "", 0, true, false},
	} {
		id, port, under, ok := c.d.parseHost(c.host)
		if id != c.id || port != c.port || under != c.under || ok != c.ok {
			t.Errorf("%q under %s: (%q, %d, %v, %v), want (%q, %d, %v, %v)", c.host, c.d.name, id, port, under, ok, c.id, c.port, c.under, c.ok)
		}
	}
}

// FuzzPreviewHost: a host is a preview's only if it is exactly
// <port>-<id>.<domain>, which the URL of that preview names again.
func FuzzPreviewHost(f *testing.F) {
	for _, s := range []string{"3000-" + previewLabel + ".localhost:8080", "localhost:8080", "x.localhost", "[::1]:80",
		"3000-" + previewLabel + ".localhost.", "0-sbx_.localhost", "65535-" + previewLabel + ".LOCALHOST"} {
		f.Add(s)
	}
	d, _ := parsePreviewDomain("")
	f.Fuzz(func(t *testing.T, host string) {
		id, port, under, ok := d.parseHost(host)
		if !ok {
			if id != "" || port != 0 {
				t.Fatalf("%q: refused but named (%q, %d)", host, id, port)
			}
			return
		}
		if !under || !sandbox.ValidID(id) || port < 1 || port > 65535 {
			t.Fatalf("%q: accepted as (%q, %d, under %v)", host, id, port, under)
		}
		name, _, _ := strings.Cut(strings.ToLower(host), ":")
		if want := strconv.Itoa(port) + "-" + hostLabelID(id) + "." + d.name; name != want {
			t.Fatalf("%q: accepted as %q", host, want)
		}
		if got := strings.TrimSuffix(strings.TrimPrefix(d.url(id, port, host), "http://"), "/"); !strings.EqualFold(got, host) {
			t.Fatalf("%q: its URL names %q", host, got)
		}
	})
}
