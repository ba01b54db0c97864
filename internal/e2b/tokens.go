package e2b

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strings"
)

// Tokens makes and checks a sandbox's access tokens. A token names the
// sandbox's owner and the generation of the owner's secret it was issued
// under (by a tag), and carries an HMAC over purpose, sandbox, owner and
// tag under a server key. Nothing is stored: the MAC alone refuses a
// forged token, and the key's live generations (Keys.Generations) refuse
// one whose secret was revoked, rotated past its grace, or expired. A
// token of one sandbox (or purpose) opens no other.
type Tokens struct{ key []byte }

// Purposes of tokens: envd's X-Access-Token, and the traffic token the
// SDKs send to every other port (E2B-Traffic-Access-Token).
const (
	purposeEnvd    = "envd"
	purposeTraffic = "traffic"
)

// tokenPrefix names the format; tokens of the earlier format ("e2b1.",
// bound to no generation) are refused.
const tokenPrefix = "e2b2."

// tagLen is the bytes of a generation's tag: enough that no two secrets
// of a key share one.
const tagLen = 16

// NewTokens returns Tokens under key (at least 32 bytes).
func NewTokens(key []byte) (*Tokens, error) {
	if len(key) < 32 {
		return nil, errors.New("e2b: token key shorter than 32 bytes")
	}
	return &Tokens{key: append([]byte(nil), key...)}, nil
}

// tag names a secret's generation in a token without showing it.
func (t *Tokens) tag(generation string) []byte {
	h := hmac.New(sha256.New, t.key)
	h.Write([]byte("emberbox-e2b-generation\x00" + generation))
	return h.Sum(nil)[:tagLen]
}

func (t *Tokens) mac(purpose, sandboxID, owner string, tag []byte) []byte {
	h := hmac.New(sha256.New, t.key)
	h.Write([]byte("emberbox-e2b-token\x00" + purpose + "\x00" + sandboxID + "\x00" + owner + "\x00"))
	h.Write(tag)
	return h.Sum(nil)
}

// Make returns the token of purpose for owner's sandbox, bound to the
// generation of the secret the caller authenticated with.
func (t *Tokens) Make(purpose, sandboxID, owner, generation string) string {
	enc := base64.RawURLEncoding
	tag := t.tag(generation)
	return tokenPrefix + enc.EncodeToString([]byte(owner)) + "." + enc.EncodeToString(tag) + "." +
		enc.EncodeToString(t.mac(purpose, sandboxID, owner, tag))
}

// token is a token whose MAC checked: its owner, and the tag of the
// generation it was issued under, which Current checks.
type token struct {
	owner string
	tag   []byte
}

// Open checks tok's MAC as a token of purpose for sandboxID.
func (t *Tokens) Open(purpose, sandboxID, tok string) (token, bool) {
	rest, found := strings.CutPrefix(tok, tokenPrefix)
	if !found || len(rest) > 512 {
		return token{}, false
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 3 {
		return token{}, false
	}
	enc := base64.RawURLEncoding
	owner, err1 := enc.DecodeString(parts[0])
	tag, err2 := enc.DecodeString(parts[1])
	mac, err3 := enc.DecodeString(parts[2])
	if err1 != nil || err2 != nil || err3 != nil || len(owner) == 0 || len(tag) != tagLen {
		return token{}, false
	}
	// One token, one spelling: the decoder skips \r and \n and ignores
	// the spare bits of a last character, so only the canonical
	// encoding of what was decoded is taken.
	if enc.EncodeToString(owner) != parts[0] || enc.EncodeToString(tag) != parts[1] || enc.EncodeToString(mac) != parts[2] {
		return token{}, false
	}
	if !hmac.Equal(mac, t.mac(purpose, sandboxID, string(owner), tag)) {
		return token{}, false
	}
	return token{owner: string(owner), tag: tag}, true
}

// Current reports whether tok was issued under one of generations, the
// owner's secrets that authenticate now.
func (t *Tokens) Current(tok token, generations []string) bool {
	for _, g := range generations {
		if hmac.Equal(tok.tag, t.tag(g)) {
			return true
		}
	}
	return false
}
