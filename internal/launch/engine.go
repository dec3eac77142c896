package launch

import (
	"fmt"
	"net"
	"strconv"
)

// Engine roles, as `tandem serve --role` spells them.
const (
	RolePrefill = "prefill"
	RoleDecode  = "decode"
	// RoleBoth serves either kind per request: what every engine runs
	// under the planner, which moves engines between the proxy's pools.
	RoleBoth = "both"
)

// EngineSpec is one engine process to start.
type EngineSpec struct {
	Name   string // "prefill-0", "decode-1", ...: the log prefix
	Role   string // RolePrefill or RoleDecode
	Host   string
	Port   int   // HTTP API port
	KVPort int   // KV side-channel port
	CPUs   []int // cores the process is pinned to
}

// URL is the engine's base URL.
func (e EngineSpec) URL() string {
	return "http://" + net.JoinHostPort(e.Host, strconv.Itoa(e.Port))
}

// ServeArgs is the command line (after the executable) that starts e:
// `serve --model DIR --role R --host H --port P --kv-port K
// --served-model-name NAME` followed by extra, the flags given after `--`
// to `tandem up`, so that they can override any of the above.
func ServeArgs(e EngineSpec, modelDir, servedName string, extra []string) []string {
	args := []string{
		"serve",
		"--model", modelDir,
		"--role", e.Role,
		"--host", e.Host,
		"--port", strconv.Itoa(e.Port),
		"--kv-port", strconv.Itoa(e.KVPort),
		"--served-model-name", servedName,
	}
	return append(args, extra...)
}

// Env is the environment of e's process: the parent's, plus GOMAXPROCS
// matching its cores, so its compute threads (--threads defaults to
// GOMAXPROCS) are as many as its cores; tandem serve then adds one P for
// its I/O goroutines (see reserveIOProc in cmd/tandem).
func Env(e EngineSpec, parent []string) []string {
	return append(append([]string(nil), parent...), "GOMAXPROCS="+strconv.Itoa(max(1, len(e.CPUs))))
}

// PlanEngines names the engines, gives each two ports and its cores.
func PlanEngines(host string, prefill, decode int, cores [][]int, ports []int) ([]EngineSpec, error) {
	n := prefill + decode
	if len(cores) != n || len(ports) != 2*n {
		return nil, fmt.Errorf("planning %d engines with %d core sets and %d ports", n, len(cores), len(ports))
	}
	specs := make([]EngineSpec, 0, n)
	for i := range n {
		role, idx := RolePrefill, i
		if i >= prefill {
			role, idx = RoleDecode, i-prefill
		}
		specs = append(specs, EngineSpec{
			Name:   fmt.Sprintf("%s-%d", role, idx),
			Role:   role,
			Host:   host,
			Port:   ports[2*i],
			KVPort: ports[2*i+1],
			CPUs:   cores[i],
		})
	}
	return specs, nil
}
