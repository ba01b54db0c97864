package e2b

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strings"
)

// Tokens makes and checks a sandbox's access tokens. A token names the
// sandbox's owner and carries an HMAC over purpose, sandbox and owner under
// a server key, so nothing is stored: the router learns from the token
// alone whose sandbox a request may reach, and a token of one sandbox (or
// purpose) opens no other. They last as long as the sandbox and the key.
type Tokens struct{ key []byte }

// Purposes of tokens: envd's X-Access-Token, and the traffic token the
// SDKs send to every other port (E2B-Traffic-Access-Token).
const (
	purposeEnvd    = "envd"
	purposeTraffic = "traffic"
)

const tokenPrefix = "e2b1."

// NewTokens returns Tokens under key (at least 32 bytes).
func NewTokens(key []byte) (*Tokens, error) {
	if len(key) < 32 {
		return nil, errors.New("e2b: token key shorter than 32 bytes")
	}
	return &Tokens{key: append([]byte(nil), key...)}, nil
}

func (t *Tokens) mac(purpose, sandboxID, owner string) []byte {
	h := hmac.New(sha256.New, t.key)
	h.Write([]byte("emberbox-e2b-token\x00" + purpose + "\x00" + sandboxID + "\x00" + owner))
	return h.Sum(nil)
}

// Make returns the token of purpose for owner's sandbox.
func (t *Tokens) Make(purpose, sandboxID, owner string) string {
	enc := base64.RawURLEncoding
	return tokenPrefix + enc.EncodeToString([]byte(owner)) + "." + enc.EncodeToString(t.mac(purpose, sandboxID, owner))
}

// Open checks tok as a token of purpose for sandboxID and returns the owner
// it names.
func (t *Tokens) Open(purpose, sandboxID, tok string) (owner string, ok bool) {
	rest, found := strings.CutPrefix(tok, tokenPrefix)
	if !found || len(rest) > 512 {
		return "", false
	}
	o, m, found := strings.Cut(rest, ".")
	if !found {
		return "", false
	}
	enc := base64.RawURLEncoding
	ob, err1 := enc.DecodeString(o)
	mb, err2 := enc.DecodeString(m)
	if err1 != nil || err2 != nil || len(ob) == 0 {
		return "", false
	}
	if !hmac.Equal(mb, t.mac(purpose, sandboxID, string(ob))) {
		return "", false
	}
	return string(ob), true
}
