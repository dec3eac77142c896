package kvxfer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// testHookShmCopied, if set, runs between the copy out of the mapping and
// the generation re-check (tests reuse a block there).
var testHookShmCopied func(reqID string)

// pconn is one consumer-side connection to a producer. Requests on it are
// strictly one at a time; concurrency comes from several connections.
type pconn struct {
	net.Conn
	hb [headerSize]byte

	mu       sync.Mutex
	canceled bool

	// broken: the stream is out of sync (partial frame, protocol
	// violation); never reuse it.
	broken bool
	// progress: a response byte arrived since the connection was taken
	// from the pool (a retry would not be safe to call stale).
	progress bool
	// idleSince is when it last went into the pool.
	idleSince time.Time
	// clock is the clock sample taken during the handshake.
	clock clockSample
}

// setDeadline sets the read and write deadline d from now, unless the
// connection was canceled: cancellation must stick even if it races with a
// deadline refresh.
func (cn *pconn) setDeadline(d time.Duration) {
	cn.mu.Lock()
	if !cn.canceled {
		cn.Conn.SetDeadline(time.Now().Add(d))
	}
	cn.mu.Unlock()
}

// cancel makes every pending and future I/O on the connection fail at once.
func (cn *pconn) cancel() {
	cn.mu.Lock()
	cn.canceled = true
	cn.Conn.SetDeadline(time.Unix(1, 0))
	cn.mu.Unlock()
}

func (cn *pconn) isCanceled() bool {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	return cn.canceled
}

// ioErr turns an I/O failure into the error to return: the context's, when
// it caused the failure by canceling the connection.
func (cn *pconn) ioErr(ctx context.Context, op string, err error) error {
	cn.broken = true
	if ctx.Err() != nil {
		return fmt.Errorf("kv %s: %w", op, context.Cause(ctx))
	}
	return fmt.Errorf("kv %s: %w", op, err)
}

// roundTrip sends one control request and reads its response, which must
// have type want or be an ERROR (returned as *RemoteError). The call is
// bounded by the consumer's IOTimeout and by ctx.
func (cn *pconn) roundTrip(ctx context.Context, c *Consumer, t, want msgType, enc func([]byte) []byte) (header, []byte, error) {
	stop := context.AfterFunc(ctx, cn.cancel)
	defer stop()
	corr := c.corr.Add(1)
	cn.setDeadline(c.cfg.IOTimeout)
	if _, err := cn.Write(frame(t, corr, enc)); err != nil {
		return header{}, nil, cn.ioErr(ctx, t.String(), err)
	}
	return cn.readResponse(ctx, corr, t, want)
}

// readResponse reads one control frame answering request corr of type t.
func (cn *pconn) readResponse(ctx context.Context, corr uint64, t, want msgType) (header, []byte, error) {
	h, payload, err := readControl(cn)
	if err != nil {
		if errors.Is(err, errBadFrame) {
			cn.broken = true
			return h, nil, fmt.Errorf("%w: answer to %s: %w", ErrProtocol, t, err)
		}
		return h, nil, cn.ioErr(ctx, t.String()+" response", err)
	}
	cn.progress = true
	return h, payload, cn.checkResponse(h, payload, corr, t, want)
}

func (cn *pconn) checkResponse(h header, payload []byte, corr uint64, t, want msgType) error {
	if h.Corr != corr && !(h.Type == msgError && h.Corr == 0) {
		cn.broken = true
		return fmt.Errorf("%w: answer to %s #%d carries correlation id %d", ErrProtocol, t, corr, h.Corr)
	}
	switch h.Type {
	case want:
		return nil
	case msgError:
		re := decodeError(payload)
		if re.Code == CodeBadFrame || re.Code == CodeVersion || h.Corr == 0 {
			cn.broken = true
		}
		return re
	}
	cn.broken = true
	return fmt.Errorf("%w: %s answered with %s, want %s", ErrProtocol, t, h.Type, want)
}

// pullTCP sends READ and reads one DATA frame per block straight into dst,
// then READ_DONE. The per-read deadline bounds a stall, so a dead or hung
// producer fails the pull within IOTimeout.
func (c *Consumer) pullTCP(ctx context.Context, cn *pconn, r RemoteParams, dst [][]byte) error {
	stop := context.AfterFunc(ctx, cn.cancel)
	defer stop()
	corr := c.corr.Add(1)
	cn.setDeadline(c.cfg.IOTimeout)
	req := blockRequest{RequestID: r.RequestID, Blocks: r.BlockIDs}
	if _, err := cn.Write(frame(msgRead, corr, func(b []byte) []byte { return appendBlockRequest(b, &req) })); err != nil {
		return cn.ioErr(ctx, "READ", err)
	}
	for i := range dst {
		cn.setDeadline(c.cfg.IOTimeout)
		h, err := readHeader(cn, &cn.hb)
		if err != nil {
			if errors.Is(err, errBadFrame) {
				cn.broken = true
				return fmt.Errorf("%w: DATA for request %q: %w", ErrProtocol, r.RequestID, err)
			}
			return cn.ioErr(ctx, fmt.Sprintf("read of block %d/%d of request %q from prefill engine %s", i+1, len(dst), r.RequestID, r.EngineID), err)
		}
		cn.progress = true
		if h.Type != msgData {
			if h.Len > MaxControlPayload {
				cn.broken = true
				return fmt.Errorf("%w: oversized %s frame", ErrProtocol, h.Type)
			}
			payload := make([]byte, h.Len)
			if _, err := io.ReadFull(cn, payload); err != nil {
				return cn.ioErr(ctx, "READ response", err)
			}
			if err := cn.checkResponse(h, payload, corr, msgRead, msgData); err != nil {
				return fmt.Errorf("kv read of request %q from prefill engine %s: %w", r.RequestID, r.EngineID, err)
			}
		}
		if h.Corr != corr || int64(h.Len) != int64(len(dst[i])) {
			cn.broken = true
			return fmt.Errorf("%w: DATA frame #%d (%d bytes) for READ #%d of %d-byte blocks", ErrProtocol, h.Corr, h.Len, corr, len(dst[i]))
		}
		if _, err := io.ReadFull(cn, dst[i]); err != nil {
			return cn.ioErr(ctx, fmt.Sprintf("read of block %d/%d of request %q from prefill engine %s", i+1, len(dst), r.RequestID, r.EngineID), err)
		}
	}
	_, _, err := cn.readResponse(ctx, corr, msgRead, msgReadDone)
	if err != nil {
		return fmt.Errorf("kv read of request %q from prefill engine %s: %w", r.RequestID, r.EngineID, err)
	}
	return nil
}

// pullShm asks the producer to validate the lease and name the blocks'
// generations, copies the blocks from the mapping of its pool, and re-reads
// the generations: a block reused meanwhile fails the pull rather than
// yielding silently wrong KV.
func (c *Consumer) pullShm(ctx context.Context, m *shmMapping, cn *pconn, r RemoteParams, dst [][]byte) error {
	req := blockRequest{RequestID: r.RequestID, Blocks: r.BlockIDs}
	_, payload, err := cn.roundTrip(ctx, c, msgShmRead, msgShmGens, func(b []byte) []byte { return appendBlockRequest(b, &req) })
	if err != nil {
		return fmt.Errorf("kv shared-memory read of request %q from prefill engine %s: %w", r.RequestID, r.EngineID, err)
	}
	gens, err := decodeGens(payload)
	if err == nil && len(gens) != len(dst) {
		err = fmt.Errorf("%w: %d generations for %d blocks", errBadFrame, len(gens), len(dst))
	}
	if err != nil {
		cn.broken = true
		return fmt.Errorf("%w: SHM_GENS for request %q: %w", ErrProtocol, r.RequestID, err)
	}
	for _, id := range r.BlockIDs {
		if id < 0 || id >= m.numBlocks {
			return fmt.Errorf("%w: block id %d of request %q is outside prefill engine %s's pool of %d blocks", ErrBadBlock, id, r.RequestID, r.EngineID, m.numBlocks)
		}
	}
	if !m.acquire() {
		return fmt.Errorf("%w: prefill engine %s was forgotten during the read (restart or shutdown)", ErrPeerRestarted, r.EngineID)
	}
	defer m.release()
	for i, id := range r.BlockIDs {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("kv shared-memory read of request %q: %w", r.RequestID, context.Cause(ctx))
		}
		if err := m.copyBlock(dst[i], id); err != nil {
			return fmt.Errorf("kv shared-memory read of request %q from prefill engine %s: %w", r.RequestID, r.EngineID, err)
		}
	}
	if testHookShmCopied != nil {
		testHookShmCopied(r.RequestID)
	}
	for i, id := range r.BlockIDs {
		if g := m.generation(id); g != gens[i] {
			return fmt.Errorf("%w: block %d of request %q on prefill engine %s went from generation %d to %d while it was copied (its lease ended early); the pulled KV is invalid", ErrGenerationChanged, id, r.RequestID, r.EngineID, gens[i], g)
		}
	}
	return nil
}
