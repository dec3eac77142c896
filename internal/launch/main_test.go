package launch

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TestMain lets the test binary play other programs for the tests it
// starts as children: a fake `tandem` (TANDEM_UP_FAKE=tandem) and an idle
// multi-threaded Go process (TANDEM_UP_FAKE=sleep).
func TestMain(m *testing.M) {
	switch os.Getenv("TANDEM_UP_FAKE") {
	case "tandem":
		os.Exit(fakeTandem(os.Args[1:]))
	case "sleep":
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// fakeTandem implements just enough of `tandem serve --role` for the
// supervisor tests. TANDEM_UP_FAKE_DIE=<role> makes that role's engines fail
// at startup. TANDEM_UP_FAKE_HOLD=<dir> holds an engine back from binding
// its port while the file <dir>/<port> exists (for at most a minute): a
// test acts between an engine's exit and its restart (takes its port,
// serves while it is down) without racing the restart's backoff.
func fakeTandem(args []string) int {
	if len(args) == 0 || args[0] != "serve" {
		fmt.Fprintln(os.Stderr, "fake tandem: unsupported", args)
		return 2
	}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	role := fs.String("role", "", "")
	host := fs.String("host", "", "")
	port := fs.Int("port", 0, "")
	fs.Int("kv-port", 0, "")
	model := fs.String("model", "", "")
	fs.String("served-model-name", "", "")
	fs.Bool("extra", false, "")
	bidi := fs.Bool("kv-bidirectional", false, "")
	fs.String("kv-load-failure-policy", "", "")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	fmt.Fprintf(os.Stderr, "fake %s engine starting, GOMAXPROCS=%s, model %s\n", *role, os.Getenv("GOMAXPROCS"), *model)
	if os.Getenv("TANDEM_UP_FAKE_DIE") == *role {
		fmt.Fprintln(os.Stderr, "fatal: fake failure to load the model")
		return 3
	}
	if dir := os.Getenv("TANDEM_UP_FAKE_HOLD"); dir != "" {
		gate := filepath.Join(dir, strconv.Itoa(*port))
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if _, err := os.Stat(gate); errors.Is(err, os.ErrNotExist) {
				break
			}
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) {})
	mux.HandleFunc("/v1/completions", func(w http.ResponseWriter, r *http.Request) {
		var body map[string]json.RawMessage
		b, _ := io.ReadAll(r.Body)
		json.Unmarshal(b, &body)
		w.Header().Set("Content-Type", "application/json")
		var kv map[string]json.RawMessage
		json.Unmarshal(body["kv_transfer_params"], &kv)
		if *role == RolePrefill {
			// "history" tells the decode, and through its answer the test,
			// whether this leg carried a decode's params from a last turn.
			fmt.Fprintf(w, `{"choices":[{"text":"x"}],"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[[0]],"remote_engine_id":"p","remote_request_id":"r","remote_host":"127.0.0.1","remote_port":1,"history":%t}}`,
				kv["remote_blocks_expiry_time"] != nil)
			return
		}
		history := kv["history"]
		if history == nil {
			history = json.RawMessage("false")
		}
		held := ""
		if *bidi {
			held = fmt.Sprintf(`,"kv_transfer_params":{"do_remote_decode":true,"remote_block_ids":[[1]],"remote_engine_id":"d","remote_request_id":"r2","remote_host":"127.0.0.1","remote_port":2,"remote_blocks_expiry_time":%d}`,
				time.Now().Add(time.Minute).Unix())
		}
		fmt.Fprintf(w, `{"choices":[{"text":"story"}],"got_kv":%t,"history":%s%s}`, body["kv_transfer_params"] != nil, history, held)
	})
	srv := &http.Server{Addr: *host + ":" + strconv.Itoa(*port), Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	if err := srv.ListenAndServe(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}
