package proxy

import (
	"fmt"
	"strconv"
	"strings"
)

// engineInfo is what an engine's tandem:engine_info says: its --role and
// --max-num-batched-tokens (zero values when it publishes none: a vLLM
// engine, or a tandem serve older than the label).
type engineInfo struct {
	role       string
	maxBatched int
}

// parseEngineInfo reads the labels ({k="v",...}) of tandem:engine_info.
func parseEngineInfo(labels string) engineInfo {
	var in engineInfo
	for _, kv := range strings.Split(strings.Trim(labels, "{}"), ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			continue
		}
		v = strings.Trim(v, `"`)
		switch strings.TrimSpace(k) {
		case "role":
			in.role = v
		case "max_num_batched_tokens":
			in.maxBatched, _ = strconv.Atoi(v)
		}
	}
	return in
}

// roleBoth is the engine role the planner may move between the pools.
const roleBoth = "both"

// pinnedWhy says why the planner leaves an engine in its pool, "" when it
// may move it: only an engine that serves both roles (tandem serve --role
// both, the default) can take the other pool's legs.
func pinnedWhy(role string) string {
	switch role {
	case roleBoth:
		return ""
	case "":
		return "its role is unknown: it publishes no tandem:engine_info (start it with tandem serve --role both to let the planner move it)"
	}
	return fmt.Sprintf("it runs with --role %s: only --role both engines serve either pool's legs", role)
}

// pinned lists the engines of the pools the planner may not move, with
// why, and how many of each pool they are.
func (p *Proxy) pinned() (why map[string]string, prefill, decode int) {
	why = map[string]string{}
	for _, pl := range []*pool{p.prefill, p.decode} {
		for _, b := range pl.list() {
			p.plan.mu.Lock()
			w := pinnedWhy(p.plan.roles[b.base])
			p.plan.mu.Unlock()
			if w == "" {
				continue
			}
			why[b.base] = w
			if pl == p.prefill {
				prefill++
			} else {
				decode++
			}
		}
	}
	return why, prefill, decode
}
