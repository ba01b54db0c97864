package webhook

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
)

// SignatureHeader is the header that carries a delivery's signature.
const SignatureHeader = "Runtime-Signature"

// Sign returns the Runtime-Signature of body sent at unix time t: t=<t>
// and one v1=<hex HMAC-SHA256 of "<t>.<body>"> per secret, as
// withruntime.verify_webhook checks it.
func Sign(body []byte, t int64, secrets []string) string {
	stamp := strconv.FormatInt(t, 10)
	var b strings.Builder
	b.WriteString("t=")
	b.WriteString(stamp)
	for _, s := range secrets {
		mac := hmac.New(sha256.New, []byte(s))
		mac.Write([]byte(stamp))
		mac.Write([]byte{'.'})
		mac.Write(body)
		b.WriteString(",v1=")
		b.WriteString(hex.EncodeToString(mac.Sum(nil)))
	}
	return b.String()
}

// newSecret returns a fresh signing secret: 32 random bytes, in hex.
func newSecret() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return "whsec_" + hex.EncodeToString(b[:])
}
