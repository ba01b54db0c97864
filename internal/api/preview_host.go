package api

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/emberbox/emberbox/internal/sandbox"
)

// Each preview is an origin of its own, <port>-<sandbox id without its
// "sbx_">.<preview domain>, so that nothing a guest's page does (service workers, storage,
// cookies) reaches the API's and the console's origin or another
// preview's.

// defaultPreviewDomain needs no DNS: browsers resolve every name under
// localhost to the loopback address.
const defaultPreviewDomain = "localhost"

// previewDomain is where previews are served. An empty port is the
// scheme's default, or, for the default domain, the port the request
// came in on.
type previewDomain struct {
	scheme string
	name   string // lowercase, no trailing dot
	port   string
	local  bool // the default: localhost on the request's port
}

// PreviewDomainName checks a --preview-domain and returns its domain
// name.
func PreviewDomainName(s string) (string, error) {
	d, err := parsePreviewDomain(s)
	return d.name, err
}

// parsePreviewDomain reads a --preview-domain: a domain name
// (preview.example.com, served over https), or a URL naming the scheme
// and port (http://preview.test:8080). "" is localhost over http.
func parsePreviewDomain(s string) (previewDomain, error) {
	if s == "" {
		return previewDomain{scheme: "http", name: defaultPreviewDomain, local: true}, nil
	}
	d := previewDomain{scheme: "https"}
	host := s
	if strings.Contains(s, "://") {
		var err error
		if d.scheme, host, err = previewDomainURL(s); err != nil {
			return previewDomain{scheme: "https"}, err
		}
	}
	name, port, hasPort := strings.Cut(host, ":")
	if hasPort {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 || port != strconv.Itoa(n) {
			return d, fmt.Errorf("preview domain %q: the port must be 1 to 65535", s)
		}
		if !(d.scheme == "http" && n == 80 || d.scheme == "https" && n == 443) {
			d.port = port
		}
	}
	name = strings.ToLower(name)
	if !validDomainName(name) {
		return d, fmt.Errorf("preview domain %q: %q is not a domain name (letters, digits and hyphens in dot-separated labels)", s, name)
	}
	d.name = name
	return d, nil
}

// previewDomainURL reads the scheme and host of a preview domain given as
// a URL, which must name nothing else.
func previewDomainURL(s string) (scheme, host string, err error) {
	u, err := url.Parse(s)
	if err != nil {
		return "", "", fmt.Errorf("preview domain %q: %w", s, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", "", fmt.Errorf("preview domain %q: the scheme must be http or https", s)
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", "", fmt.Errorf("preview domain %q: only a scheme, a domain and a port, no path", s)
	}
	return u.Scheme, u.Host, nil
}

// validDomainName accepts lowercase LDH labels, dot-separated.
func validDomainName(name string) bool {
	if name == "" || len(name) > 200 {
		return false
	}
	for label := range strings.SplitSeq(name, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

// url is the address of the preview of port of sandbox id; reqHost is
// the Host of the request that asks, whose port the default domain takes.
func (d previewDomain) url(id string, port int, reqHost string) string {
	host := strconv.Itoa(port) + "-" + hostLabelID(id) + "." + d.name
	p := d.port
	if d.local {
		p = hostPort(reqHost)
	}
	if p != "" {
		host += ":" + p
	}
	return d.scheme + "://" + host + "/"
}

// form is the shape of a preview's URL, for hints.
func (d previewDomain) form() string {
	host := "<port>-<sandboxId without sbx_>." + d.name
	if d.port != "" {
		host += ":" + d.port
	} else if d.local {
		host += ":<this server's port>"
	}
	return d.scheme + "://" + host + "/"
}

// hostPort is the port of a Host header, "" if it names none.
func hostPort(host string) string {
	i := strings.LastIndexByte(host, ':')
	if i < 0 || strings.HasSuffix(host, "]") {
		return ""
	}
	return host[i+1:]
}

// parseHost reads a request's Host as a preview's: under says the name is
// below the preview domain at all (nothing but a preview may be served
// there); ok says it is exactly <port>-<sandbox id>.<domain> (the id
// without its "sbx_"; see hostLabelID), with a port
// of 1 to 65535 written without leading zeros and a well-formed sandbox
// id. A port after the name need only be digits: the listener took it.
func (d previewDomain) parseHost(host string) (sandboxID string, port int, under, ok bool) {
	if strings.Contains(host, "]") {
		return "", 0, false, false // an IPv6 literal
	}
	name, portText, hasPort := strings.Cut(host, ":")
	name = strings.ToLower(name)
	trimmed := strings.TrimSuffix(name, ".")
	label, found := strings.CutSuffix(trimmed, "."+d.name)
	if !found {
		return "", 0, false, false
	}
	if trimmed != name || label == "" || strings.Contains(label, ".") {
		return "", 0, true, false
	}
	if hasPort && !digits(portText, 5) {
		return "", 0, true, false
	}
	p, id, found := strings.Cut(label, "-")
	if !found || !digits(p, 5) || p[0] == '0' {
		return "", 0, true, false
	}
	n, _ := strconv.Atoi(p)
	id = sandboxIDPrefix + id
	if n < 1 || n > 65535 || strings.Count(id, "_") != 1 || !sandbox.ValidID(id) {
		return "", 0, true, false
	}
	return id, n, true, true
}

// sandboxIDPrefix starts every sandbox id. A preview's host name leaves it
// out: "_" is not a letter, digit or hyphen, and DNS names, certificates
// and some clients and proxies refuse it (RFC 1123).
const sandboxIDPrefix = "sbx_"

// hostLabelID is sandbox id as a preview's host name carries it.
func hostLabelID(id string) string { return strings.TrimPrefix(id, sandboxIDPrefix) }

// digits reports whether s is 1 to max ASCII digits.
func digits(s string, max int) bool {
	if s == "" || len(s) > max {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
