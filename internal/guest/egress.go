package guest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/emberbox/emberbox/internal/agentproto"
)

// EgressHandler serves the streams a guest opens for its network (see
// internal/egress). The client decodes the protocol, so a handler sees only
// connections, DNS messages and checked destinations. Each method runs on a
// goroutine of its own; ctx ends when the session does.
type EgressHandler interface {
	// ServeProxy serves one connection to the guest's HTTP proxy port. br
	// holds bytes already read from c and must be read instead of c. c is
	// closed when ServeProxy returns.
	ServeProxy(ctx context.Context, c net.Conn, br *bufio.Reader)

	// AnswerDNS answers one DNS message (as sent over UDP, at most
	// MaxDNSMessage bytes); nil means no answer.
	AnswerDNS(ctx context.Context, query []byte) []byte

	// ServeTCP serves a connection a guest program opened to dst without
	// the proxy. Before relaying any byte it calls accept once with nil, or
	// with why there is no connection (a *RefusedError if the policy
	// refuses dst); an error from accept means the guest is gone. br and c
	// are as for ServeProxy.
	ServeTCP(ctx context.Context, dst netip.AddrPort, c net.Conn, br *bufio.Reader, accept func(error) error)
}

// RefusedError is what an EgressHandler passes to accept for a destination
// its policy refuses. Reason is sent to the guest.
type RefusedError struct {
	Reason string
}

func (e *RefusedError) Error() string { return "egress refused: " + e.Reason }

// Budgets of the streams a guest opens (egress). yamux buffers what the
// guest sends on a stream until the host reads it, up to the stream's
// window, so the host's memory for a guest's streams is bounded by the
// number of streams it keeps times the window:
//
//   - at most MaxGuestStreams are served at once; one opened beyond that
//     is refused;
//   - a stream the host has finished with stays in yamux until the guest
//     closes its side too, or until sessionCloseTimeout has passed; such
//     streams count against maxHeldGuestStreams, and while that many are
//     held the host accepts no new stream (they wait in yamux's backlog of
//     acceptBacklog, beyond which yamux resets them itself);
//   - the window is yamux's initial 256 KiB and never grows (MaxWindow).
//
// So a guest's streams hold at most (maxHeldGuestStreams + acceptBacklog)
// × MaxWindow = GuestStreamBytes of the host's memory at once.
const (
	MaxGuestStreams     = 128
	maxHeldGuestStreams = 192
	acceptBacklog       = 64
	// MaxWindow is the receive window of every stream, host calls too.
	MaxWindow = 256 << 10
	// GuestStreamBytes is the byte budget above.
	GuestStreamBytes = (maxHeldGuestStreams + acceptBacklog) * MaxWindow
	// maxDNSInFlight bounds the DNS exchanges the host makes for one guest
	// at once; more wait for their turn.
	maxDNSInFlight = 32
	// maxDrain bounds what the host reads and discards from a finished
	// stream while it waits for the guest to close it.
	maxDrain = 1 << 20
)

// MaxDNSMessage bounds a DNS query from the guest: no DNS message is longer
// (TCP carries their length in 16 bits).
const MaxDNSMessage = 65535

const (
	// maxGuestRequest bounds the first frame of a guest-opened stream: it
	// names a destination, so it is small.
	maxGuestRequest = 64 << 10
	// guestRequestTimeout bounds the wait for that first frame.
	guestRequestTimeout = 30 * time.Second
	// dnsTimeout bounds one DNS exchange, query to answer.
	dnsTimeout = 20 * time.Second
)

// ServeGuestStreams accepts the streams the guest opens (egress), decodes
// them and serves each with h, until the session ends.
func (c *Client) ServeGuestStreams(h EgressHandler) {
	ctx, cancel := context.WithCancel(context.Background())
	open := make(chan struct{}, MaxGuestStreams)
	held := make(chan struct{}, maxHeldGuestStreams)
	dns := make(chan struct{}, maxDNSInFlight)
	go func() {
		defer cancel()
		for {
			// Waiting here for a held stream to go leaves new ones in
			// yamux's bounded backlog.
			select {
			case held <- struct{}{}:
			case <-c.sess.CloseChan():
				return
			}
			st, err := c.sess.AcceptStream()
			if err != nil {
				return
			}
			select {
			case open <- struct{}{}:
			default:
				// Too many at once: refuse this one. That is the guest's
				// load, not a violation.
				go release(st, held)
				continue
			}
			go func() {
				defer release(st, held)
				defer func() { <-open }()
				c.serveGuestStream(ctx, h, st, dns)
			}()
		}
	}()
}

// release closes a stream the host has finished with and frees its place
// in held once yamux has let go of it: at once if the guest closes its
// side within sessionCloseTimeout (what is sent meanwhile is discarded),
// else when yamux resets it at that timeout.
func release(st *yamux.Stream, held chan struct{}) {
	defer func() { <-held }()
	closed := time.Now()
	_ = st.Close()
	_ = st.SetDeadline(closed.Add(sessionCloseTimeout))
	_, err := io.CopyN(io.Discard, st, maxDrain)
	if errors.Is(err, io.EOF) || errors.Is(err, yamux.ErrConnectionReset) {
		return // the guest closed its side (or reset the stream): it is gone
	}
	time.Sleep(time.Until(closed.Add(sessionCloseTimeout + 100*time.Millisecond)))
}

// serveGuestStream reads the first frame of a guest-opened stream and
// hands the rest of the stream to h as the method says. Frames that break
// the protocol are violations.
func (c *Client) serveGuestStream(ctx context.Context, h EgressHandler, st *yamux.Stream, dns chan struct{}) {
	fc := agentproto.NewConn(st)
	_ = st.SetReadDeadline(time.Now().Add(guestRequestTimeout))
	var req agentproto.Request
	kind, p, err := fc.ReadFrameMax(maxGuestRequest)
	if errors.Is(err, agentproto.ErrFrameTooLarge) || errors.Is(err, agentproto.ErrUnknownKind) ||
		(err == nil && (kind != agentproto.KindJSON || checkShape(p, "", 0) != nil || json.Unmarshal(p, &req) != nil)) {
		c.violation("guest stream", "first frame is not a request of at most %d bytes", maxGuestRequest)
		return
	}
	if err != nil {
		return // the guest gave up on it, or took too long
	}
	_ = st.SetReadDeadline(time.Time{})
	switch req.Method {
	case agentproto.MethodEgressProxy:
		h.ServeProxy(ctx, st, fc.Reader())
	case agentproto.MethodEgressDNS:
		_ = st.SetDeadline(time.Now().Add(dnsTimeout))
		kind, q, err := fc.ReadFrameMax(MaxDNSMessage)
		switch {
		case errors.Is(err, agentproto.ErrFrameTooLarge):
			c.violation(req.Method, "query over %d bytes", MaxDNSMessage)
			return
		case err != nil:
			return
		case kind != agentproto.KindData:
			c.violation(req.Method, "query is not a data frame")
			return
		}
		t := time.NewTimer(dnsTimeout)
		select {
		case dns <- struct{}{}:
			t.Stop()
		case <-t.C:
			return
		case <-ctx.Done():
			return
		}
		a := h.AnswerDNS(ctx, q)
		<-dns
		_ = fc.WriteFrame(agentproto.KindData, a)
	case agentproto.MethodEgressTCP:
		dst, ok := egressDst(req.Egress)
		if !ok {
			c.violation(req.Method, "bad destination address")
			_ = fc.WriteJSON(agentproto.Reply{Error: &agentproto.Error{Code: agentproto.CodeInvalid, Message: "egress.tcp: bad address"}})
			return
		}
		h.ServeTCP(ctx, dst, st, fc.Reader(), func(err error) error {
			return fc.WriteJSON(acceptReply(err))
		})
	case agentproto.MethodVolumeNBD:
		if !serveVolume(ctx, h, fc, st, &req) {
			c.violation(req.Method, "no attachment named")
		}
	default:
		c.violation("guest stream", "unknown method")
		_ = fc.WriteJSON(agentproto.Reply{Error: &agentproto.Error{Code: agentproto.CodeUnknownMethod, Message: "unknown stream method"}})
	}
}

// egressDst parses the destination of a captured connection: an IP address
// without a zone (which would name a host interface) and a port.
func egressDst(req *agentproto.EgressRequest) (netip.AddrPort, bool) {
	if req == nil {
		return netip.AddrPort{}, false
	}
	dst, err := netip.ParseAddrPort(req.Addr)
	if err != nil || dst.Addr().Zone() != "" || dst.Port() == 0 {
		return netip.AddrPort{}, false
	}
	return dst, true
}

// acceptReply is the guest's answer to the outcome of a captured
// connection. A failure says only that it failed: its text could name the
// real address behind a name, which the guest never learns.
func acceptReply(err error) agentproto.Reply {
	if err == nil {
		return agentproto.Reply{OK: true}
	}
	var r *RefusedError
	if errors.As(err, &r) {
		return agentproto.Reply{Error: &agentproto.Error{Code: agentproto.CodeEgressRefused, Message: r.Reason}}
	}
	return agentproto.Reply{Error: &agentproto.Error{Code: agentproto.CodeEgressFailed, Message: "connection failed"}}
}
