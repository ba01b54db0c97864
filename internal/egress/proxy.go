package egress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Header is the response header that names the reason of a refusal.
const Header = "X-Emberbox-Egress"

// MaxHeaderBytes bounds the header block of a request the proxy reads from
// the sandbox and of a response it reads from upstream (http.ReadRequest and
// http.ReadResponse impose no limit of their own).
const MaxHeaderBytes = 64 << 10

// headerReader is a bufio.Reader over a limit that is MaxHeaderBytes while
// a header block is read and lifted for the body.
type headerReader struct {
	*bufio.Reader
	lr io.LimitedReader
}

func newHeaderReader(r io.Reader) *headerReader {
	h := &headerReader{lr: io.LimitedReader{R: r, N: math.MaxInt64}}
	h.Reader = bufio.NewReader(&h.lr)
	return h
}

// headers bounds what the next reads take from the source to
// MaxHeaderBytes (plus what the buffer already holds).
func (h *headerReader) headers() { h.lr.N = MaxHeaderBytes }

// body lifts the bound; it reports whether the bound was reached while
// reading headers (which, if the read failed, is why).
func (h *headerReader) body() (exceeded bool) {
	exceeded = h.lr.N <= 0
	h.lr.N = math.MaxInt64
	return exceeded
}

// ServeProxy serves one client connection of the guest's HTTP proxy: plain
// HTTP requests in absolute form (forwarded, keep-alive kept) and CONNECT
// tunnels. Refusals are answered at once with 403 and the reason in Header.
// br, if not nil, holds bytes already read from c and is read instead of c.
func (g *Gate) ServeProxy(ctx context.Context, c net.Conn, br *bufio.Reader) {
	defer c.Close()
	var src io.Reader = c
	if br != nil {
		src = br
	}
	pc := &proxyClient{g: g, c: c, hr: newHeaderReader(src)}
	defer pc.closeUpstream()
	for {
		req, ok := pc.readRequest()
		if !ok {
			return
		}
		if req.Method == http.MethodConnect {
			pc.tunnel(ctx, req)
			return
		}
		if !pc.forward(ctx, req) {
			return
		}
	}
}

// A proxyClient is one client connection of the proxy, and the upstream
// its plain HTTP requests go to, reused while the target is the same.
type proxyClient struct {
	g  *Gate
	c  net.Conn
	hr *headerReader

	up       net.Conn
	upTarget string
	upReader *headerReader
}

func (p *proxyClient) closeUpstream() {
	if p.up != nil {
		p.up.Close()
	}
}

// readRequest reads the client's next request, answering one too large or
// malformed; ok is false when the connection is done.
func (p *proxyClient) readRequest() (req *http.Request, ok bool) {
	c := p.c
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Minute))
	p.hr.headers()
	req, err := http.ReadRequest(p.hr.Reader)
	if p.hr.body() && err != nil {
		writeStatus(c, http.StatusRequestHeaderFieldsTooLarge, "", fmt.Sprintf("request header larger than %d bytes", MaxHeaderBytes))
		return nil, false
	}
	if err != nil {
		if err != io.EOF {
			writeStatus(c, http.StatusBadRequest, "", "bad proxy request")
		}
		return nil, false
	}
	_ = c.SetReadDeadline(time.Time{})
	return req, true
}

// tunnel serves a CONNECT: the connection becomes a pipe to the target,
// or, for a host whose TLS the gate terminates, is served by intercept.
func (p *proxyClient) tunnel(ctx context.Context, req *http.Request) {
	c := p.c
	host, port, err := splitTarget(req.Host, 443)
	if err != nil {
		writeStatus(c, http.StatusBadRequest, "", err.Error())
		return
	}
	nc, err := p.g.Dial(ctx, host, port)
	if err != nil {
		writeRefusal(c, err)
		return
	}
	tie(nc, func() { c.Close() })
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		nc.Close()
		return
	}
	if host := interceptHost(nc, true); host != "" {
		if ic := p.g.interception(host, port); ic != nil {
			p.g.intercept(ctx, ic, host, port, &readerConn{c, p.hr.Reader}, nc)
			return
		}
	}
	pipe(c, p.hr.Reader, nc)
}

// forward sends a plain HTTP request upstream and its response back, and
// says whether the connection may carry another request.
func (p *proxyClient) forward(ctx context.Context, req *http.Request) bool {
	c := p.c
	if req.URL.Scheme != "http" || req.URL.Host == "" {
		writeStatus(c, http.StatusBadRequest, "", "this proxy takes absolute http:// URLs and CONNECT")
		return false
	}
	host, port, err := splitTarget(req.URL.Host, 80)
	if err != nil {
		writeStatus(c, http.StatusBadRequest, "", err.Error())
		return false
	}
	target := net.JoinHostPort(host, strconv.Itoa(port))
	if p.up == nil || p.upTarget != target {
		if err := p.dialUpstream(ctx, host, port, target); err != nil {
			writeRefusal(c, err)
			if req.Body != nil {
				req.Body.Close()
			}
			_, refused := AsRefusal(err)
			return refused && !req.Close // the client may ask for something else
		}
	}
	for _, h := range []string{"Proxy-Connection", "Proxy-Authorization", "Proxy-Authenticate"} {
		req.Header.Del(h)
	}
	req.RequestURI = ""
	if err := req.Write(p.up); err != nil {
		return false
	}
	p.upReader.headers()
	resp, err := http.ReadResponse(p.upReader.Reader, req)
	if p.upReader.body() && err != nil {
		writeStatus(c, http.StatusBadGateway, "", fmt.Sprintf("upstream: response header larger than %d bytes", MaxHeaderBytes))
		return false
	}
	if err != nil {
		writeStatus(c, http.StatusBadGateway, "", "upstream: bad response")
		return false
	}
	err = resp.Write(c)
	resp.Body.Close()
	return err == nil && !resp.Close && !req.Close
}

// dialUpstream replaces the upstream with a connection to target.
func (p *proxyClient) dialUpstream(ctx context.Context, host string, port int, target string) error {
	if p.up != nil {
		p.up.Close()
	}
	p.up = nil
	nc, err := p.g.Dial(ctx, host, port)
	if err != nil {
		return err
	}
	c := p.c
	tie(nc, func() { c.Close() })
	p.up, p.upTarget, p.upReader = nc, target, newHeaderReader(nc)
	return nil
}

// ServeTCP serves one connection the guest captured from a program that
// ignored the proxy: it was going to dst (an address, possibly a stand-in
// from FakeRange). accept is called once with the outcome of the dial (nil,
// or the error: a *Refusal if refused) before any byte is relayed; if it
// returns an error, or the dial failed, c is closed. A connection to a
// stand-in of a host whose TLS the gate terminates is served by intercept;
// one to an address the guest did not have from the gate's DNS never is.
func (g *Gate) ServeTCP(ctx context.Context, dst netip.AddrPort, c net.Conn, br *bufio.Reader, accept func(error) error) {
	defer c.Close()
	if br == nil {
		br = bufio.NewReader(c)
	}
	nc, err := g.Dial(ctx, dst.Addr().String(), int(dst.Port()))
	if aerr := accept(err); err != nil || aerr != nil {
		if nc != nil {
			nc.Close()
		}
		return
	}
	port := int(dst.Port())
	if host := interceptHost(nc, false); host != "" {
		if ic := g.interception(host, port); ic != nil {
			g.intercept(ctx, ic, host, port, &readerConn{c, br}, nc)
			return
		}
	}
	pipe(c, br, nc)
}

// pipe copies both ways until either side ends, then closes both.
func pipe(c net.Conn, br *bufio.Reader, up net.Conn) {
	var once sync.Once
	done := func() { once.Do(func() { c.Close(); up.Close() }) }
	go func() {
		defer done()
		_, _ = br.WriteTo(up)
	}()
	_, _ = io.Copy(c, up)
	done()
}

func splitTarget(hostport string, defPort int) (string, int, error) {
	host, ps, err := net.SplitHostPort(hostport)
	if err != nil {
		// An empty host would be handed to the resolver.
		// Brackets are only the ones around an IPv6 address, and zones are
		// never valid targets.
		if h := strings.Trim(hostport, "[]"); h != "" && !strings.ContainsAny(h, "[]%") && strings.Contains(err.Error(), "missing port") {
			return h, defPort, nil
		}
		return "", 0, fmt.Errorf("bad target %q", hostport)
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port <= 0 || port > 65535 || host == "" {
		return "", 0, fmt.Errorf("bad target %q", hostport)
	}
	return host, port, nil
}

// writeRefusal answers a failed dial. A refusal names the target as the
// guest asked for it; any other failure says only what kind it was, as its
// text would name the host's resolver or the real address behind a name.
func writeRefusal(w io.Writer, err error) {
	if r, ok := AsRefusal(err); ok {
		writeStatus(w, http.StatusForbidden, r.Reason, r.Error())
		return
	}
	writeStatus(w, http.StatusBadGateway, "", dialFailure(err))
}

// dialFailure is what a guest is told of a dial that failed.
func dialFailure(err error) string {
	var de *net.DNSError
	switch {
	case errors.As(err, &de) && de.IsNotFound:
		return "no such host"
	case errors.As(err, &de):
		return "name resolution failed"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return "connection timed out"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	}
	return "connection failed"
}

func writeStatus(w io.Writer, code int, reason Reason, msg string) {
	body := msg + "\n"
	var hdr string
	if reason != "" {
		hdr = Header + ": " + string(reason) + "\r\n"
	}
	fmt.Fprintf(w, "HTTP/1.1 %d %s\r\n%sContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n\r\n%s",
		code, http.StatusText(code), hdr, len(body), body)
}
