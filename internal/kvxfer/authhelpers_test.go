package kvxfer

import (
	"context"
	"net"
	"testing"
	"time"
)

// testSecret is the cluster secret of the test rigs.
var testSecret = func() Secret {
	s, err := NewSecret([]byte("test secret, 32 bytes long......"))
	if err != nil {
		panic(err)
	}
	return s
}()

// fakeServerHandshake runs the producer's side of the handshake on c with
// secret s, announcing info: fake producers use it to get past
// authentication and then misbehave.
func fakeServerHandshake(c net.Conn, s Secret, info Info) error {
	p := &Producer{cfg: ProducerConfig{Secret: s, HelloTimeout: 5 * time.Second, AuthTimeout: 5 * time.Second, IOTimeout: 5 * time.Second}, info: info}
	return (&srvConn{p: p, c: c}).authenticate(func(string) string { return "" })
}

// rawClientHandshake runs the consumer's side of the handshake on c with
// secret s (tests that then send hand-made frames).
func rawClientHandshake(t testing.TB, c net.Conn, s Secret) (Info, error) {
	t.Helper()
	ci := tiny
	ci.EngineID = "raw-client"
	cons, err := NewConsumer(ConsumerConfig{Local: ci, Secret: s, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cn := &pconn{Conn: c}
	info, err := cons.clientHandshake(ctx, cn)
	c.SetDeadline(time.Time{})
	return info, err
}
