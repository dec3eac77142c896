package kvxfer

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// TLSConfigs builds the side channel's mutual-TLS configurations from PEM
// files (--kv-tls-cert, --kv-tls-key, --kv-tls-ca): the producer presents
// cert and requires a client certificate signed by ca; the consumer
// presents cert and requires the producer's to be signed by ca and to name
// the host it dialed (remote_host). TLS runs under the secret's
// handshake, not instead of it: it adds confidentiality and integrity for
// KV crossing networks that are not trusted.
func TLSConfigs(certFile, keyFile, caFile string) (server, client *tls.Config, err error) {
	if certFile == "" || keyFile == "" || caFile == "" {
		return nil, nil, errors.New("KV TLS needs all of --kv-tls-cert, --kv-tls-key and --kv-tls-ca")
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("--kv-tls-cert/--kv-tls-key: %w", err)
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, nil, fmt.Errorf("--kv-tls-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, nil, fmt.Errorf("--kv-tls-ca %s holds no PEM certificate", caFile)
	}
	server = &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS13,
	}
	client = &tls.Config{
		Certificates: []tls.Certificate{cert},
		RootCAs:      pool,
		MinVersion:   tls.VersionTLS13,
	}
	return server, client, nil
}
