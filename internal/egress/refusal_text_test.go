package egress

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
)

// What a guest is told of a failed dial never names the host's resolver or
// the address a name resolved to.
func TestDialFailureText(t *testing.T) {
	errs := []error{
		fmt.Errorf("resolving x.test: %w", &net.DNSError{Err: "no such host", Name: "x.test", Server: "10.0.0.2:53", IsNotFound: true}),
		fmt.Errorf("resolving x.test: %w", &net.DNSError{Err: "server misbehaving", Name: "x.test", Server: "10.0.0.2:53"}),
		&net.OpError{Op: "dial", Net: "tcp", Addr: &net.TCPAddr{IP: net.IPv4(93, 184, 215, 14), Port: 443}, Err: syscall.ECONNREFUSED},
		&net.OpError{Op: "dial", Net: "tcp", Addr: &net.TCPAddr{IP: net.IPv4(93, 184, 215, 14), Port: 443}, Err: context.DeadlineExceeded},
		errors.New("no addresses for 93.184.215.14"),
	}
	for _, err := range errs {
		var b bytes.Buffer
		writeRefusal(&b, err)
		if s := b.String(); strings.Contains(s, "10.0.0.2") || strings.Contains(s, "93.184") || !strings.Contains(s, "502") {
			t.Errorf("%v answered:\n%s", err, s)
		}
	}
}
