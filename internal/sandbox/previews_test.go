package sandbox

import (
	"testing"
	"time"
)

func TestPreviewTokens(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	p := &Preview{ID: "pvabc", Secret: []byte("secret one")}
	exp, err := p.TokenExpiry(now, 0, nil)
	if err != nil || !exp.Equal(now.Add(DefaultTokenTTL)) {
		t.Fatalf("default expiry %v %v", exp, err)
	}
	tok := p.Token(exp)
	if !p.CheckToken(tok, now) {
		t.Fatal("a fresh token is refused")
	}
	if p.CheckToken(tok, exp) {
		t.Error("an expired token is accepted")
	}
	other := &Preview{ID: "pvdef", Secret: p.Secret}
	if other.CheckToken(tok, now) {
		t.Error("another preview accepts the token")
	}
	for _, bad := range []string{"", tok + "x", "pvabc.9999999999." + tok[len(tok)-43:], "pvabc"} {
		if p.CheckToken(bad, now) {
			t.Errorf("accepted %q", bad)
		}
	}
	p.Secret = []byte("rotated")
	if p.CheckToken(tok, now) {
		t.Error("a rotated preview accepts an old token")
	}
	// The preview's own end and a shorter ttl cap a token.
	end := now.Add(time.Hour)
	p.ExpiresAt = &end
	if exp, _ := p.TokenExpiry(now, 0, nil); !exp.Equal(end) {
		t.Errorf("capped by the preview: %v", exp)
	}
	if exp, _ := p.TokenExpiry(now, 2*time.Minute, nil); !exp.Equal(now.Add(2 * time.Minute)) {
		t.Errorf("capped by ttl: %v", exp)
	}
	if _, err := p.TokenExpiry(now, time.Second, nil); err == nil {
		t.Error("a one-second ttl is accepted")
	}
}
