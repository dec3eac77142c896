package kubediscovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// ScalerConfig configures a Scaler.
type ScalerConfig struct {
	// Client is the API client; Namespace the Deployments'.
	Client    kubernetes.Interface
	Namespace string
	// Prefill and Decode name the two Deployments.
	Prefill, Decode string
	// Timeout bounds each API call. Default 5s.
	Timeout time.Duration
	// Logger receives a line per change and per refusal. Default
	// slog.Default().
	Logger *slog.Logger
	// Registerer, when set, gets tandem:planner_scale_mode (1 on the mode
	// in use: "scale" or "publish").
	Registerer prometheus.Registerer
}

// Scaler sets the replicas of the prefill and decode Deployments through
// their scale subresource, as the planner decides. It needs get and update
// on deployments/scale in the namespace (deploy/kubernetes/components/planner-scale); an
// identity without them is said once in the log, and from then on the
// Scaler only publishes (the planner's metrics stay the desired counts).
type Scaler struct {
	cfg  ScalerConfig
	mode *prometheus.GaugeVec

	mu        sync.Mutex
	forbidden bool
}

// NewScaler returns a Scaler for cfg.
func NewScaler(cfg ScalerConfig) (*Scaler, error) {
	if cfg.Client == nil || cfg.Namespace == "" || cfg.Prefill == "" || cfg.Decode == "" {
		return nil, errors.New("scaling needs the API client, the namespace and both Deployments' names (--scale-prefill-deployment, --scale-decode-deployment)")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Scaler{cfg: cfg, mode: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tandem:planner_scale_mode",
		Help: "1 on the planner's Kubernetes mode in use: scale (it sets the Deployments' replicas) or publish (no RBAC to: only the metrics)."}, []string{"mode"})}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(s.mode); err != nil {
			return nil, fmt.Errorf("registering the scaler's metric: %w", err)
		}
	}
	s.setMode("scale")
	return s, nil
}

func (s *Scaler) setMode(m string) {
	for _, v := range []string{"scale", "publish"} {
		s.mode.WithLabelValues(v).Set(0)
	}
	s.mode.WithLabelValues(m).Set(1)
}

// Publishing reports whether the Scaler was refused and only publishes.
func (s *Scaler) Publishing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.forbidden
}

// Scale sets the prefill Deployment to prefill replicas and the decode one
// to decode, the one that shrinks first so that the total never exceeds
// what it was. A Deployment already at its count is left alone. When the
// API refuses for want of RBAC the Scaler says so once and returns nil
// from then on without calling the API.
func (s *Scaler) Scale(ctx context.Context, prefill, decode int) error {
	if s.Publishing() {
		return nil
	}
	type target struct {
		name string
		n    int32
	}
	ts := []target{{s.cfg.Prefill, int32(prefill)}, {s.cfg.Decode, int32(decode)}}
	cur := make([]int32, len(ts))
	for i, t := range ts {
		n, err := s.replicas(ctx, t.name)
		if err != nil {
			return s.refused(err, "get", t.name)
		}
		cur[i] = n
	}
	if ts[1].n < cur[1] { // decode shrinks: first
		ts[0], ts[1] = ts[1], ts[0]
		cur[0], cur[1] = cur[1], cur[0]
	}
	for i, t := range ts {
		if cur[i] == t.n {
			continue
		}
		if err := s.setReplicas(ctx, t.name, t.n); err != nil {
			return s.refused(err, "update", t.name)
		}
		s.cfg.Logger.Info("planner: scaled", "deployment", t.name, "namespace", s.cfg.Namespace, "from", cur[i], "to", t.n)
	}
	return nil
}

func (s *Scaler) replicas(ctx context.Context, name string) (int32, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	sc, err := s.cfg.Client.AppsV1().Deployments(s.cfg.Namespace).GetScale(ctx, name, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	return sc.Spec.Replicas, nil
}

func (s *Scaler) setReplicas(ctx context.Context, name string, n int32) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	deps := s.cfg.Client.AppsV1().Deployments(s.cfg.Namespace)
	sc, err := deps.GetScale(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	sc.Spec.Replicas = n
	_, err = deps.UpdateScale(ctx, name, sc, metav1.UpdateOptions{})
	return err
}

// refused turns a failed call into the Scaler's answer: a 403 switches it
// to publishing, said once; anything else is returned.
func (s *Scaler) refused(err error, verb, name string) error {
	if !apierrors.IsForbidden(err) {
		return fmt.Errorf("scaling Deployment %s/%s: %w", s.cfg.Namespace, name, err)
	}
	s.mu.Lock()
	first := !s.forbidden
	s.forbidden = true
	s.mu.Unlock()
	if first {
		s.setMode("publish")
		s.cfg.Logger.Warn("planner: not allowed to scale the Deployments; only publishing the desired replicas (tandem:planner_desired_replicas). Grant get and update on deployments/scale (deploy/kubernetes/components/planner-scale) to scale them",
			"verb", verb, "deployment", name, "namespace", s.cfg.Namespace, "err", err)
	}
	return nil
}
