package api

import (
	"net/http"
	"strings"
)

// credentialHeaders are the headers that carry a credential of ours: API
// keys (ours in Authorization, E2B's clients' in X-API-Key), E2B's access
// and traffic tokens, and preview tokens.
var credentialHeaders = []string{
	"Authorization", "X-Api-Key", "X-Access-Token", "E2b-Traffic-Access-Token", previewTokenHeader,
}

// StripCredentials removes from a request about to be proxied to a guest
// every credential of ours it carries, whoever it belongs to: a guest is
// its tenant's code, or another tenant's, and must never learn a key or a
// token. It removes the headers above, the preview token's query parameter
// and cookie, and the API key a browser offers as a WebSocket subprotocol
// (other subprotocols are the guest's and stay).
func StripCredentials(out *http.Request) {
	for _, h := range credentialHeaders {
		out.Header.Del(h)
	}
	if q := out.URL.Query(); q.Has(previewTokenQuery) {
		q.Del(previewTokenQuery)
		out.URL.RawQuery = q.Encode()
	}
	stripCookie(out, previewCookie)
	stripKeySubprotocol(out.Header)
}

// stripCookie removes the cookies named name, keeping the others.
func stripCookie(out *http.Request, name string) {
	cookies := out.Cookies()
	if len(cookies) == 0 {
		return
	}
	out.Header.Del("Cookie")
	for _, c := range cookies {
		if c.Name != name {
			out.AddCookie(c)
		}
	}
}

// stripKeySubprotocol removes the key subprotocols (websocket_auth.go) from
// Sec-WebSocket-Protocol.
func stripKeySubprotocol(h http.Header) {
	values := h.Values("Sec-WebSocket-Protocol")
	if len(values) == 0 {
		return
	}
	var keep []string
	for _, v := range values {
		for p := range strings.SplitSeq(v, ",") {
			if p = strings.TrimSpace(p); p != "" && !strings.HasPrefix(strings.ToLower(p), wsKeyPrefix) {
				keep = append(keep, p)
			}
		}
	}
	h.Del("Sec-WebSocket-Protocol")
	if len(keep) > 0 {
		h.Set("Sec-WebSocket-Protocol", strings.Join(keep, ", "))
	}
}
