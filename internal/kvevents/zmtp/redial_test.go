package zmtp

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"
)

// TestDialPubReachesALateSubscriberWithin100ms: an engine whose events
// endpoint is dialed (a subscriber that binds, such as llm-d's indexer)
// keeps redialing every 100 ms, as libzmq does, so a subscriber that
// starts late gets the batches from at most 100 ms after it started,
// whether it started 300 ms or a minute after the engine (a backoff that
// grows to seconds would lose that many seconds of batches). In fake time,
// with an in-memory dialer that refuses until the subscriber is up.
func TestDialPubReachesALateSubscriberWithin100ms(t *testing.T) {
	for _, late := range []time.Duration{300 * time.Millisecond, 10 * time.Second, time.Minute} {
		t.Run(fmt.Sprintf("a subscriber %v late", late), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				subs := make(chan net.Conn, 1)
				dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
					if time.Since(start) < late {
						return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
					}
					a, b := bufferedPipe()
					subs <- b
					return a, nil
				}
				s := DialPub("indexer:5557", Options{Logger: quiet, Dial: dial})
				defer s.Close()
				// The engine publishes a batch every 10 ms, numbered.
				stop := make(chan struct{})
				defer close(stop)
				go func() {
					for seq := uint64(0); ; seq++ {
						s.Publish([][]byte{[]byte("kv@"), binary.BigEndian.AppendUint64(nil, seq)})
						select {
						case <-stop:
							return
						case <-time.After(10 * time.Millisecond):
						}
					}
				}()
				c := <-subs
				z, err := Handshake(c, SUB, true, Options{})
				if err != nil {
					t.Fatal(err)
				}
				defer z.Close()
				if err := z.Subscribe([]byte("kv@")); err != nil {
					t.Fatal(err)
				}
				msg, err := z.ReadMsg(nil)
				if err != nil {
					t.Fatal(err)
				}
				if got := time.Since(start); got > late+redialInterval+10*time.Millisecond {
					t.Errorf("the first batch reached a subscriber up at %v only at %v: the publisher redials too slowly", late, got)
				}
				first := binary.BigEndian.Uint64(msg[1])
				if want := uint64((late + redialInterval) / (10 * time.Millisecond)); first > want {
					t.Errorf("the subscriber's first batch is number %d, want at most %d", first, want)
				}
			})
		})
	}
}

// bufferedPipe is an in-memory connection whose writes are buffered, as a
// TCP socket's are (both ends of a ZMTP handshake write their greeting
// before reading the other's, which net.Pipe's unbuffered writes
// deadlock). Inside a synctest bubble its reads block durably. Deadlines
// are ignored.
func bufferedPipe() (net.Conn, net.Conn) {
	ab, ba := make(chan []byte, 1024), make(chan []byte, 1024)
	done := make(chan struct{})
	var once sync.Once
	closeBoth := func() { once.Do(func() { close(done) }) }
	return &pipeEnd{in: ba, out: ab, done: done, close: closeBoth}, &pipeEnd{in: ab, out: ba, done: done, close: closeBoth}
}

type pipeEnd struct {
	in, out chan []byte
	buf     []byte
	done    chan struct{}
	close   func()
}

func (p *pipeEnd) Read(b []byte) (int, error) {
	if len(p.buf) == 0 {
		select {
		case p.buf = <-p.in:
		case <-p.done:
			return 0, io.EOF
		}
	}
	n := copy(b, p.buf)
	p.buf = p.buf[n:]
	return n, nil
}

func (p *pipeEnd) Write(b []byte) (int, error) {
	select {
	case <-p.done:
		return 0, net.ErrClosed
	case p.out <- append([]byte(nil), b...):
		return len(b), nil
	}
}

func (p *pipeEnd) Close() error                     { p.close(); return nil }
func (p *pipeEnd) LocalAddr() net.Addr              { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }
func (p *pipeEnd) RemoteAddr() net.Addr             { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }
func (p *pipeEnd) SetDeadline(time.Time) error      { return nil }
func (p *pipeEnd) SetReadDeadline(time.Time) error  { return nil }
func (p *pipeEnd) SetWriteDeadline(time.Time) error { return nil }
