package kvxfer

import (
	"context"
	"maps"
	"net"
	"slices"
	"strconv"
	"time"
)

func (c *Consumer) heartbeatInterval(p *peerState) time.Duration {
	if c.cfg.HeartbeatInterval > 0 {
		return c.cfg.HeartbeatInterval
	}
	if p.info != nil && p.info.Lease > 0 {
		return p.info.Lease / 6
	}
	return DefaultLease / 6
}

// heartbeatLoop sends, per producer, one HEARTBEAT covering all its watched
// requests every heartbeat interval, and forgets producers idle longer than
// EngineTTL.
func (c *Consumer) heartbeatLoop() {
	defer c.wg.Done()
	tick := time.Second
	if hi := c.cfg.HeartbeatInterval; hi > 0 && hi < tick {
		tick = hi
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
			c.heartbeatTick(time.Now())
		}
	}
}

func (c *Consumer) heartbeatTick(now time.Time) {
	c.mu.Lock()
	peers := slices.Collect(maps.Values(c.peers))
	c.mu.Unlock()
	for _, p := range peers {
		p.mu.Lock()
		if len(p.watched) == 0 {
			idle := !p.hbBusy && p.checkedOut == 0 && !p.handshaking && now.Sub(p.lastUsed) > c.cfg.EngineTTL
			p.mu.Unlock()
			if c.cfg.EngineTTL > 0 && idle {
				c.dropPeer(p, "unused for longer than the engine TTL")
			}
			continue
		}
		if p.hbBusy || now.Before(p.nextHB) {
			p.mu.Unlock()
			continue
		}
		ids := slices.Sorted(maps.Keys(p.watched))
		p.hbBusy = true
		p.nextHB = now.Add(c.heartbeatInterval(p))
		peer := Peer{EngineID: p.id}
		peer.Host, peer.Port = splitAddr(p.addr)
		p.mu.Unlock()
		c.wg.Add(1)
		go c.sendHeartbeat(p, peer, ids)
	}
}

// heartbeatChunkBytes bounds one HEARTBEAT's payload, well under
// MaxControlPayload.
const heartbeatChunkBytes = 256 << 10

// heartbeatChunks splits ids into runs whose encoded HEARTBEAT payload
// (u32 count, then u16 length + bytes per id) stays within limit bytes.
func heartbeatChunks(ids []string, limit int) [][]string {
	var out [][]string
	start, size := 0, 4
	for i, id := range ids {
		n := 2 + len(id)
		if i > start && size+n > limit {
			out = append(out, ids[start:i])
			start, size = i, 4
		}
		size += n
	}
	if start < len(ids) {
		out = append(out, ids[start:])
	}
	return out
}

func splitAddr(addr string) (string, int) {
	h, ps, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(ps)
	return h, port
}

// sendHeartbeat sends one HEARTBEAT. Failures are logged, not fatal: the
// lease still runs, and the next heartbeat may get through.
func (c *Consumer) sendHeartbeat(p *peerState, peer Peer, ids []string) {
	defer c.wg.Done()
	defer func() {
		p.mu.Lock()
		p.hbBusy = false
		p.mu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(c.base, c.cfg.IOTimeout)
	defer cancel()
	var notHeld []string
	err := c.withConn(ctx, peer, func(_ *peerState, cn *pconn) error {
		// One frame per chunk: however many requests queue here, no
		// HEARTBEAT exceeds the producer's control-frame limit.
		for _, chunk := range heartbeatChunks(ids, heartbeatChunkBytes) {
			_, payload, err := cn.roundTrip(ctx, c, msgHeartbeat, msgAck, func(b []byte) []byte { return appendIDs(b, chunk) })
			if err != nil {
				return err
			}
			nh, err := decodeIDs(payload)
			if err != nil {
				return err
			}
			notHeld = append(notHeld, nh...)
		}
		return nil
	})
	if err != nil {
		c.log.Warn("kv heartbeat failed; the prefill's leases keep running", "remote_engine_id", p.id, "remote_addr", p.addr, "requests", len(ids), "err", err)
		return
	}
	if len(notHeld) > 0 {
		// The producer already freed them: a pull will fail with
		// ErrNotHeld. Stop renewing.
		c.log.Warn("prefill no longer holds requests being heartbeated", "remote_engine_id", p.id, "requests", notHeld)
		p.mu.Lock()
		for _, id := range notHeld {
			delete(p.watched, id)
		}
		p.mu.Unlock()
	}
}
