package agent

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"github.com/emberbox/emberbox/internal/agentproto"
)

// The guest has no network card. Its way out is this relay: an HTTP proxy
// port whose connections are carried, byte for byte, over streams to the
// host, and a DNS resolver whose queries the host answers. The host decides
// everything (internal/egress); the relay only carries bytes, so root in
// the guest gains nothing by changing it.

// Paths the relay and the extra CA certificates use in the guest.
const (
	resolvConf   = "/etc/resolv.conf"
	systemBundle = "/etc/ssl/certs/ca-certificates.crt"
	extraCAFile  = "/usr/local/share/ca-certificates/emberbox-extra.crt"
)

// proxyEnv is added to every command's environment.
var proxyEnv = map[string]string{
	"HTTP_PROXY": "http://" + agentproto.EgressProxyAddr, "HTTPS_PROXY": "http://" + agentproto.EgressProxyAddr,
	"http_proxy": "http://" + agentproto.EgressProxyAddr, "https_proxy": "http://" + agentproto.EgressProxyAddr,
	"NO_PROXY": "localhost,127.0.0.1,::1", "no_proxy": "localhost,127.0.0.1,::1",
	"NODE_USE_ENV_PROXY": "1",
	"SSL_CERT_FILE":      systemBundle, "REQUESTS_CA_BUNDLE": systemBundle, "PIP_CERT": systemBundle,
	"CURL_CA_BUNDLE": systemBundle,
}

// session returns the current host session, or nil.
func (a *Agent) session() *yamux.Session {
	a.sessMu.Lock()
	defer a.sessMu.Unlock()
	return a.sess
}

func (a *Agent) setSession(s *yamux.Session) {
	a.sessMu.Lock()
	a.sess = s
	a.sessMu.Unlock()
}

// openEgress opens a stream to the host and sends the request frame.
func (a *Agent) openEgress(method string) (*yamux.Stream, *agentproto.Conn, error) {
	return a.openEgressReq(agentproto.Request{Method: method})
}

func (a *Agent) openEgressReq(req agentproto.Request) (*yamux.Stream, *agentproto.Conn, error) {
	sess := a.session()
	if sess == nil {
		return nil, nil, errors.New("no host connected")
	}
	st, err := sess.OpenStream()
	if err != nil {
		return nil, nil, err
	}
	fc := agentproto.NewConn(st)
	if err := fc.WriteJSON(req); err != nil {
		st.Close()
		return nil, nil, err
	}
	return st, fc, nil
}

// StartEgressRelay starts the proxy and DNS listeners and points
// /etc/resolv.conf at the resolver.
func (a *Agent) StartEgressRelay() error {
	if err := os.WriteFile(resolvConf, []byte("# emberbox: the host answers; there is no other way out\nnameserver 127.0.0.1\noptions timeout:2 attempts:2\n"), 0o644); err != nil {
		a.log.Warn("writing resolv.conf", "err", err)
	}
	pl, err := net.Listen("tcp", agentproto.EgressProxyAddr)
	if err != nil {
		return fmt.Errorf("egress proxy: %w", err)
	}
	go a.acceptLoop(pl, a.relayProxy)
	ul, err := net.ListenPacket("udp", agentproto.EgressDNSAddr)
	if err != nil {
		return fmt.Errorf("egress dns: %w", err)
	}
	go a.serveDNSUDP(ul)
	tl, err := net.Listen("tcp", agentproto.EgressDNSAddr)
	if err != nil {
		return fmt.Errorf("egress dns: %w", err)
	}
	go a.acceptLoop(tl, a.serveDNSTCP)
	cl, err := net.Listen("tcp", agentproto.EgressTCPAddr)
	if err != nil {
		return fmt.Errorf("egress capture: %w", err)
	}
	go a.acceptLoop(cl, a.relayCaptured)
	if err := a.setupCapture(); err != nil {
		// Without capture, raw connections must still fail at once: with
		// no route but lo's, connect() answers ENETUNREACH.
		a.log.Warn("egress capture unavailable; connections that ignore the proxy fail", "err", err)
		a.teardownCapture()
	}
	a.mu.Lock()
	a.relay = true
	a.mu.Unlock()
	return nil
}

func (a *Agent) acceptLoop(l net.Listener, serve func(net.Conn)) {
	for {
		c, err := l.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			a.log.Warn("egress relay accept", "err", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		go serve(c)
	}
}

// relayProxy carries one proxy connection to the host.
func (a *Agent) relayProxy(c net.Conn) {
	defer c.Close()
	st, _, err := a.openEgress(agentproto.MethodEgressProxy)
	if err != nil {
		writeProxyError(c, err)
		return
	}
	var once sync.Once
	done := func() { once.Do(func() { c.Close(); st.Close() }) }
	go func() {
		defer done()
		_, _ = io.Copy(st, c)
	}()
	_, _ = io.Copy(c, st)
	done()
}

func writeProxyError(w io.Writer, err error) {
	body := "emberbox egress relay: " + err.Error() + "\n"
	fmt.Fprintf(w, "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
}

// dnsExchange sends one query to the host and returns its answer (nil: none).
func (a *Agent) dnsExchange(q []byte) []byte {
	st, fc, err := a.openEgress(agentproto.MethodEgressDNS)
	if err != nil {
		return nil
	}
	defer st.Close()
	_ = st.SetDeadline(time.Now().Add(15 * time.Second))
	if err := fc.WriteFrame(agentproto.KindData, q); err != nil {
		return nil
	}
	kind, p, err := fc.ReadFrame()
	if err != nil || kind != agentproto.KindData || len(p) == 0 {
		return nil
	}
	return p
}

func (a *Agent) serveDNSUDP(pc net.PacketConn) {
	buf := make([]byte, 65535)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		q := bytes.Clone(buf[:n])
		go func() {
			ans := a.dnsExchange(q)
			if ans == nil {
				return
			}
			if len(ans) > 512 {
				ans = truncateDNS(ans)
			}
			_, _ = pc.WriteTo(ans, from)
		}()
	}
}

// truncateDNS keeps the header of an answer too big for UDP, with TC set
// and no records, so the client retries over TCP.
func truncateDNS(ans []byte) []byte {
	if len(ans) < 12 {
		return nil
	}
	h := bytes.Clone(ans[:12])
	h[2] |= 0x02 // TC
	for i := 4; i < 12; i++ {
		h[i] = 0 // no records of any section
	}
	return h
}

func (a *Agent) serveDNSTCP(c net.Conn) {
	defer c.Close()
	for {
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		var l [2]byte
		if _, err := io.ReadFull(c, l[:]); err != nil {
			return
		}
		q := make([]byte, binary.BigEndian.Uint16(l[:]))
		if _, err := io.ReadFull(c, q); err != nil {
			return
		}
		ans := a.dnsExchange(q)
		if ans == nil {
			return
		}
		out := binary.BigEndian.AppendUint16(nil, uint16(len(ans)))
		if _, err := c.Write(append(out, ans...)); err != nil {
			return
		}
	}
}

// The extra CAs are kept between these lines of the system bundle, so
// that a new set (a rotated egress CA) replaces the old one instead of
// joining it.
const (
	caBlockBegin = "# emberbox extra CAs: begin\n"
	caBlockEnd   = "# emberbox extra CAs: end\n"
)

// installCACerts makes the guest trust pem besides its own roots, in
// place of the extra CAs it trusted before: pem is kept in extraCAFile
// (for Node) and between the markers of the system bundle. An empty pem
// changes nothing (a configure that sets none).
func (a *Agent) installCACerts(pem string) error {
	if pem == "" {
		return nil
	}
	return replaceCACerts(pem)
}

// caMu serializes the replacements of the extra CAs.
var caMu sync.Mutex

// replaceCACerts puts pem in place of the extra CAs; "" removes them.
func replaceCACerts(pem string) error {
	caMu.Lock()
	defer caMu.Unlock()
	if pem != "" && !strings.HasSuffix(pem, "\n") {
		pem += "\n"
	}
	prev, _ := os.ReadFile(extraCAFile)
	if err := os.MkdirAll("/usr/local/share/ca-certificates", 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(extraCAFile, []byte(pem), 0o644); err != nil {
		return err
	}
	cur, _ := os.ReadFile(systemBundle)
	next := withCABlock(string(cur), string(prev), pem)
	if next == string(cur) {
		return nil
	}
	if err := os.MkdirAll("/etc/ssl/certs", 0o755); err != nil {
		return err
	}
	tmp := systemBundle + ".emberbox-tmp"
	if err := os.WriteFile(tmp, []byte(next), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, systemBundle)
}

// withCABlock is the system bundle cur with its block of extra CAs
// replaced by pem (none if ""). prev, the extra CAs installed before,
// is taken out of cur where an agent without markers appended it.
func withCABlock(cur, prev, pem string) string {
	if b := strings.Index(cur, caBlockBegin); b >= 0 {
		if e := strings.Index(cur[b:], caBlockEnd); e >= 0 {
			cur = cur[:b] + cur[b+e+len(caBlockEnd):]
		}
	} else if prev != "" {
		cur = strings.Replace(cur, prev, "", 1)
	}
	if pem == "" {
		return cur
	}
	if cur != "" && !strings.HasSuffix(cur, "\n") {
		cur += "\n"
	}
	return cur + caBlockBegin + pem + caBlockEnd
}

// Capture of connections that ignore the proxy variables: a dummy interface
// carries a default route (so connect() does not fail with ENETUNREACH), and
// nftables redirects every outbound TCP connection to the capture port and
// DNS to the resolver, and drops every other packet not for loopback
// (EPERM at once, not a hang). Root in the guest can undo all of this, and
// gains nothing: with no network card, nothing leaves the guest except
// through the host stream.
const (
	captureLink = "emberbox0"
	captureAddr = "198.18.0.1/32" // the source address of captured connections (in the rules too); never seen outside
)

const captureRules = `table ip emberbox {
	chain nat_out {
		type nat hook output priority -100; policy accept;
		ip daddr 127.0.0.0/8 return
		udp dport 53 redirect to :53
		tcp dport 1-65535 redirect to :10801
	}
	chain filter_out {
		type filter hook output priority 0; policy accept;
		ip daddr { 127.0.0.0/8, 198.18.0.1 } accept
		drop
	}
}
`

// sbin finds a system binary; PID 1 has no PATH to search.
func sbin(name string) string {
	for _, d := range []string{"/usr/sbin/", "/usr/bin/", "/sbin/", "/bin/"} {
		if _, err := os.Stat(d + name); err == nil {
			return d + name
		}
	}
	return name
}

func (a *Agent) runQuiet(name string, args ...string) error {
	cmd := exec.Command(sbin(name), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := a.Run(cmd); err != nil {
		return fmt.Errorf("%s %v: %v: %s", name, args, err, bytes.TrimSpace(out.Bytes()))
	}
	return nil
}

func (a *Agent) setupCapture() error {
	nft := exec.Command(sbin("nft"), "-f", "-")
	nft.Stdin = strings.NewReader(captureRules)
	var out bytes.Buffer
	nft.Stdout, nft.Stderr = &out, &out
	if err := a.Run(nft); err != nil {
		return fmt.Errorf("nft: %v: %s", err, bytes.TrimSpace(out.Bytes()))
	}
	for _, args := range [][]string{
		{"link", "add", captureLink, "type", "dummy"},
		{"addr", "add", captureAddr, "dev", captureLink},
		{"link", "set", captureLink, "up"},
		{"route", "add", "default", "dev", captureLink},
	} {
		if err := a.runQuiet("ip", args...); err != nil {
			return err
		}
	}
	return nil
}

func (a *Agent) teardownCapture() {
	_ = a.runQuiet("ip", "link", "del", captureLink)
	_ = a.runQuiet("nft", "delete", "table", "ip", "emberbox")
}

// originalDst returns where a redirected connection was going.
func originalDst(c net.Conn) (netip.AddrPort, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return netip.AddrPort{}, errors.New("not TCP")
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var dst netip.AddrPort
	var serr error
	err = rc.Control(func(fd uintptr) {
		// SO_ORIGINAL_DST fills a sockaddr_in; IPv6Mreq is a 20-byte
		// buffer that holds one.
		m, err := unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
		if err != nil {
			serr = err
			return
		}
		b := m.Multiaddr
		dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]}), binary.BigEndian.Uint16(b[2:4]))
	})
	if err == nil {
		err = serr
	}
	return dst, err
}

// resetClose closes c with a reset, so the program sees ECONNRESET at once.
func resetClose(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

// relayCaptured carries one captured connection to the host, which checks
// where it was going.
func (a *Agent) relayCaptured(c net.Conn) {
	dst, err := originalDst(c)
	if err != nil || dst.Addr().IsLoopback() {
		resetClose(c) // not redirected: someone connected to the port itself
		return
	}
	st, fc, err := a.openEgressReq(agentproto.Request{Method: agentproto.MethodEgressTCP, Egress: &agentproto.EgressRequest{Addr: dst.String()}})
	if err != nil {
		resetClose(c)
		return
	}
	_ = st.SetReadDeadline(time.Now().Add(60 * time.Second))
	var rep agentproto.Reply
	if err := fc.ReadJSON(&rep); err != nil || rep.Error != nil {
		st.Close()
		resetClose(c)
		return
	}
	_ = st.SetReadDeadline(time.Time{})
	var once sync.Once
	done := func() { once.Do(func() { c.Close(); st.Close() }) }
	go func() {
		defer done()
		_, _ = io.Copy(st, c)
	}()
	_, _ = fc.Reader().WriteTo(c)
	done()
}
