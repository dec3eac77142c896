package kvxfer

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// testTLS writes a fresh CA and one engine certificate for 127.0.0.1 into a
// temporary directory and returns the side channel's configurations, built
// the way `tandem serve --kv-tls-*` builds them.
func testTLS(t testing.TB) (server, client *tls.Config) {
	t.Helper()
	dir := t.TempDir()
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "tandem test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "engine"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		KeyUsage:    x509.KeyUsageDigitalSignature,
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	server, client, err = TLSConfigs(write("engine.pem", "CERTIFICATE", leafDER), write("engine.key", "EC PRIVATE KEY", keyDER), write("ca.pem", "CERTIFICATE", caDER))
	if err != nil {
		t.Fatal(err)
	}
	return server, client
}

func TestMutualTLS(t *testing.T) {
	server, client := testTLS(t)
	_, otherClient := testTLS(t) // another CA
	t.Run("pulls work over mutual TLS", func(t *testing.T) {
		r := newRig(t, rigOpts{transport: TransportTCP, prodMut: func(pc *ProducerConfig) { pc.TLS = server }, consMut: func(cc *ConsumerConfig) { cc.TLS = client }})
		r.hold(t, "req-a", 1, 5)
		dst := newLocalBlocks(2, tiny.BlockBytes)
		if err := r.cons.Pull(ctxT(t), r.params("req-a", 1, 5), dst); err != nil {
			t.Fatal(err)
		}
		checkBlocks(t, r.pool, []int{1, 5}, dst)
	})
	t.Run("a consumer trusting another CA is refused", func(t *testing.T) {
		r := newRig(t, rigOpts{transport: TransportTCP, prodMut: func(pc *ProducerConfig) { pc.TLS = server }, consMut: func(cc *ConsumerConfig) { cc.TLS = otherClient }})
		r.hold(t, "req-a", 1)
		err := r.cons.Pull(ctxT(t), r.params("req-a", 1), newLocalBlocks(1, tiny.BlockBytes))
		wantErr(t, err, ErrUnauthenticated, "TLS handshake")
	})
	t.Run("a plaintext consumer is refused", func(t *testing.T) {
		r := newRig(t, rigOpts{transport: TransportTCP, prodMut: func(pc *ProducerConfig) { pc.TLS = server }})
		r.hold(t, "req-a", 1)
		if err := r.cons.Pull(ctxT(t), r.params("req-a", 1), newLocalBlocks(1, tiny.BlockBytes)); err == nil {
			t.Fatal("a plaintext consumer pulled from a TLS producer")
		}
	})
}
