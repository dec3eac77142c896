package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"go.yaml.in/yaml/v3"
	"k8s.io/klog/v2"

	"github.com/tandem-serve/tandem/internal/kubediscovery"
	"github.com/tandem-serve/tandem/internal/openai"
	"github.com/tandem-serve/tandem/internal/planner"
	"github.com/tandem-serve/tandem/internal/proxy"
	"github.com/tandem-serve/tandem/internal/router/factory"
	"github.com/tandem-serve/tandem/internal/router/kvindex"
	"github.com/tandem-serve/tandem/internal/tokenizer"
)

// urlList is a flag holding a comma-separated list of URLs; repeating the
// flag appends.
type urlList []string

func (l *urlList) String() string { return strings.Join(*l, ",") }

func (l *urlList) Set(v string) error {
	for s := range strings.SplitSeq(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

// backendAPIKeyEnv is the environment variable behind --backend-api-key.
const backendAPIKeyEnv = "TANDEM_BACKEND_API_KEY"

// proxyFlags is the parsed command line of `tandem proxy`.
type proxyFlags struct {
	cfg   proxy.Config
	host  string
	port  int
	model string // directory with the model's tokenizer files
	// kvEvents are "DECODE_URL=tcp://host:pub[,tcp://host:replay]" entries.
	kvEvents    urlList
	kvPattern   string // --kv-events-pattern
	fingerprint string
	kube        kubeFlags
	otlp        string // --otlp-traces-endpoint
	plan        *plannerFlags
	// scale turns on the planner's Kubernetes scaling of the two
	// Deployments, scalePrefill and scaleDecode.
	scale                     bool
	scalePrefill, scaleDecode string
}

// Discovery modes of --discovery.
const (
	discoveryStatic     = "static"
	discoveryKubernetes = "kubernetes"
)

// kubeFlags are the Kubernetes discovery flags of `tandem proxy`.
type kubeFlags struct {
	discovery                       string
	namespace                       string
	prefillService, decodeService   string
	prefillSelector, decodeSelector string
	portName                        string
	kubeconfig                      string
}

// pools returns the discovery pools the flags name, checking that each role
// has a Service or a selector, not both.
func (k *kubeFlags) pools() ([]kubediscovery.Pool, error) {
	var out []kubediscovery.Pool
	for _, r := range []struct{ role, service, selector string }{
		{kubediscovery.RolePrefill, k.prefillService, k.prefillSelector},
		{kubediscovery.RoleDecode, k.decodeService, k.decodeSelector},
	} {
		sel := r.selector
		switch {
		case r.service != "" && r.selector != "":
			return nil, fmt.Errorf("give --%s-service or --%s-selector, not both", r.role, r.role)
		case r.service != "":
			sel = kubediscovery.ServiceSelector(r.service)
		case r.selector == "":
			return nil, fmt.Errorf("--discovery kubernetes needs --%s-service NAME or --%s-selector LABELS", r.role, r.role)
		}
		out = append(out, kubediscovery.Pool{Role: r.role, Selector: sel, PortName: k.portName})
	}
	return out, nil
}

// parseProxyFlags parses the flags of `tandem proxy`.
func parseProxyFlags(args []string) (*proxyFlags, error) {
	fs := flag.NewFlagSet("tandem proxy", flag.ContinueOnError)
	f := &proxyFlags{}
	cfg := &f.cfg
	var prefill, decode urlList
	fs.Var(&prefill, "prefill", "prefill engine URL(s), comma-separated or repeated (with --discovery static and no --backends-file, none runs colocated: every decode prefills its own prompts, under --pd-decider conditional or priced; with --discovery kubernetes they serve until the first EndpointSlice list)")
	fs.Var(&decode, "decode", "decode engine URL(s), comma-separated or repeated (as --prefill)")
	k := &f.kube
	fs.StringVar(&k.discovery, "discovery", discoveryStatic, "where the engines come from: static (--prefill/--decode, --backends-file, the admin endpoint) or kubernetes (the ready endpoints of EndpointSlices, watched: pods that come, go or turn unready are added and removed without a restart)")
	fs.StringVar(&k.namespace, "kube-namespace", "", "kubernetes discovery: the namespace of the EndpointSlices (default: the pod's own namespace, else default)")
	fs.StringVar(&k.prefillService, "prefill-service", "", "kubernetes discovery: the Service of the prefill engines (its EndpointSlices, label "+kubediscovery.ServiceNameLabel+"=NAME)")
	fs.StringVar(&k.decodeService, "decode-service", "", "kubernetes discovery: the Service of the decode engines")
	fs.StringVar(&k.prefillSelector, "prefill-selector", "", "kubernetes discovery: a label selector on EndpointSlices for the prefill engines, in place of --prefill-service (e.g. app=tandem,role=prefill)")
	fs.StringVar(&k.decodeSelector, "decode-selector", "", "kubernetes discovery: a label selector on EndpointSlices for the decode engines, in place of --decode-service")
	fs.StringVar(&k.portName, "kube-port-name", kubediscovery.DefaultPortName, "kubernetes discovery: the name of the EndpointSlice port the engines serve HTTP on (\""+kubediscovery.UnnamedPort+"\" for a Service's single unnamed port)")
	fs.StringVar(&k.kubeconfig, "kubeconfig", "", "kubernetes discovery: kubeconfig file of the API client (default: the pod's in-cluster service account, else $KUBECONFIG, else ~/.kube/config); the identity needs list and watch on endpointslices.discovery.k8s.io in the namespace")
	fs.StringVar(&f.host, "host", "127.0.0.1", "address to listen on")
	registerOTLPFlag(fs, &f.otlp)
	fs.IntVar(&f.port, "port", 8000, "port to listen on")
	fs.StringVar(&cfg.Policy, "policy", proxy.DefaultPolicy, "backend picking policy for both pools: "+strings.Join(proxy.Policies(), ", ")+" (see docs/usage/routing.md)")
	fs.StringVar(&cfg.PDDecider, "pd-decider", proxy.DefaultPDDecider, "disaggregation decider: always (every prompt prefilled remotely), conditional (remote only when the uncached prompt is long; see --pd-threshold) or priced (remote or local by the engines' measured queues, prefill rates and KV transfer rate, against --pd-ttft-slo; see docs/usage/routing.md)")
	fs.IntVar(&cfg.Router.Threshold, "pd-threshold", 256, "conditional decider: uncached prompt tokens on the chosen decode from which the prefill goes remote")
	fs.DurationVar(&cfg.Router.TTFTObjective, "pd-ttft-slo", 0, "priced decider: the time to first token a request should meet; of remote and local prefill it takes the one estimated within it, the cheaper when both are (default 2s; with the planner on, its --slo-ttft)")
	fs.DurationVar(&cfg.Router.TPOTObjective, "pd-tpot-slo", 0, "priced decider: the time per output token the decodes' streams should meet; a local prefill that would stall them past it is not taken (default 100ms; with the planner on, its --slo-tpot)")
	fs.IntVar(&cfg.Router.MustRemote, "pd-must-remote", 0, "conditional decider: prompt tokens from which the prefill always goes remote (0: off)")
	fs.Float64Var(&cfg.Router.DecodeKVPressure, "pd-decode-kv-pressure", 0, "conditional decider: decode KV usage (0..1) from which the prefill goes remote (0: off)")
	fs.Int64Var(&cfg.Router.MaxInFlight, "max-in-flight", 0, "requests the proxy sends one engine at most; beyond, requests queue (--queue-timeout) then get 429 (0: no limit)")
	fs.Float64Var(&cfg.Router.MaxWaiting, "max-waiting", 0, "an engine whose scraped vllm:num_requests_waiting reaches this is saturated (0: off)")
	fs.Float64Var(&cfg.Router.MaxKVUsage, "max-kv-usage", 0, "an engine whose scraped vllm:kv_cache_usage_perc reaches this (0..1) is saturated (0: off)")
	fs.DurationVar(&cfg.QueueTimeout, "queue-timeout", 0, "how long a request waits when every engine is saturated before 429 (default 2s)")
	fs.IntVar(&cfg.MaxQueue, "max-queue", 0, "requests waiting at most when every engine is saturated (default 1024)")
	fs.DurationVar(&cfg.ScrapeInterval, "scrape-interval", 0, "period of scraping each engine's /metrics for queue and KV usage (default 250ms; negative: off)")
	fs.DurationVar(&cfg.ScrapeTimeout, "scrape-timeout", 0, "limit on one scrape of an engine's /metrics, independent of --scrape-interval (default 2s: a busy engine answers late)")
	fs.IntVar(&cfg.PrefillRetries, "prefill-retries", 0, "other prefill engines a failed prefill leg is retried on before fallback (default 1; negative: none)")
	fs.IntVar(&cfg.DecodeRetries, "decode-retries", 0, "other decode engines a decode leg failing before its first byte is retried on (default 1; negative: none)")
	fs.StringVar(&cfg.BackendsFile, "backends-file", "", "file of backends, one \"prefill URL\" or \"decode URL\" per line, watched and applied without a restart (--prefill/--decode may then be omitted); the admin endpoint "+proxy.AdminBackendsPath+" (needs --api-key) changes the set too")
	fs.StringVar(&f.model, "model", "", "directory with the model's tokenizer (tokenizer.json, tokenizer_config.json; the weights are not read): prompt tokens are then counted exactly and chat templates rendered; without it counts are approximate")
	fs.Var(&f.kvEvents, "kv-events", "follow a decode engine's KV cache events for precise prefix matching: DECODE_URL=tcp://HOST:PUB_PORT[;tcp://HOST:REPLAY_PORT] (the engine's --kv-events-config endpoints), repeated per decode; needs --model and --model-fingerprint")
	fs.StringVar(&f.kvPattern, "kv-events-pattern", "", "follow the KV cache events of every decode, those added at run time too (--backends-file, the admin endpoint, --discovery kubernetes), at endpoints derived from its URL: tcp://{host}:PUB_PORT[;tcp://{host}:REPLAY_PORT], where {host} is the decode's host, {port} its HTTP port and {port+N} that port plus N; --kv-events entries take precedence; needs --model and --model-fingerprint")
	fs.StringVar(&f.fingerprint, "model-fingerprint", "", "the engines' model fingerprint (the prefix cache's hash key), for --kv-events and --kv-events-pattern; for vLLM engines started with --prefix-caching-hash-algo sha256_cbor: vllm:sha256_cbor, or vllm:sha256_cbor:SEED with their PYTHONHASHSEED")
	fs.IntVar(&cfg.BlockSize, "block-size", 0, "the engines' KV block size in tokens, for prefix matching (default 16)")
	fs.BoolVar(&cfg.Fallback, "fallback", true, "when the prefill leg fails, let decode do the whole request (said in the x-tandem-pd header); false fails such requests instead")
	fs.DurationVar(&cfg.Timeout, "timeout", 0, "limit on the prefill leg (its retries included); caps --first-byte-timeout and --stall-timeout (default 5m)")
	fs.DurationVar(&cfg.FirstByteTimeout, "first-byte-timeout", 0, "limit on a leg's first byte: a prefill's answer, a decode's headers and first token (plus 1s per max_tokens for an answer that does not stream); a leg that misses it is retried on another engine, else answered 504 (default 1m, capped by --timeout; raise it for long prompts on slow engines)")
	fs.DurationVar(&cfg.StallTimeout, "stall-timeout", 0, "limit on each gap between the decode's chunks after its first: a stream silent for longer is cut (default 30s)")
	fs.DurationVar(&cfg.ConnectTimeout, "connect-timeout", 0, "limit on connecting to a backend (default 5s)")
	fs.DurationVar(&cfg.HealthInterval, "health-interval", 0, "period of backend health checks (default 2s)")
	fs.Int64Var(&cfg.MaxBodyBytes, "max-body-bytes", 0, "largest accepted request body (default 15 MiB: the engines' 16 MiB less 1 MiB for what the proxy adds to each leg; raise --max-request-body on the engines with it)")
	fs.StringVar(&cfg.APIKey, "api-key", "", "require clients to send Authorization: Bearer <key> on every path but /health and /metrics (default: $"+openai.APIKeyEnv+"; the environment keeps the key out of ps)")
	fs.StringVar(&cfg.BackendAPIKey, "backend-api-key", "", "key the proxy sends to the engines as Authorization: Bearer <key> (default: $"+backendAPIKeyEnv+", else the proxy's own --api-key)")
	fs.BoolVar(&cfg.Conversations, "conversations", false, "conversation mode, for engines started with --kv-bidirectional: remember the decode's kv_transfer_params per conversation (body field conversation_id or header "+proxy.HeaderConversationID+"; with --model, requests naming none are matched by prompt prefix), send them on the next turn's prefill leg so the prefill pulls the history's KV instead of computing it, and route that turn's decode leg to the same decode")
	fs.IntVar(&cfg.ConversationMaxEntries, "conversation-max-entries", 0, "conversations remembered at most, least recently used forgotten first (default 10000)")
	fs.DurationVar(&cfg.ConversationTTL, "conversation-ttl", 0, "how long a conversation is remembered when the decode's params carry no remote_blocks_expiry_time in Unix seconds (none, or a vLLM decode's perf_counter deadline; set it to vLLM's decoder_kv_blocks_ttl) (default 8m, the decodes' default hold)")
	fs.IntVar(&cfg.ConversationMinPrefixTokens, "conversation-min-prefix-tokens", 0, "with --conversations and --model, a request naming no conversation continues a remembered history when its prompt starts with at least this many of the history's tokens (whole blocks; longest match first); set it to the engines' --kv-recompute-threshold (default 64)")
	f.plan = registerPlannerFlags(fs)
	fs.BoolVar(&cfg.PlannerAct, "planner-act", false, "planner: move engines between the pools as it decides; a moved engine joins its new pool at once and is moved again only once its old role's work has ended (its requests finished, the KV it holds read or released); the engines must serve both roles (tandem serve --role both, the default) and be listed with --prefill and --decode")
	fs.DurationVar(&cfg.PlanInterval, "plan-interval", 0, "planner: the period of its decisions (default 5s)")
	fs.DurationVar(&cfg.DrainTimeout, "plan-drain-timeout", 0, "planner: the longest a moved engine's old role's work is waited for before it may be moved again (default 2m)")
	fs.BoolVar(&f.scale, "planner-scale", false, "planner, with --discovery kubernetes: set the prefill and decode Deployments' replicas to its split through their scale subresource (the router's account needs get and update on deployments/scale: the planner-scale component of deploy/kubernetes); refused, it logs so and only publishes tandem:planner_desired_replicas")
	fs.StringVar(&f.scalePrefill, "scale-prefill-deployment", "tandem-prefill", "with --planner-scale: the prefill engines' Deployment")
	fs.StringVar(&f.scaleDecode, "scale-decode-deployment", "tandem-decode", "with --planner-scale: the decode engines' Deployment")
	var configFile string
	fs.StringVar(&configFile, "config", "", "YAML file of proxy settings: any flag by its name (flags given on the command line win) and per-pool pipelines under profiles: {prefill: ..., decode: ...} (see docs/usage/routing.md)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if configFile != "" {
		if err := applyProxyConfigFile(fs, configFile, cfg); err != nil {
			return nil, err
		}
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	switch k.discovery {
	case discoveryStatic:
		for _, name := range []string{"kube-namespace", "prefill-service", "decode-service", "prefill-selector", "decode-selector", "kube-port-name", "kubeconfig"} {
			if fl := fs.Lookup(name); fl.Value.String() != fl.DefValue {
				return nil, fmt.Errorf("--%s needs --discovery kubernetes", name)
			}
		}
		switch {
		case cfg.BackendsFile != "":
		case len(decode) == 0:
			return nil, errors.New("give the engines with --prefill URL[,URL...] and --decode URL[,URL...], or --backends-file FILE, or find them with --discovery kubernetes")
		case len(prefill) == 0 && !proxy.KeepsLocalWithoutPrefill(cfg.PDDecider):
			return nil, fmt.Errorf("no --prefill engine and --pd-decider %s, which sends every prompt to one: give --prefill URL[,URL...], or run colocated (every decode prefilling its own prompts) with --pd-decider conditional or priced", cfg.PDDecider)
		}
	case discoveryKubernetes:
		if cfg.BackendsFile != "" {
			return nil, errors.New("--backends-file and --discovery kubernetes would both set the backends: choose one")
		}
		if _, err := k.pools(); err != nil {
			return nil, err
		}
		cfg.DynamicBackends = true
	default:
		return nil, fmt.Errorf("--discovery %q: want static or kubernetes", k.discovery)
	}
	cfg.Prefill, cfg.Decode = prefill, decode
	var err error
	if cfg.Planner, err = f.plan.config(); err != nil {
		return nil, err
	}
	switch {
	case cfg.Planner == nil && (cfg.PlannerAct || f.scale):
		return nil, errors.New("--planner-act and --planner-scale act on the planner's decisions: turn it on with --slo-ttft and --slo-tpot")
	case f.scale && k.discovery != discoveryKubernetes:
		return nil, errors.New("--planner-scale scales Kubernetes Deployments: it needs --discovery kubernetes")
	case cfg.PlannerAct && (k.discovery == discoveryKubernetes || cfg.BackendsFile != ""):
		return nil, errors.New("--planner-act moves listed engines between the pools; with --discovery kubernetes use --planner-scale, with --backends-file the file decides")
	}
	// Keys are read from the environment after parsing, never as flag
	// defaults, so that -h does not print them.
	if cfg.APIKey == "" {
		cfg.APIKey = os.Getenv(openai.APIKeyEnv)
	}
	if cfg.BackendAPIKey == "" {
		cfg.BackendAPIKey = os.Getenv(backendAPIKeyEnv)
	}
	return f, nil
}

func runProxy(args []string) error {
	f, err := parseProxyFlags(args)
	if err != nil {
		return err
	}
	cfg := f.cfg
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	cfg.Logger = log
	if f.model != "" {
		tok, err := tokenizer.Load(f.model)
		if err != nil {
			return fmt.Errorf("--model %s: %w", f.model, err)
		}
		cfg.Tokenizer = tok
	}
	var kvIdx *kvindex.Precise
	if len(f.kvEvents) > 0 || f.kvPattern != "" {
		idx, err := followKVEvents(f, &cfg, log)
		if err != nil {
			return err
		}
		defer idx.Close()
		kvIdx = idx
	}
	stopTracing, err := startTracing(f.otlp, "tandem-proxy")
	if err != nil {
		return err
	}
	defer stopTracing()
	var scaler atomic.Pointer[kubediscovery.Scaler]
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if f.scale {
		cfg.OnPlan = func(d planner.Decision) {
			if s := scaler.Load(); s != nil {
				if err := s.Scale(ctx, d.Prefill, d.Decode); err != nil {
					log.Warn("planner: scaling the Deployments failed; retried at the next decision", "err", err)
				}
			}
		}
	}
	p, err := proxy.New(cfg)
	if err != nil {
		return err
	}
	if kvIdx != nil {
		if err := p.MetricsRegisterer().Register(kvIdx.Collector()); err != nil {
			return fmt.Errorf("exporting the KV-event subscriber's metrics: %w", err)
		}
	}
	var watcher *kubediscovery.Watcher
	if f.kube.discovery == discoveryKubernetes {
		if watcher, err = newKubeWatcher(&f.kube, p, log); err != nil {
			return err
		}
	}
	if f.scale {
		s, err := newKubeScaler(f, p, log)
		if err != nil {
			return err
		}
		scaler.Store(s)
	}
	addr := net.JoinHostPort(f.host, strconv.Itoa(f.port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w (is another server using the port? choose one with --port)", addr, err)
	}
	if watcher != nil {
		wctx, stopWatch := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = watcher.Run(wctx)
		}()
		defer func() {
			stopWatch()
			<-done
		}()
	}
	log.Info("proxy listening", "addr", "http://"+ln.Addr().String(), "prefill", cfg.Prefill, "decode", cfg.Decode, "policy", cfg.Policy, "pd_decider", cfg.PDDecider,
		"conversations", cfg.Conversations, "api_key", cfg.APIKey != "", "backend_api_key", cfg.BackendAPIKey != "" || cfg.APIKey != "")
	if cfg.Tokenizer == nil {
		log.Warn("router counts tokens approximately (prompt bytes / 4, prefix blocks of 4·block-size bytes): give --model DIR for exact counts", "metric", "tandem:proxy_token_count_mode")
	}
	return p.Serve(ctx, ln)
}

// followKVEvents makes the precise prefix index of --kv-events and
// --kv-events-pattern and sets it in cfg: the decodes named in --kv-events
// are followed at their endpoints, the other decodes at the pattern's, and
// cfg.BackendsChanged keeps it following the decode pool as it changes.
func followKVEvents(f *proxyFlags, cfg *proxy.Config, log *slog.Logger) (*kvindex.Precise, error) {
	if cfg.Tokenizer == nil || f.fingerprint == "" {
		return nil, errors.New("--kv-events and --kv-events-pattern need --model DIR (the tokenizer) and --model-fingerprint (the engines' block hash key)")
	}
	explicit := map[string]kvindex.Endpoints{}
	for _, e := range f.kvEvents {
		backend, eps, ok := strings.Cut(e, "=")
		pub, replay, _ := strings.Cut(eps, ";")
		base, err := proxy.NormalizeBackendURL(backend)
		if !ok || err != nil {
			return nil, fmt.Errorf("--kv-events %q: want DECODE_URL=tcp://HOST:PORT[;tcp://HOST:PORT]", e)
		}
		explicit[base] = kvindex.Endpoints{Pub: pub, Replay: replay}
	}
	var pattern *kvindex.Pattern
	if f.kvPattern != "" {
		var err error
		if pattern, err = kvindex.ParsePattern(f.kvPattern); err != nil {
			return nil, fmt.Errorf("--kv-events-pattern: %w", err)
		}
	}
	if err := kvindex.CheckFingerprint(f.fingerprint); err != nil {
		return nil, fmt.Errorf("--model-fingerprint: %w", err)
	}
	bs := cfg.BlockSize
	if bs <= 0 {
		bs = 16
	}
	idx := kvindex.New(f.fingerprint, bs, log)
	fol := kvindex.NewFollower(idx, explicit, pattern, log)
	follow := map[string]bool{}
	for base := range explicit {
		follow[base] = true
	}
	if pattern != nil {
		for _, d := range cfg.Decode {
			base, err := proxy.NormalizeBackendURL(d)
			if err != nil {
				idx.Close()
				return nil, fmt.Errorf("--decode %q: %w", d, err)
			}
			follow[base] = true
		}
	}
	for base := range follow {
		if err := fol.Follow(base); err != nil {
			idx.Close()
			return nil, fmt.Errorf("KV events of %s: %w", base, err)
		}
	}
	cfg.PrefixIndex, cfg.BlockHasher, cfg.BackendsChanged = idx, idx.Hash, fol.BackendsChanged
	return idx, nil
}

// newKubeWatcher returns the Kubernetes discovery that feeds p, its metrics
// on p's /metrics and client-go's log lines in log.
func newKubeWatcher(k *kubeFlags, p *proxy.Proxy, log *slog.Logger) (*kubediscovery.Watcher, error) {
	pools, err := k.pools()
	if err != nil {
		return nil, err
	}
	rc, err := kubediscovery.RESTConfig(k.kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--discovery kubernetes: %w", err)
	}
	client, err := kubediscovery.NewClient(rc, "tandem-proxy")
	if err != nil {
		return nil, fmt.Errorf("--discovery kubernetes: %w", err)
	}
	ns := k.namespace
	if ns == "" {
		ns = kubediscovery.Namespace()
	}
	klog.SetSlogLogger(log) // client-go's global log lines too
	return kubediscovery.New(kubediscovery.Config{
		Client:     client,
		Namespace:  ns,
		Pools:      pools,
		Backends:   p,
		Logger:     log.With("component", "discovery"),
		Registerer: p.MetricsRegisterer(),
	})
}

// newKubeScaler returns the planner's scaler of the two Deployments, in
// the discovery's namespace.
func newKubeScaler(f *proxyFlags, p *proxy.Proxy, log *slog.Logger) (*kubediscovery.Scaler, error) {
	rc, err := kubediscovery.RESTConfig(f.kube.kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--planner-scale: %w", err)
	}
	client, err := kubediscovery.NewClient(rc, "tandem-proxy")
	if err != nil {
		return nil, fmt.Errorf("--planner-scale: %w", err)
	}
	ns := f.kube.namespace
	if ns == "" {
		ns = kubediscovery.Namespace()
	}
	return kubediscovery.NewScaler(kubediscovery.ScalerConfig{Client: client, Namespace: ns, Prefill: f.scalePrefill, Decode: f.scaleDecode,
		Logger: log.With("component", "planner"), Registerer: p.MetricsRegisterer()})
}

// proxyConfigFile is the YAML of --config: flags by name, and pipelines.
type proxyConfigFile struct {
	Profiles struct {
		Prefill *factory.Spec `yaml:"prefill"`
		Decode  *factory.Spec `yaml:"decode"`
	} `yaml:"profiles"`
}

// applyProxyConfigFile sets every flag the file names and the command line
// did not, and the pools' pipelines.
func applyProxyConfigFile(fs *flag.FlagSet, path string, cfg *proxy.Config) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	var raw map[string]any
	if err := yaml.Unmarshal(data, &raw); err != nil {
		return fmt.Errorf("--config %s: %w", path, err)
	}
	explicit := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
	names := make([]string, 0, len(raw))
	for k := range raw {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, name := range names {
		v := raw[name]
		switch {
		case name == "profiles":
			continue
		case name == "config" || name == "api-key" || name == "backend-api-key":
			return fmt.Errorf("--config %s: %q cannot be set from the file (keys come from the environment or the command line)", path, name)
		case fs.Lookup(name) == nil:
			return fmt.Errorf("--config %s: unknown setting %q (settings are the flags of tandem proxy)", path, name)
		case explicit[name]:
			continue
		}
		vals := []any{v}
		if list, ok := v.([]any); ok {
			vals = list
		}
		for _, x := range vals {
			if err := fs.Set(name, fmt.Sprint(x)); err != nil {
				return fmt.Errorf("--config %s: %s: %w", path, name, err)
			}
		}
	}
	var pf proxyConfigFile
	if err := yaml.Unmarshal(data, &pf); err != nil {
		return fmt.Errorf("--config %s: profiles: %w", path, err)
	}
	cfg.PrefillProfile, cfg.DecodeProfile = pf.Profiles.Prefill, pf.Profiles.Decode
	return nil
}
