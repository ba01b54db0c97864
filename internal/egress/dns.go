package egress

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// dnsTTL is the TTL of answers: short, so a policy change is soon seen by
// caches in the guest.
const dnsTTL = 30

// AnswerDNS answers one DNS query (a message as sent over UDP) for the
// sandbox. A and AAAA questions for names the policy admits are resolved
// on the host and answered with the addresses the policy admits; refused
// names get NXDOMAIN, and everything gets REFUSED while internet is off.
// Other question types get an empty answer. It never returns nil for a
// query it could parse; a query it cannot parse gets nil (dropped).
func (g *Gate) AnswerDNS(ctx context.Context, query []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil || h.Response {
		return nil
	}
	q, err := p.Question()
	if err != nil {
		return nil
	}
	resp := dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	finish := func(rc dnsmessage.RCode, answers func(*dnsmessage.Builder) error) []byte {
		return dnsReply(resp, q, rc, answers)
	}
	if h.OpCode != 0 || q.Class != dnsmessage.ClassINET {
		return finish(dnsmessage.RCodeNotImplemented, nil)
	}
	pol, _ := g.Policy()
	if !pol.Internet {
		g.refuse(&Refusal{ReasonInternetOff, q.Name.String()})
		return finish(dnsmessage.RCodeRefused, nil)
	}
	name := normalizeHost(q.Name.String())
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	addrs, err := g.Resolve(ctx, name)
	if err != nil {
		return finish(resolveRCode(err), nil)
	}
	rh := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: dnsTTL}
	// A name is answered with its stand-in address (IPv4 only): whoever
	// connects to it, through the proxy or not, reaches the gate, which
	// dials the name again on the host. An IP literal asked as a name is
	// answered as itself.
	if _, err := netip.ParseAddr(name); err != nil {
		fake, ok := g.fakeAddr(name)
		if !ok {
			return finish(dnsmessage.RCodeServerFailure, nil)
		}
		addrs = []netip.Addr{fake}
	}
	return finish(dnsmessage.RCodeSuccess, addressAnswers(q.Type, rh, addrs))
}

// dnsReply is the answer to question q with header resp, code rc and the
// records answers writes (none if nil); nil if it cannot be built.
func dnsReply(resp dnsmessage.Header, q dnsmessage.Question, rc dnsmessage.RCode, answers func(*dnsmessage.Builder) error) []byte {
	hdr := resp
	hdr.RCode = rc
	b := dnsmessage.NewBuilder(make([]byte, 0, 512), hdr)
	b.EnableCompression()
	if b.StartQuestions() != nil || b.Question(q) != nil {
		return nil
	}
	if answers != nil {
		if b.StartAnswers() != nil || answers(&b) != nil {
			return nil
		}
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}

// resolveRCode is the answer to a name that did not resolve: NXDOMAIN if
// the policy refused it or it does not exist, SERVFAIL otherwise.
func resolveRCode(err error) dnsmessage.RCode {
	if _, ok := AsRefusal(err); ok {
		return dnsmessage.RCodeNameError
	}
	var de *net.DNSError
	if errors.As(err, &de) && de.IsNotFound {
		return dnsmessage.RCodeNameError
	}
	return dnsmessage.RCodeServerFailure
}

// addressAnswers writes the records of addrs that answer a question of
// type qt: A for IPv4 addresses, AAAA for IPv6 ones.
func addressAnswers(qt dnsmessage.Type, rh dnsmessage.ResourceHeader, addrs []netip.Addr) func(*dnsmessage.Builder) error {
	return func(b *dnsmessage.Builder) error {
		for _, a := range addrs {
			switch {
			case qt == dnsmessage.TypeA && a.Is4():
				if err := b.AResource(rh, dnsmessage.AResource{A: a.As4()}); err != nil {
					return err
				}
			case qt == dnsmessage.TypeAAAA && a.Is6():
				if err := b.AAAAResource(rh, dnsmessage.AAAAResource{AAAA: a.As16()}); err != nil {
					return err
				}
			}
		}
		return nil
	}
}
