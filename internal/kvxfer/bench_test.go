package kvxfer

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// BenchmarkPull measures KV pull throughput for smollm2-135m blocks
// (737,280 bytes) over TCP and shared memory, beside raw loopback TCP and
// memcpy of the same bytes in the same run:
//
//	go test -run '^$' -bench Pull -benchtime 2s ./internal/kvxfer/
func BenchmarkPull(b *testing.B) {
	const poolBlocks = 256
	pool := newTestPool(b, poolBlocks, smollm)
	pool.fillRandom(b)
	for _, n := range []int{1, 16, 256} {
		ids := make([]int, n)
		for i := range ids {
			ids[i] = (i * 7) % poolBlocks // scattered, as in a real pool
		}
		bytes := float64(n * smollm.BlockBytes)
		report := func(b *testing.B) {
			b.SetBytes(int64(bytes))
			b.ReportMetric(bytes*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
		}
		b.Run(fmt.Sprintf("blocks=%d/memcpy", n), func(b *testing.B) {
			dst := newLocalBlocks(n, smollm.BlockBytes)
			for b.Loop() {
				for i, id := range ids {
					copy(dst[i], pool.Block(id))
				}
			}
			report(b)
		})
		b.Run(fmt.Sprintf("blocks=%d/rawtcp", n), func(b *testing.B) {
			benchRawTCP(b, pool, ids)
			report(b)
		})
		for _, tr := range []Transport{TransportTCP, TransportShm} {
			b.Run(fmt.Sprintf("blocks=%d/%s", n, tr), func(b *testing.B) {
				benchPull(b, pool, tr, ids, 1, false)
				report(b)
			})
		}
		b.Run(fmt.Sprintf("blocks=%d/tcp-tls", n), func(b *testing.B) {
			benchPull(b, pool, TransportTCP, ids, 1, true)
			report(b)
		})
		if n == 256 {
			b.Run(fmt.Sprintf("blocks=%d/tcp-2conns", n), func(b *testing.B) {
				benchPull(b, pool, TransportTCP, ids, 2, false)
				report(b)
			})
		}
	}
}

// benchPull pulls ids per iteration, split over streams concurrent pulls
// (each on its own pooled connection).
func benchPull(b *testing.B, pool *testPool, tr Transport, ids []int, streams int, withTLS bool) {
	var server, client *tls.Config
	if withTLS {
		server, client = testTLS(b)
	}
	pi := smollm
	pi.EngineID = "bench-p"
	prod, err := NewProducer(ProducerConfig{Local: pi, Memory: pool, Shm: pool.layout(), Secret: testSecret, TLS: server, Logger: discardLogger()})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go prod.Serve(ln)
	defer prod.Close()
	ci := smollm
	ci.EngineID = "bench-d"
	cons, err := NewConsumer(ConsumerConfig{Local: ci, Transport: tr, Secret: testSecret, TLS: client, Logger: discardLogger()})
	if err != nil {
		b.Fatal(err)
	}
	defer cons.Close()
	host, port := splitAddr(ln.Addr().String())
	dst := newLocalBlocks(len(ids), smollm.BlockBytes)
	per := len(ids) / streams
	iter := 0
	for b.Loop() {
		var wg sync.WaitGroup
		for s := range streams {
			req := fmt.Sprintf("r%d-%d", iter, s)
			part := ids[s*per : (s+1)*per]
			if err := prod.Hold(req, part, time.Now()); err != nil {
				b.Fatal(err)
			}
			wg.Go(func() {
				rp := RemoteParams{EngineID: "bench-p", RequestID: req, Host: host, Port: port, BlockIDs: part}
				if err := cons.Pull(b.Context(), rp, dst[s*per:(s+1)*per]); err != nil {
					b.Error(err)
				}
			})
		}
		wg.Wait()
		prod.TakeReleased()
		iter++
	}
}

// benchRawTCP writes the same block slices on a plain loopback connection
// (writev) and reads them into destination blocks: the ceiling for the TCP
// transport.
func benchRawTCP(b *testing.B, pool *testPool, ids []int) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var one [1]byte
		for {
			if _, err := io.ReadFull(c, one[:]); err != nil {
				return
			}
			bufs := make(net.Buffers, 0, len(ids))
			for _, id := range ids {
				bufs = append(bufs, pool.Block(id))
			}
			if _, err := bufs.WriteTo(c); err != nil {
				return
			}
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	dst := newLocalBlocks(len(ids), smollm.BlockBytes)
	for b.Loop() {
		c.Write([]byte{1})
		for i := range dst {
			if _, err := io.ReadFull(c, dst[i]); err != nil {
				b.Fatal(err)
			}
		}
	}
}
