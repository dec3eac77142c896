package kvxfer

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// SecretEnv is the environment variable that carries the cluster's KV
// secret when --kv-secret-file is not given.
const SecretEnv = "TANDEM_KV_SECRET"

// MinSecretBytes is the shortest secret accepted.
const MinSecretBytes = 16

// ErrUnauthenticated wraps every failure of the side channel's mutual
// authentication and of a kv_transfer_params signature check.
var ErrUnauthenticated = errors.New("not authenticated")

// ErrSignatureExpired marks kv_transfer_params whose signature is genuine
// but whose expiry (plus Signer.Skew) has passed. Signer.Verify wraps it with
// ErrUnauthenticated, so a late decode leg can be told from a forged one.
var ErrSignatureExpired = errors.New("kv_transfer_params expired")

// Secret is the cluster's shared KV secret, known to every prefill and
// decode engine of one deployment and to nobody else. Two keys are derived
// from it (HMAC-SHA256 with distinct labels), so a signature made for one
// purpose is never valid for the other: one signs kv_transfer_params, one
// authenticates side-channel connections.
//
// The zero Secret means "no secret configured": the side channel still
// runs the same handshake with a well-known key (it then authenticates
// nothing, and the engines fall back to an address allowlist, PeerPolicy),
// and params are signed with a per-process random key, which lets only this
// engine check its own signatures (ReleaseKV).
type Secret struct {
	set     bool
	params  []byte
	channel []byte
}

// NewSecret derives the keys from raw secret bytes (at least
// MinSecretBytes).
func NewSecret(raw []byte) (Secret, error) {
	if len(raw) < MinSecretBytes {
		return Secret{}, fmt.Errorf("the KV secret has %d bytes; it needs at least %d (tandem up generates 32 random bytes: head -c 32 /dev/urandom | xxd -p -c 64)", len(raw), MinSecretBytes)
	}
	return Secret{set: true, params: derive(raw, "tandem kv_transfer_params v1"), channel: derive(raw, "tandem kv side channel v1")}, nil
}

// LoadSecret reads the secret from file, or from $TANDEM_KV_SECRET when
// file is empty. Surrounding whitespace is ignored, so an editor's trailing
// newline does not change the secret. Neither configured returns the zero
// Secret.
func LoadSecret(file string) (Secret, error) {
	var raw []byte
	switch {
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return Secret{}, fmt.Errorf("--kv-secret-file: %w", err)
		}
		raw = bytes.TrimSpace(b)
		if len(raw) == 0 {
			return Secret{}, fmt.Errorf("--kv-secret-file %s is empty", file)
		}
	case os.Getenv(SecretEnv) != "":
		raw = []byte(strings.TrimSpace(os.Getenv(SecretEnv)))
	default:
		return Secret{}, nil
	}
	s, err := NewSecret(raw)
	if err != nil {
		return Secret{}, fmt.Errorf("kv secret: %w", err)
	}
	return s, nil
}

// GenerateSecret returns a fresh random secret, hex-encoded (64
// characters), for `tandem up` and for operators.
func GenerateSecret() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic("crypto/rand failed: " + err.Error()) // never on Linux ≥ 3.17
	}
	return hex.EncodeToString(b)
}

// IsSet reports whether a secret was configured.
func (s Secret) IsSet() bool { return s.set }

// channelKey is the key of the side-channel handshake: the secret's, or a
// well-known one when none is configured.
func (s Secret) channelKey() []byte {
	if s.set {
		return s.channel
	}
	return noSecretChannelKey
}

var noSecretChannelKey = derive(nil, "tandem kv side channel v1, no secret")

func derive(secret []byte, label string) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(label))
	return m.Sum(nil)
}

// SignatureParam is the kv_transfer_params key that carries a prefill's
// signature. vLLM's proxy and Tandem's pass params verbatim, so it travels
// with the others.
const SignatureParam = "tandem_signature"

// signatureVersion prefixes every signature, so its format can change.
const signatureVersion = "v1"

// Grant is what a prefill's kv_transfer_params let a decode do: pull these
// blocks of this request from this engine at this address. A signature
// covers every field.
type Grant struct {
	EngineID  string
	RequestID string
	Host      string
	Port      int
	BlockIDs  []int
	NumTokens int
	// Digest covers anything else the issuer vouches for (a conversation
	// hold's token hash chain); empty for a prefill's params.
	Digest string
}

// Signer signs Grants and verifies signatures. The zero Signer (no secret)
// signs with a per-process random key and verifies only its own
// signatures.
type Signer struct {
	key []byte
	// Skew is how far past its expiry a signature is still accepted,
	// for clocks that disagree between machines.
	Skew time.Duration
}

// DefaultSkew is the default Signer.Skew.
const DefaultSkew = 30 * time.Second

// NewSigner returns the signer of a cluster secret, or, for the zero
// Secret, of a random per-process key.
func NewSigner(s Secret) *Signer {
	key := s.params
	if !s.set {
		key = make([]byte, 32)
		rand.Read(key)
	}
	return &Signer{key: key, Skew: DefaultSkew}
}

// Sign returns the signature of g, valid until expiry:
// "v1.<expiry unix ms>.<base64url HMAC-SHA256>".
func (s *Signer) Sign(g Grant, expiry time.Time) string {
	ms := expiry.UnixMilli()
	return signatureVersion + "." + strconv.FormatInt(ms, 10) + "." +
		base64.RawURLEncoding.EncodeToString(s.mac(g, ms))
}

// Verify checks that sig is a signature of g made with this signer's key
// and not expired at now (beyond Skew). Every failure wraps
// ErrUnauthenticated (an expired signature ErrSignatureExpired too) and
// says which check failed, for the engine's log; clients get a generic
// message.
func (s *Signer) Verify(g Grant, sig string, now time.Time) error {
	if sig == "" {
		return fmt.Errorf("%w: kv_transfer_params carry no %s", ErrUnauthenticated, SignatureParam)
	}
	ver, rest, ok1 := strings.Cut(sig, ".")
	msText, macText, ok2 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || ver != signatureVersion {
		return fmt.Errorf("%w: malformed %s", ErrUnauthenticated, SignatureParam)
	}
	ms, err := strconv.ParseInt(msText, 10, 64)
	if err != nil || ms <= 0 {
		return fmt.Errorf("%w: malformed expiry in %s", ErrUnauthenticated, SignatureParam)
	}
	mac, err := base64.RawURLEncoding.DecodeString(macText)
	if err != nil || len(mac) != sha256.Size {
		return fmt.Errorf("%w: malformed MAC in %s", ErrUnauthenticated, SignatureParam)
	}
	if !hmac.Equal(mac, s.mac(g, ms)) {
		return fmt.Errorf("%w: %s does not match the params (altered, or signed with another secret)", ErrUnauthenticated, SignatureParam)
	}
	if exp := time.UnixMilli(ms); now.After(exp.Add(s.Skew)) {
		return fmt.Errorf("%w: %w %s ago (%s)", ErrUnauthenticated, ErrSignatureExpired, now.Sub(exp).Round(time.Millisecond), SignatureParam)
	}
	return nil
}

// mac is the HMAC of g's fields and the expiry, each length-prefixed so no
// two different grants encode alike.
func (s *Signer) mac(g Grant, expiryMs int64) []byte {
	b := make([]byte, 0, 128+8*len(g.BlockIDs))
	for _, f := range []string{"tandem-kv-grant", g.EngineID, g.RequestID, g.Host, g.Digest} {
		b = binary.AppendUvarint(b, uint64(len(f)))
		b = append(b, f...)
	}
	b = binary.AppendVarint(b, int64(g.Port))
	b = binary.AppendVarint(b, int64(g.NumTokens))
	b = binary.AppendVarint(b, expiryMs)
	b = binary.AppendUvarint(b, uint64(len(g.BlockIDs)))
	for _, id := range g.BlockIDs {
		b = binary.AppendVarint(b, int64(id))
	}
	m := hmac.New(sha256.New, s.key)
	m.Write(b)
	return m.Sum(nil)
}
