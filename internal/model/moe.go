package model

import (
	"fmt"

	"github.com/tandem-serve/tandem/internal/tensor"
)

// moeLayer is the sparse feed-forward block of a mixture-of-experts layer:
// a router and Experts SwiGLU networks of width MoE.Intermediate.
type moeLayer struct {
	router  tensor.Mat // [Experts, Hidden]
	experts []expertFFN
}

// expertFFN is one expert: down(SiLU(gate·x) ⊙ up·x).
type expertFFN struct {
	gateUp linearGroup // gate, up
	down   tensor.Mat
}

// moeNames are the Hugging Face tensor names of one model type's sparse
// block, relative to the layer's prefix: the router, and the format (of
// the expert's index) of each expert's prefix with its gate, up and down
// matrices.
type moeNames struct {
	router, expert, gate, up, down string
}

// moeNamesOf is the name table of each model type with sparse layers.
var moeNamesOf = map[string]moeNames{
	"qwen3_moe": {router: "mlp.gate.weight", expert: "mlp.experts.%d.", gate: "gate_proj.weight", up: "up_proj.weight", down: "down_proj.weight"},
	"mixtral":   {router: "block_sparse_moe.gate.weight", expert: "block_sparse_moe.experts.%d.", gate: "w1.weight", up: "w3.weight", down: "w2.weight"},
}

// bindMoE binds the router and experts of the layer whose tensor names
// start with p, named as moeNamesOf says for the model type (Qwen3-MoE:
// mlp.gate is the router, mlp.experts.E.{gate,up,down}_proj the experts;
// Mixtral: block_sparse_moe.gate and block_sparse_moe.experts.E.{w1,w3,w2}).
func bindMoE(b *binder, c *Config, p string) (*moeLayer, error) {
	e := &c.MoE
	names, ok := moeNamesOf[c.ModelType]
	if !ok {
		return nil, fmt.Errorf("model: model type %s has no mixture-of-experts tensor names", c.ModelType)
	}
	router, err := b.matrix(p+names.router, e.Experts, c.Hidden)
	if err != nil {
		return nil, err
	}
	ml := &moeLayer{router: router, experts: make([]expertFFN, e.Experts)}
	for x := range ml.experts {
		q := p + fmt.Sprintf(names.expert, x)
		gate, err := b.matrix(q+names.gate, e.Intermediate, c.Hidden)
		if err != nil {
			return nil, err
		}
		up, err := b.matrix(q+names.up, e.Intermediate, c.Hidden)
		if err != nil {
			return nil, err
		}
		down, err := b.matrix(q+names.down, c.Hidden, e.Intermediate)
		if err != nil {
			return nil, err
		}
		ml.experts[x] = expertFFN{gateUp: b.newLinearGroup(gate, up), down: down}
	}
	return ml, nil
}

// moeScratch holds the routing and the per-expert activations of one
// sparse layer, reused across layers and calls.
type moeScratch struct {
	logits []float32 // [T, Experts] router logits, then probabilities
	sel    []int32   // [T, TopK] chosen experts of each token, by expert id
	weight []float32 // [T, TopK] their weights
	slots  [][]int32 // per expert: the (token·TopK + rank) slots routed to it, in token order
	x      []float32 // [n, Hidden] the inputs of one expert's tokens
	gu     []float32 // [n, gate/up width]
	h      []float32 // [n, MoE.Intermediate]
	y      []float32 // [n, Hidden]
	out    []float32 // [T·TopK, Hidden] every slot's expert output
}

// moeFFN computes the sparse feed-forward block of l for the T rows of
// m.s.xn into m.s.tmp.
//
// Each token's router row is one matmul row; its softmax, top-k choice and
// weights are computed from that row alone. The tokens routed to an expert
// are gathered and run through it as one matmul per weight, which reads
// only the experts some token chose (a decode step of one sequence reads
// TopK experts). The kernels compute every output row from its input row
// alone, whatever the other rows of the call, so gathering changes no
// result. Each token then sums its experts' weighted outputs in expert-id
// order (transformers' order), starting from zero: its output is the same
// bits alone or in any batch.
func (m *Model) moeFFN(l *layer, T int) {
	c := &m.cfg
	s := &m.s
	ms := &s.moe
	H, E, K, F := c.Hidden, c.MoE.Experts, c.MoE.TopK, c.MoE.Intermediate
	ml := l.moe

	ms.logits = grow(ms.logits, T*E)
	m.matmul(ms.logits, s.xn, T, &ml.router)
	if cap(ms.sel) < T*K {
		ms.sel = make([]int32, T*K)
	}
	ms.sel = ms.sel[:T*K]
	ms.weight = grow(ms.weight, T*K)
	m.rows(T, parallelHotRows, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			route(ms.logits[t*E:(t+1)*E], ms.sel[t*K:(t+1)*K], ms.weight[t*K:(t+1)*K], c.MoE.NormTopK)
		}
	})

	if len(ms.slots) < E {
		ms.slots = make([][]int32, E)
	}
	for x := range ms.slots[:E] {
		ms.slots[x] = ms.slots[x][:0]
	}
	for i, x := range ms.sel {
		ms.slots[x] = append(ms.slots[x], int32(i))
	}
	ms.out = grow(ms.out, T*K*H)
	for x := range E {
		slots := ms.slots[x]
		n := len(slots)
		if n == 0 {
			continue
		}
		ex := &ml.experts[x]
		ms.x = grow(ms.x, n*H)
		for i, slot := range slots {
			t := int(slot) / K
			copy(ms.x[i*H:(i+1)*H], s.xn[t*H:(t+1)*H])
		}
		ms.gu = m.runGroup(&ex.gateUp, ms.gu, ms.x, n)
		ms.h = grow(ms.h, n*F)
		gu := &ex.gateUp
		m.rows(n, parallelHotRows, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				row := ms.gu[i*gu.width : (i+1)*gu.width]
				h := ms.h[i*F : (i+1)*F]
				copy(h, row[gu.off[0]:gu.off[0]+F])
				tensor.SiLUMul(h, row[gu.off[1]:gu.off[1]+F])
			}
		})
		ms.y = grow(ms.y, n*H)
		m.matmul(ms.y, ms.h, n, &ex.down)
		for i, slot := range slots {
			copy(ms.out[int(slot)*H:(int(slot)+1)*H], ms.y[i*H:(i+1)*H])
		}
	}

	m.rows(T, parallelHotRows, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			acc := s.tmp[t*H : (t+1)*H]
			clear(acc)
			for r := range K {
				w := ms.weight[t*K+r]
				y := ms.out[(t*K+r)*H : (t*K+r+1)*H]
				for j, v := range y {
					// The conversion rounds the product on its own, as
					// transformers does, rather than fusing it into the
					// addition.
					acc[j] += float32(v * w)
				}
			}
		}
	})
}

// route turns one token's router logits into its experts and weights, as
// transformers' Qwen3-MoE and Mixtral routers do: softmax over all experts in f32, the
// k largest probabilities (ties to the lower expert id), divided by their
// sum when normTopK. sel and weight receive the chosen experts sorted by
// id (the order their outputs are summed in) and their weights. logits is
// overwritten.
func route(logits []float32, sel []int32, weight []float32, normTopK bool) {
	const taken = -1 // no probability
	tensor.Softmax(logits)
	k := len(sel)
	for r := range k {
		best := -1
		for x, p := range logits {
			if p != taken && (best < 0 || p > logits[best]) {
				best = x
			}
		}
		sel[r], weight[r] = int32(best), logits[best]
		logits[best] = taken
	}
	if normTopK {
		var sum float32
		for _, w := range weight {
			sum += w
		}
		for r := range weight {
			weight[r] /= sum
		}
	}
	// Sort by expert id, carrying the weights (k is small).
	for i := 1; i < k; i++ {
		for j := i; j > 0 && sel[j] < sel[j-1]; j-- {
			sel[j], sel[j-1] = sel[j-1], sel[j]
			weight[j], weight[j-1] = weight[j-1], weight[j]
		}
	}
}
