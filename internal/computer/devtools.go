package computer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/emberbox/emberbox/internal/guest"
)

// errBadAnswer marks a DevTools answer that no browser of ours gives: it
// is not waited out.
var errBadAnswer = errors.New("the browser's DevTools endpoint answered wrongly")

// maxVersionAnswer bounds /json/version's answer (a few hundred bytes).
const maxVersionAnswer = 16 << 10

// debuggerPath is the only form of DevTools path passed on.
var debuggerPath = regexp.MustCompile(`^/devtools/browser/[A-Za-z0-9-]{1,64}$`)

// devtoolsAnswer is /json/version's answer, as far as it is read.
type devtoolsAnswer struct {
	Browser              string `json:"Browser"`
	WebSocketDebuggerURL string `json:"webSocketDebuggerUrl"`
	path                 string
}

// devtoolsVersion asks the guest's DevTools endpoint what browser
// answers and at which WebSocket path. An endpoint not yet listening is
// an error that is not errBadAnswer.
func devtoolsVersion(ctx context.Context, g Guest) (*devtoolsAnswer, error) {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return g.DialPort(ctx, CDPPort)
		},
		DisableKeepAlives:      true,
		MaxResponseHeaderBytes: 16 << 10,
	}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// Chromium answers a Host that is localhost or an address only.
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://localhost:9222/json/version", nil)
	if err != nil {
		return nil, err
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxVersionAnswer+1))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK || len(body) > maxVersionAnswer {
		return nil, fmt.Errorf("%w: status %d, %d bytes", errBadAnswer, resp.StatusCode, len(body))
	}
	return parseVersion(body)
}

// parseVersion checks /json/version's answer: the guest wrote it.
func parseVersion(body []byte) (*devtoolsAnswer, error) {
	var v devtoolsAnswer
	if err := json.Unmarshal(body, &v); err != nil {
		return nil, fmt.Errorf("%w: %v", errBadAnswer, err)
	}
	u, err := url.Parse(v.WebSocketDebuggerURL)
	if err != nil || u.Scheme != "ws" || !debuggerPath.MatchString(u.Path) || u.RawQuery != "" {
		return nil, fmt.Errorf("%w: webSocketDebuggerUrl %q", errBadAnswer, clip(v.WebSocketDebuggerURL, 200))
	}
	v.path = u.Path
	v.Browser = printable(clip(v.Browser, 100))
	return &v, nil
}

// clip cuts s to at most n bytes, at a rune boundary.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n]
}

// printable drops control characters from text the guest wrote.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || r == '\uFFFD' {
			return -1
		}
		return r
	}, s)
}

// tail is the last few KiB of p's output, for an error: the guest wrote
// it.
func tail(ctx context.Context, g Guest, pid string) string {
	const keep = 2 << 10
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	p, err := g.Process(ctx, pid)
	if err != nil {
		return "(its output could not be read)"
	}
	cursor := max(p.FirstOffset, p.OutputBytes-keep)
	var out []byte
	_ = g.ProcessOutput(ctx, guest.ProcessRequest{ID: pid, Cursor: cursor}, func(ev guest.Event) error {
		out = append(out, ev.Data...)
		if len(out) > 2*keep {
			out = out[len(out)-keep:]
		}
		return nil
	})
	if len(out) > keep {
		out = out[len(out)-keep:]
	}
	text := strings.TrimSpace(strings.ToValidUTF8(string(out), "?"))
	if text == "" {
		return fmt.Sprintf("exit %s, no output", exitText(p.ExitCode))
	}
	return fmt.Sprintf("exit %s: %s", exitText(p.ExitCode), text)
}

func exitText(code *int) string {
	if code == nil {
		return "(killed)"
	}
	return fmt.Sprint(*code)
}
