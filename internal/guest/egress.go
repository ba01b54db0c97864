package guest

import (
	"bufio"
	"context"
	"errors"
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

// MaxGuestStreams bounds the streams the guest may hold open at once (each
// costs a goroutine and buffers on the host); a stream opened beyond it is
// closed at once.
const MaxGuestStreams = 256

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
	sem := make(chan struct{}, MaxGuestStreams)
	go func() {
		defer cancel()
		for {
			st, err := c.sess.AcceptStream()
			if err != nil {
				return
			}
			select {
			case sem <- struct{}{}:
			default:
				// Too many: refuse this one outright. Close alone only
				// half-closes a yamux stream; the past deadline ends it.
				_ = st.SetDeadline(time.Unix(1, 0))
				st.Close()
				continue
			}
			go func() {
				defer func() { <-sem }()
				defer st.Close()
				serveGuestStream(ctx, h, st)
			}()
		}
	}()
}

// serveGuestStream reads the first frame of a guest-opened stream and
// hands the rest of the stream to h as the method says.
func serveGuestStream(ctx context.Context, h EgressHandler, st *yamux.Stream) {
	fc := agentproto.NewConn(st)
	_ = st.SetReadDeadline(time.Now().Add(guestRequestTimeout))
	var req agentproto.Request
	if err := fc.ReadJSONMax(&req, maxGuestRequest); err != nil {
		return
	}
	_ = st.SetReadDeadline(time.Time{})
	switch req.Method {
	case agentproto.MethodEgressProxy:
		h.ServeProxy(ctx, st, fc.Reader())
	case agentproto.MethodEgressDNS:
		_ = st.SetDeadline(time.Now().Add(dnsTimeout))
		kind, q, err := fc.ReadFrameMax(MaxDNSMessage)
		if err != nil || kind != agentproto.KindData {
			return
		}
		_ = fc.WriteFrame(agentproto.KindData, h.AnswerDNS(ctx, q))
	case agentproto.MethodEgressTCP:
		dst, ok := egressDst(req.Egress)
		if !ok {
			_ = fc.WriteJSON(agentproto.Reply{Error: &agentproto.Error{Code: agentproto.CodeInvalid, Message: "egress.tcp: bad address"}})
			return
		}
		h.ServeTCP(ctx, dst, st, fc.Reader(), func(err error) error {
			return fc.WriteJSON(acceptReply(err))
		})
	default:
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
