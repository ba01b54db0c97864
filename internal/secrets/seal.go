package secrets

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"strings"
)

// KeySize is the size of a sealing key: AES-256.
const KeySize = 32

// Sealer seals secret values with AES-256-GCM. The additional data binds
// a sealed value to its owner and name, so a row copied onto another
// secret's does not open.
type Sealer struct{ aead cipher.AEAD }

// NewSealer returns a sealer under key (KeySize bytes).
func NewSealer(key []byte) (*Sealer, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("secrets key: %d bytes, want %d", len(key), KeySize)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &Sealer{aead: aead}, nil
}

// LoadOrCreateKey reads the sealing key in path, or makes one there (0600,
// written whole before it is used) when the file does not exist.
func LoadOrCreateKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		key, derr := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b)))
		if derr != nil || len(key) != KeySize {
			return nil, fmt.Errorf("secrets key %s: not %d bytes of base64", path, KeySize)
		}
		return key, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("reading secrets key: %w", err)
	}
	key := make([]byte, KeySize)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("writing secrets key: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, fmt.Errorf("writing secrets key: %w", err)
	}
	return key, nil
}

// sealPrefix names the sealing scheme, so that another can follow.
const sealPrefix = "v1:"

// Seal returns value sealed for owner's secret name.
func (s *Sealer) Seal(owner, name, value string) string {
	nonce := make([]byte, s.aead.NonceSize())
	_, _ = rand.Read(nonce)
	out := s.aead.Seal(nonce, nonce, []byte(value), ad(owner, name))
	return sealPrefix + base64.StdEncoding.EncodeToString(out)
}

// Open returns the value sealed for owner's secret name.
func (s *Sealer) Open(owner, name, sealed string) (string, error) {
	b64, ok := strings.CutPrefix(sealed, sealPrefix)
	if !ok {
		return "", fmt.Errorf("opening secret %s: unknown sealing", name)
	}
	b, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(b) < s.aead.NonceSize() {
		return "", fmt.Errorf("opening secret %s: malformed", name)
	}
	n := s.aead.NonceSize()
	v, err := s.aead.Open(nil, b[:n], b[n:], ad(owner, name))
	if err != nil {
		return "", fmt.Errorf("opening secret %s: not sealed by this server's key", name)
	}
	return string(v), nil
}

func ad(owner, name string) []byte {
	return []byte("emberbox egress secret\x00" + owner + "\x00" + name)
}
