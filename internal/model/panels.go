package model

import (
	"unsafe"

	"github.com/tandem-serve/tandem/internal/hugemem"
	"github.com/tandem-serve/tandem/internal/tensor"
)

// packPanels stores the model's quantized matrices (Q8_0, Q4_0, Q5_0, Q4_K,
// Q5_K, Q6_K) as the quantized kernels' panels where this CPU's kernels
// read them (tensor.PackPanels): decode then streams them at ~90% of the
// read limit where the one-row kernels over ggml's rows read
// 56–83% (Zen 4; docs/performance-log.md, 2026-12-06), and prefill skips
// its pack, with the same bits. The panels take one hugemem mapping (Q8_0
// 6% more than the blocks, Q4_K 2.8%, Q5_K 2.3%, Q6_K 1%, Q4_0 and Q5_0
// none); the loaded file's pages that held those matrices are released. Call it after the fingerprint, which hashes the
// file's bytes.
func (m *Model) packPanels() error {
	if keepRows {
		return nil
	}
	type slot struct {
		mats []*tensor.Mat // the Mats sharing these weights (a tied lm_head is the embedding)
		size int
	}
	var order []*slot
	byData := map[*byte]*slot{}
	m.eachMat(func(w *tensor.Mat) {
		n := tensor.PanelBytes(w)
		if n == 0 {
			return
		}
		key := unsafe.SliceData(w.Q)
		s := byData[key]
		if s == nil {
			s = &slot{size: n}
			byData[key] = s
			order = append(order, s)
		}
		s.mats = append(s.mats, w)
	})
	if len(order) == 0 {
		return nil
	}
	total := 0
	for _, s := range order {
		total += (s.size + 63) &^ 63
	}
	mem, err := hugemem.Map(total)
	if err != nil {
		return err
	}
	m.panelMem = mem // Close unmaps it, whatever happens below
	off := 0
	for _, s := range order {
		orig := s.mats[0].Q
		pm, err := tensor.PackPanels(s.mats[0], mem[off:off+s.size:off+s.size])
		if err != nil {
			return err // the caller closes the model
		}
		for _, w := range s.mats {
			*w = *pm
		}
		_ = hugemem.Discard(orig) // the panels hold them now
		off += (s.size + 63) &^ 63
	}
	return hugemem.Protect(mem)
}

// keepRows turns packPanels off, for tests that compare a model's outputs
// with its matrices as panels and as rows.
var keepRows = false

// eachMat calls fn with every weight matrix of the model (the embedding and
// a tied lm_head each, though they share their weights).
func (m *Model) eachMat(fn func(*tensor.Mat)) {
	fn(&m.embed)
	fn(&m.lmHead)
	group := func(g *linearGroup) {
		for i := range g.mats {
			fn(&g.mats[i])
		}
	}
	for i := range m.layers {
		l := &m.layers[i]
		group(&l.qkv)
		fn(&l.o)
		group(&l.gateUp)
		fn(&l.down)
		if l.moe != nil {
			fn(&l.moe.router)
			for e := range l.moe.experts {
				group(&l.moe.experts[e].gateUp)
				fn(&l.moe.experts[e].down)
			}
		}
	}
}
