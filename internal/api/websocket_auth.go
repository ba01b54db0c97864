package api

import (
	"encoding/base64"
	"net/http"
	"strings"
)

// A browser's WebSocket API can set no header but Sec-WebSocket-Protocol,
// so the web console offers two subprotocols: wsProtocol, which the server
// selects, and wsKeyPrefix followed by the API key in unpadded base64url
// (a header token can carry no other characters). The key so travels in a
// header, as it does in Authorization, never in the URL that access logs
// and browser history keep; the server never echoes it back.
const (
	wsProtocol  = "emberbox.v1"
	wsKeyPrefix = "emberbox.key."
	// maxWSKey bounds the encoded key looked at.
	maxWSKey = 1024
)

// webSocketAccept lists the subprotocols the WebSocket routes select from.
var webSocketAccept = []string{wsProtocol}

// webSocketKey returns the API key a WebSocket handshake offers as a
// subprotocol. Only a GET asking for a WebSocket upgrade may carry one,
// so no other request can be authorized this way.
func webSocketKey(r *http.Request) (string, bool) {
	if r.Method != http.MethodGet || !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		return "", false
	}
	for _, h := range r.Header.Values("Sec-WebSocket-Protocol") {
		for p := range strings.SplitSeq(h, ",") {
			p = strings.TrimSpace(p)
			enc, ok := strings.CutPrefix(p, wsKeyPrefix)
			if !ok || enc == "" || len(enc) > maxWSKey {
				continue
			}
			b, err := base64.RawURLEncoding.DecodeString(enc)
			if err != nil || len(b) == 0 {
				return "", false
			}
			return string(b), true
		}
	}
	return "", false
}
