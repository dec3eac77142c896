package sched

import (
	"github.com/tandem-serve/tandem/internal/kvcache"
	"github.com/tandem-serve/tandem/internal/kvlayout"
)

// KV-cache groups (vLLM's hybrid KV cache manager): a request has one block
// table per group; a full-attention group keeps every block, a
// sliding-window group only those its window can still see (see slide),
// and a prefix hit needs every group's blocks (see match).

// numGroups is the number of KV-cache groups of the pool.
func (s *Scheduler) numGroups() int { return max(1, len(s.cfg.GroupWindows)) }

// window is the attention window of group g (0: full attention).
func (s *Scheduler) window(g int) int {
	if g < len(s.cfg.GroupWindows) {
		return s.cfg.GroupWindows[g]
	}
	return 0
}

// held returns the entries of table t that are blocks (not null). It
// returns t itself when t has no null entry.
func held(t []int32) []int32 {
	i := 0
	for i < len(t) && t[i] == kvlayout.NullBlock {
		i++
	}
	return t[i:] // null entries are a prefix: those the window passed
}

// missing is how many blocks r's tables need to cover tokens when the
// next token computed is at position from (see grow).
func (s *Scheduler) missing(r *Request, from, tokens int) int {
	n, _ := s.grow(r.tables, from, tokens, nil)
	return n
}

// extend appends to tables (nil: none yet) the entries that make each
// group's cover tokens, taking blocks from ids in order, and returns the
// tables. len(ids) must be what missing counted.
func (s *Scheduler) extend(tables [][]int32, from, tokens int, ids []int32) [][]int32 {
	_, tables = s.grow(tables, from, tokens, ids)
	return tables
}

// grow counts the blocks that tables (nil: none yet) need to cover tokens
// when the next token computed is at position from and, with ids, appends
// them. A new entry wholly before what a sliding window reads from from on
// is null: a block a KV load skips (the window of the position after the
// load never reads it). Every other new entry takes the next id.
func (s *Scheduler) grow(tables [][]int32, from, tokens int, ids []int32) (int, [][]int32) {
	n := s.numGroups()
	have := 0
	if tables != nil {
		have = len(tables[0])
	} else if ids != nil {
		tables = make([][]int32, n)
	}
	want := s.blocksFor(tokens)
	bs := s.pool.BlockSize()
	count := 0
	for g := range n {
		first := kvlayout.FirstNeeded(s.window(g), from) / bs
		for i := have; i < want; i++ {
			id := kvlayout.NullBlock
			if i >= first {
				if ids != nil {
					id = ids[count]
				}
				count++
			}
			if ids != nil {
				tables[g] = append(tables[g], id)
			}
		}
	}
	return count, tables
}

// match finds the longest prefix of hashes (full blocks) cached in every
// group, after vLLM's find_longest_cache_hit: a full-attention group needs
// all k blocks of the prefix, a sliding-window group only those its window
// sees from position k·BlockSize (kvlayout.FirstNeeded). It returns k and
// one table of k entries per group, without taking references; a sliding
// group's entries before its window are kvlayout.NullBlock.
func (s *Scheduler) match(hashes []kvcache.BlockHash) (int, [][]int32) {
	n := s.numGroups()
	if n == 1 && s.window(0) == 0 {
		hit := s.pool.Match(hashes)
		return len(hit), [][]int32{hit}
	}
	k := len(hashes)
	for g := range n {
		if s.window(g) == 0 {
			k = min(k, len(s.pool.MatchGroup(g, hashes[:k])))
		}
	}
	bs := s.pool.BlockSize()
	for k > 0 {
		// The highest block some window at k misses: no prefix that
		// reaches past it can hit, so the next candidate ends there.
		miss := -1
		for g := range n {
			w := s.window(g)
			if w == 0 {
				continue
			}
			for j := k - 1; j >= kvlayout.FirstNeeded(w, k*bs)/bs; j-- {
				if _, ok := s.pool.Lookup(g, hashes[j]); !ok {
					miss = max(miss, j)
					break
				}
			}
		}
		if miss < 0 {
			break
		}
		k = miss
	}
	tables := make([][]int32, n)
	for g := range n {
		w := s.window(g)
		if w == 0 {
			tables[g] = s.pool.MatchGroup(g, hashes[:k])
			continue
		}
		t := make([]int32, k)
		first := kvlayout.FirstNeeded(w, k*bs) / bs
		for j := range k {
			t[j] = kvlayout.NullBlock
			if j >= first {
				t[j], _ = s.pool.Lookup(g, hashes[j])
			}
		}
		tables[g] = t
	}
	return k, tables
}

// slide frees the blocks of r's sliding-window groups that lie wholly
// before what the window reads from r's last computed token on (a decode
// engine that takes this KV recomputes the prompt's last token, so that
// token's window is kept too), and puts kvlayout.NullBlock in their place.
// A freed full block stays in the prefix cache (cacheFullBlocks ran
// first), for a later hit whose window ends there.
func (s *Scheduler) slide(r *Request) {
	bs := s.pool.BlockSize()
	for g, t := range r.tables {
		w := s.window(g)
		if w == 0 {
			continue
		}
		upto := min(kvlayout.FirstNeeded(w, max(r.numComputed-1, 0))/bs, len(t))
		lo := upto
		for lo > 0 && t[lo-1] != kvlayout.NullBlock {
			lo--
		}
		if lo == upto {
			continue
		}
		_ = s.pool.Free(t[lo:upto]) // each held exactly one reference
		for i := lo; i < upto; i++ {
			t[i] = kvlayout.NullBlock
		}
	}
}

// peakBlocks is the most blocks a request of tokens tokens holds at once
// (kvlayout.SeqBlocks).
func (s *Scheduler) peakBlocks(tokens int) int {
	return kvlayout.SeqBlocks(s.cfg.GroupWindows, s.pool.BlockSize(), tokens, s.cfg.MaxNumBatchedTokens)
}
