package egress

import (
	"container/list"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"sync"
	"time"
)

// CA is the server's egress-secrets certificate authority: the gate
// presents a leaf it signs to a guest whose TLS it terminates, and guests
// trust it. Its key signs for any name, so it is per server and kept with
// the server's own secrets. Its methods are safe for concurrent use.
type CA struct {
	cert    *x509.Certificate
	key     crypto.Signer
	certPEM []byte
	keyPEM  []byte

	mu     sync.Mutex
	leaves map[string]*list.Element // of *leafEntry
	lru    list.List                // front: most recently used
}

const (
	caCommonName = "Emberbox egress secrets CA"
	caValidity   = 10 * 365 * 24 * time.Hour
	// A leaf is short-lived: a guest that kept one gains little, and the
	// cache renews it well before a client could see it expire.
	leafValidity = 7 * 24 * time.Hour
	leafRenew    = 24 * time.Hour
	// backdate covers clocks (the guest's) a little behind the host's.
	backdate = time.Hour
	// maxLeaves bounds the leaf cache: a guest naming many hosts costs
	// signatures, never memory.
	maxLeaves = 1024
)

type leafEntry struct {
	host string
	cert *tls.Certificate
}

// NewCA makes a new CA: an ECDSA P-256 key and a self-signed certificate
// valid for ten years that may sign leaves only (path length 0).
func NewCA() (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("egress CA: generating key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: caCommonName},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(caValidity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("egress CA: creating certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("egress CA: encoding key: %w", err)
	}
	return LoadCA(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
}

// LoadCA reads a CA that PEM wrote: a certificate and its PKCS#8 private
// key (an EC PRIVATE KEY is read too). The certificate must be a CA's and
// the key must be its own.
func LoadCA(certPEM, keyPEM []byte) (*CA, error) {
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, errors.New("egress CA: no CERTIFICATE block")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("egress CA: parsing certificate: %w", err)
	}
	if !cert.IsCA || !cert.BasicConstraintsValid || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, errors.New("egress CA: the certificate is not a CA's")
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return nil, err
	}
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(cert.PublicKey) {
		return nil, errors.New("egress CA: the key does not match the certificate")
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("egress CA: encoding key: %w", err)
	}
	return &CA{cert: cert, key: key, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cb.Bytes}),
		keyPEM: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), leaves: map[string]*list.Element{}}, nil
}

// parseKey reads a signing key from PEM: PKCS#8 or SEC 1.
func parseKey(keyPEM []byte) (crypto.Signer, error) {
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, errors.New("egress CA: no private key block")
	}
	var k any
	var err error
	switch kb.Type {
	case "PRIVATE KEY":
		k, err = x509.ParsePKCS8PrivateKey(kb.Bytes)
	case "EC PRIVATE KEY":
		k, err = x509.ParseECPrivateKey(kb.Bytes)
	default:
		return nil, fmt.Errorf("egress CA: unexpected key block %q", kb.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("egress CA: parsing key: %w", err)
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("egress CA: key of type %T cannot sign", k)
	}
	return s, nil
}

// PEM returns the certificate and the PKCS#8 private key, for the server
// to keep and give back to LoadCA.
func (ca *CA) PEM() (certPEM, keyPEM []byte) {
	return append([]byte(nil), ca.certPEM...), append([]byte(nil), ca.keyPEM...)
}

// CertPEM is the certificate guests are given to trust.
func (ca *CA) CertPEM() string { return string(ca.certPEM) }

// Certificate is the CA's certificate.
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }

// Leaf returns a certificate for host (a DNS name, or an IP address),
// signed by the CA, for the gate to present to a guest. Leaves are cached
// and renewed a day before they expire.
func (ca *CA) Leaf(host string) (*tls.Certificate, error) {
	host, err := leafHost(host)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	if c := ca.cached(host, now); c != nil {
		return c, nil
	}
	c, err := ca.issue(host, now)
	if err != nil {
		return nil, err
	}
	ca.store(host, c)
	return c, nil
}

// leafHost is host as a leaf names it: a checked, lower-case name without
// a trailing dot, or an IP address in its canonical form.
func leafHost(host string) (string, error) {
	host = normalizeHost(host)
	if ip, err := netip.ParseAddr(host); err == nil {
		if ip.Zone() != "" {
			return "", fmt.Errorf("egress CA: no certificate for %q: an address with a zone", host)
		}
		return ip.Unmap().String(), nil
	}
	if err := checkName(host); err != nil {
		return "", fmt.Errorf("egress CA: no certificate for %q: %w", host, err)
	}
	return host, nil
}

// cached returns host's leaf if it is not due for renewal.
func (ca *CA) cached(host string, now time.Time) *tls.Certificate {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	e, ok := ca.leaves[host]
	if !ok {
		return nil
	}
	le := e.Value.(*leafEntry)
	if le.cert.Leaf.NotAfter.Sub(now) < leafRenew {
		return nil
	}
	ca.lru.MoveToFront(e)
	return le.cert
}

// store caches c as host's leaf, dropping the least recently used leaf
// beyond maxLeaves.
func (ca *CA) store(host string, c *tls.Certificate) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if e, ok := ca.leaves[host]; ok {
		e.Value.(*leafEntry).cert = c
		ca.lru.MoveToFront(e)
		return
	}
	ca.leaves[host] = ca.lru.PushFront(&leafEntry{host: host, cert: c})
	for ca.lru.Len() > maxLeaves {
		old := ca.lru.Remove(ca.lru.Back()).(*leafEntry)
		delete(ca.leaves, old.host)
	}
}

// issue signs a new leaf for host, a checked name or an IP address.
func (ca *CA) issue(host string, now time.Time) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("egress CA: generating leaf key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: host},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(leafValidity),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		tmpl.IPAddresses = append(tmpl.IPAddresses, ip.AsSlice())
	} else {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return nil, fmt.Errorf("egress CA: signing a leaf for %s: %w", host, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("egress CA: parsing the leaf for %s: %w", host, err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// randomSerial is a random 128-bit serial number, as CAs must not repeat
// one and clients reject some repeats.
func randomSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("egress CA: serial number: %w", err)
	}
	return n, nil
}
