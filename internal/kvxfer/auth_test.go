package kvxfer

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var testGrant = Grant{EngineID: "prefill-1", RequestID: "req-1-abcd", Host: "10.0.0.7", Port: 5600, BlockIDs: []int{4, 9, 2}, NumTokens: 40}

func TestSignedParamsVerify(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	s := NewSigner(testSecret)
	sig := s.Sign(testGrant, now.Add(30*time.Second))
	other, _ := NewSecret([]byte("another secret, also long enough"))
	mod := func(f func(*Grant)) Grant {
		g := testGrant
		g.BlockIDs = append([]int(nil), g.BlockIDs...)
		f(&g)
		return g
	}
	tests := []struct {
		name   string
		signer *Signer
		grant  Grant
		sig    string
		now    time.Time
		ok     bool
	}{
		{"the prefill's own params verify", s, testGrant, sig, now, true},
		{"params within the clock skew after expiry verify", s, testGrant, sig, now.Add(30*time.Second + DefaultSkew), true},
		{"expired params are refused", s, testGrant, sig, now.Add(31*time.Second + DefaultSkew), false},
		{"a tampered block id is refused", s, mod(func(g *Grant) { g.BlockIDs[1] = 10 }), sig, now, false},
		{"an extra block is refused", s, mod(func(g *Grant) { g.BlockIDs = append(g.BlockIDs, 3) }), sig, now, false},
		{"a tampered engine id is refused", s, mod(func(g *Grant) { g.EngineID = "prefill-2" }), sig, now, false},
		{"a tampered request id is refused", s, mod(func(g *Grant) { g.RequestID = "req-2" }), sig, now, false},
		{"a tampered host is refused", s, mod(func(g *Grant) { g.Host = "169.254.169.254" }), sig, now, false},
		{"a tampered port is refused", s, mod(func(g *Grant) { g.Port = 22 }), sig, now, false},
		{"another prompt length is refused", s, mod(func(g *Grant) { g.NumTokens = 41 }), sig, now, false},
		{"a tampered expiry is refused", s, testGrant, strings.Replace(sig, ".1800000030000.", ".1900000030000.", 1), now, false},
		{"another cluster's secret is refused", NewSigner(other), testGrant, sig, now, false},
		{"no signature is refused", s, testGrant, "", now, false},
		{"garbage is refused", s, testGrant, "v1.x.y", now, false},
		{"another version is refused", s, testGrant, "v2" + sig[2:], now, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.signer.Verify(tc.grant, tc.sig, tc.now)
			if (err == nil) != tc.ok {
				t.Fatalf("Verify = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrUnauthenticated) {
				t.Fatalf("error %v does not wrap ErrUnauthenticated", err)
			}
		})
	}
}

func TestWithoutASecretOnlyTheSignerVerifiesItsOwnSignatures(t *testing.T) {
	a, b := NewSigner(Secret{}), NewSigner(Secret{})
	now := time.Now()
	sig := a.Sign(testGrant, now.Add(time.Minute))
	if err := a.Verify(testGrant, sig, now); err != nil {
		t.Fatal(err)
	}
	if err := b.Verify(testGrant, sig, now); err == nil {
		t.Fatal("another process's random key verified the signature")
	}
}

func FuzzVerifyGrant(f *testing.F) {
	s := NewSigner(testSecret)
	now := time.Unix(1_800_000_000, 0)
	good := s.Sign(testGrant, now.Add(time.Minute))
	f.Add(testGrant.EngineID, testGrant.RequestID, testGrant.Host, testGrant.Port, 4, good)
	f.Add("", "", "", 0, 0, "")
	f.Add("e", "r", "h", 1, 1, "v1.1.AAAA")
	f.Fuzz(func(t *testing.T, engine, req, host string, port, block int, sig string) {
		g := Grant{EngineID: engine, RequestID: req, Host: host, Port: port, BlockIDs: []int{block, 9, 2}, NumTokens: 40}
		err := s.Verify(g, sig, now)
		same := engine == testGrant.EngineID && req == testGrant.RequestID && host == testGrant.Host && port == testGrant.Port && block == 4
		if err == nil && !(same && sig == good) {
			t.Fatalf("forged params verified: %+v %q", g, sig)
		}
		if err != nil && !errors.Is(err, ErrUnauthenticated) {
			t.Fatalf("error %v does not wrap ErrUnauthenticated", err)
		}
		if s2 := s.Sign(g, now.Add(time.Minute)); s.Verify(g, s2, now) != nil {
			t.Fatal("a fresh signature does not verify")
		}
	})
}

// FuzzProducerHandshake feeds arbitrary bytes to the producer's side of
// the handshake: it must never panic, never take long, and never let a
// peer that does not know the secret through.
func FuzzProducerHandshake(f *testing.F) {
	f.Add(frame(msgHello, 1, func(b []byte) []byte { return append(b, make([]byte, nonceSize)...) }))
	f.Add(append(frame(msgHello, 1, func(b []byte) []byte { return append(b, make([]byte, nonceSize)...) }),
		frame(msgAuth, 1, func(b []byte) []byte { return appendInfo(append(b, make([]byte, macSize)...), &tiny) })...))
	f.Add([]byte("TKVX\x02\x01\x00\x00"))
	f.Fuzz(func(t *testing.T, in []byte) {
		a, b := net.Pipe()
		defer a.Close()
		go func() {
			defer b.Close()
			b.Write(in)
			buf := make([]byte, 4096)
			for {
				if _, err := b.Read(buf); err != nil {
					return
				}
			}
		}()
		p := &Producer{cfg: ProducerConfig{Secret: testSecret, AuthTimeout: 20 * time.Millisecond, IOTimeout: 20 * time.Millisecond}, info: tiny}
		s := &srvConn{p: p, c: a}
		if err := s.authenticate(func(string) string { return "" }); err == nil || s.hello {
			t.Fatalf("a peer without the secret authenticated with %q", in)
		}
	})
}

// TestHandshakeNeedsTheSameSecret: a consumer with another secret, or none,
// fails authentication on both sides, and a producer with another secret
// is refused by the consumer before it learns anything.
func TestHandshakeNeedsTheSameSecret(t *testing.T) {
	other, _ := NewSecret([]byte("another secret, also long enough"))
	for _, tc := range []struct {
		name     string
		consumer Secret
	}{{"a different secret", other}, {"no secret", Secret{}}} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, rigOpts{consMut: func(cc *ConsumerConfig) { cc.Secret = tc.consumer }})
			r.hold(t, "req-a", 1)
			err := r.cons.Pull(ctxT(t), r.params("req-a", 1), newLocalBlocks(1, tiny.BlockBytes))
			wantErr(t, err, ErrUnauthenticated, "did not prove it knows this engine's KV secret")
			if FailureReason(err) != "unauthenticated" {
				t.Fatalf("reason %q", FailureReason(err))
			}
		})
	}
}

func TestPeerPolicy(t *testing.T) {
	tests := []struct {
		spec string
		host string
		port int
		ok   bool
	}{
		{"", "127.0.0.1", 5600, true},
		{"", "127.9.9.9", 1, true},
		{"", "::1", 5600, true},
		{"", "localhost", 5600, true},
		{"", "10.0.0.1", 5600, false},
		{"", "169.254.169.254", 80, false},
		{"", "metadata.google.internal", 80, false},
		{"10.0.0.0/8", "10.1.2.3", 5600, true},
		{"10.0.0.0/8", "127.0.0.1", 5600, false},
		{"10.0.0.0/8", "prefill.local", 5600, false},
		{"prefill-0.prefill:5600", "prefill-0.prefill", 5600, true},
		{"prefill-0.prefill:5600", "PREFILL-0.prefill", 5600, true},
		{"prefill-0.prefill:5600", "prefill-0.prefill", 5601, false},
		{"10.1.2.3", "10.1.2.3", 7, true},
		{"fd00::/8", "fd00::1", 5600, true},
		{"any", "8.8.8.8", 53, true},
	}
	for _, tc := range tests {
		p, err := ParsePeers(tc.spec)
		if err != nil {
			t.Fatal(err)
		}
		if got := p.AllowsDial(tc.host, tc.port); got != tc.ok {
			t.Errorf("--kv-peers %q dial %s:%d = %v, want %v", tc.spec, tc.host, tc.port, got, tc.ok)
		}
	}
	for _, bad := range []string{"10.0.0.0/33", "host", "host:0", "host:x", ":5600"} {
		if _, err := ParsePeers(bad); err == nil {
			t.Errorf("--kv-peers %q accepted", bad)
		}
	}
	p, _ := ParsePeers("")
	if !p.AllowsConn(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 2), Port: 40000}) || p.AllowsConn(&net.TCPAddr{IP: net.IPv4(10, 0, 0, 2), Port: 40000}) {
		t.Fatal("the default policy must accept loopback consumers and only them")
	}
}

func TestLoadSecret(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	os.WriteFile(good, []byte("0123456789abcdef0123\n"), 0o600)
	short := filepath.Join(dir, "short")
	os.WriteFile(short, []byte("tooshort"), 0o600)
	if s, err := LoadSecret(good); err != nil || !s.IsSet() {
		t.Fatalf("LoadSecret(good) = %v", err)
	}
	if _, err := LoadSecret(short); err == nil {
		t.Fatal("a short secret was accepted")
	}
	if _, err := LoadSecret(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("a missing file was accepted")
	}
	t.Setenv(SecretEnv, GenerateSecret())
	if s, err := LoadSecret(""); err != nil || !s.IsSet() {
		t.Fatalf("LoadSecret from $%s = %v", SecretEnv, err)
	}
	t.Setenv(SecretEnv, "")
	if s, err := LoadSecret(""); err != nil || s.IsSet() {
		t.Fatalf("no secret configured gave %v, %v", s.IsSet(), err)
	}
	// The file and the environment give the same keys for the same bytes.
	a, _ := LoadSecret(good)
	t.Setenv(SecretEnv, "0123456789abcdef0123")
	b, _ := LoadSecret("")
	if string(a.params) != string(b.params) {
		t.Fatal("the same secret from a file and the environment derived different keys")
	}
}
