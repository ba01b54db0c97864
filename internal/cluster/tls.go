package cluster

import (
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
	"net"
	"time"
)

// The node-to-node channel is mutual TLS under a CA of the cluster's own:
// a node serves only peers whose certificate the CA signed, and dials only
// peers that show one. Tenants never hold such a certificate, so a proxied
// request cannot be forged from outside.

// CA is the cluster's certificate authority.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	// PEM is the certificate and key, as kept (store or files).
	PEM string
}

// NewCA makes a CA valid for ten years.
func NewCA() (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("making the cluster CA: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "emberbox cluster CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("making the cluster CA: %w", err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("making the cluster CA: %w", err)
	}
	p := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})) +
		string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}))
	return ParseCA([]byte(p))
}

// ParseCA reads a CA from PEM holding its certificate and its private key
// (EC, PKCS #8 or PKCS #1 RSA is refused: the nodes' keys are ECDSA).
func ParseCA(b []byte) (*CA, error) {
	ca := &CA{PEM: string(b)}
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		switch blk.Type {
		case "CERTIFICATE":
			c, err := x509.ParseCertificate(blk.Bytes)
			if err != nil {
				return nil, fmt.Errorf("cluster CA: %w", err)
			}
			ca.Cert = c
		case "EC PRIVATE KEY":
			k, err := x509.ParseECPrivateKey(blk.Bytes)
			if err != nil {
				return nil, fmt.Errorf("cluster CA key: %w", err)
			}
			ca.Key = k
		case "PRIVATE KEY":
			k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
			if err != nil {
				return nil, fmt.Errorf("cluster CA key: %w", err)
			}
			ek, ok := k.(*ecdsa.PrivateKey)
			if !ok {
				return nil, errors.New("cluster CA key: want an ECDSA key")
			}
			ca.Key = ek
		}
	}
	if ca.Cert == nil || ca.Key == nil {
		return nil, errors.New("cluster CA: want a PEM certificate and its EC private key")
	}
	if !ca.Cert.IsCA {
		return nil, errors.New("cluster CA: the certificate is not a CA")
	}
	if !ca.Key.PublicKey.Equal(ca.Cert.PublicKey) {
		return nil, errors.New("cluster CA: the key does not match the certificate")
	}
	return ca, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	return n
}

// NodeTLS is one node's side of the channel.
type NodeTLS struct {
	Server *tls.Config
	Client *tls.Config
}

// Issue makes a certificate for node id reachable at host (an IP or a DNS
// name), valid for a year, and the TLS configurations that serve and dial
// with it, trusting the CA alone.
func (ca *CA) Issue(id, host string) (*NodeTLS, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("node certificate: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: id, OrganizationalUnit: []string{"emberbox node"}},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().AddDate(1, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if ip := net.ParseIP(host); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else if host != "" {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("node certificate: %w", err)
	}
	cert := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return &NodeTLS{
		Server: &tls.Config{
			Certificates: []tls.Certificate{cert},
			ClientAuth:   tls.RequireAndVerifyClientCert,
			ClientCAs:    pool,
			MinVersion:   tls.VersionTLS13,
			NextProtos:   []string{"http/1.1"},
		},
		Client: &tls.Config{
			Certificates: []tls.Certificate{cert},
			RootCAs:      pool,
			MinVersion:   tls.VersionTLS13,
			NextProtos:   []string{"http/1.1"},
		},
	}, nil
}
