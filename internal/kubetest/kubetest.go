package kubetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tandem-serve/tandem/internal/testutil"
)

// Script is the repository-relative path of the script that builds the
// control-plane binaries into the cache BinDir looks in.
const Script = "scripts/kube-binaries.sh"

// Pinned versions of the binaries; scripts/kube-binaries.sh pins the same.
const (
	KubernetesVersion = "v1.37.2"
	EtcdVersion       = "v3.7.3"
)

// Binaries are the executables BinDir requires.
var Binaries = []string{"kube-apiserver", "kubectl", "etcd"}

// ServiceClusterIPRange is the apiserver's --service-cluster-ip-range.
const ServiceClusterIPRange = "10.96.0.0/16"

// ServiceAccountIssuer is the apiserver's --service-account-issuer.
const ServiceAccountIssuer = "https://kubernetes.default.svc.cluster.local"

// readyTimeout bounds how long Start waits for /readyz.
const readyTimeout = 60 * time.Second

// BinDir returns the directory holding kube-apiserver, kubectl and etcd:
// $TANDEM_KUBE_BIN if set, else the cache directory scripts/kube-binaries.sh
// builds into. The error names the missing binary and the script.
func BinDir() (string, error) {
	dir := os.Getenv("TANDEM_KUBE_BIN")
	from := "TANDEM_KUBE_BIN"
	if dir == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			return "", fmt.Errorf("kubetest: no cache directory (%w); run bash %s and set TANDEM_KUBE_BIN to the directory it prints", err, Script)
		}
		dir = filepath.Join(cache, "tandem", "kube", "k8s-"+KubernetesVersion+"-etcd-"+EtcdVersion, "bin")
		from = "the cache"
	}
	for _, b := range Binaries {
		p := filepath.Join(dir, b)
		fi, err := os.Stat(p)
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return "", fmt.Errorf("kubetest: %s not found in %s (%s); build the control plane with bash %s and set TANDEM_KUBE_BIN to the directory it prints", b, dir, from, Script)
		}
	}
	return dir, nil
}

// ControlPlane is a running etcd and kube-apiserver on 127.0.0.1.
type ControlPlane struct {
	// URL is the API server's address, https://127.0.0.1:<port>.
	URL string
	// Kubeconfig is the path of a kubeconfig for the admin user (token
	// auth, the serving CA embedded), current namespace "default".
	Kubeconfig string
	// Token is the admin user's bearer token (user "admin", group
	// system:masters).
	Token string
	// CAFile is the PEM file of the CA that signed the API server's serving
	// certificate (valid for 127.0.0.1, ::1 and localhost).
	CAFile string
	// Dir is the work directory: data, certificates, keys and the logs
	// etcd.log and kube-apiserver.log.
	Dir string
	// BinDir is the directory the binaries were run from.
	BinDir string
	// EtcdURL is etcd's client URL, http://127.0.0.1:<port>.
	EtcdURL string

	etcd, apiserver *proc
	stopOnce        sync.Once
}

// proc is a started process and the channel closed when it has exited.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error // cmd.Wait's result, set before done is closed
}

// Start starts etcd and kube-apiserver from binDir with their state in
// workDir (which must exist), waits until the API server's /readyz answers
// ok, and writes the kubeconfig. ctx bounds the start-up only: the processes
// live until Stop, or until the process that started them dies. On failure,
// everything started is stopped and the error carries the tails of the logs.
func Start(ctx context.Context, binDir, workDir string) (*ControlPlane, error) {
	workDir, err := filepath.Abs(workDir)
	if err != nil {
		return nil, err
	}
	pki, err := writePKI(workDir)
	if err != nil {
		return nil, fmt.Errorf("kubetest: %w", err)
	}
	// Ports are chosen by listening on :0 and closing; a port taken in
	// between makes a process fail to bind, and then start-up is retried on
	// fresh ports.
	var lastErr error
	for attempt := range 3 {
		cp, err := start(ctx, binDir, workDir, pki, attempt)
		if err == nil {
			return cp, nil
		}
		lastErr = err
		if !errors.Is(err, errPortInUse) || ctx.Err() != nil {
			break
		}
	}
	return nil, lastErr
}

var errPortInUse = errors.New("a port was taken")

func start(ctx context.Context, binDir, workDir string, pki *pkiFiles, attempt int) (_ *ControlPlane, err error) {
	ports, err := testutil.FreePorts(3)
	if err != nil {
		return nil, fmt.Errorf("kubetest: picking ports: %w", err)
	}
	cp := &ControlPlane{
		URL:     "https://127.0.0.1:" + strconv.Itoa(ports[2]),
		Token:   pki.token,
		CAFile:  pki.caFile,
		Dir:     workDir,
		BinDir:  binDir,
		EtcdURL: "http://127.0.0.1:" + strconv.Itoa(ports[0]),
	}
	defer func() {
		if err != nil {
			tails := cp.tails()
			cp.Stop()
			if strings.Contains(tails, "address already in use") {
				err = fmt.Errorf("%w (%w)", err, errPortInUse)
			}
			err = fmt.Errorf("kubetest: starting the control plane in %s: %w%s", workDir, err, tails)
		}
	}()

	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	dataDir := filepath.Join(workDir, "etcd-data-"+strconv.Itoa(attempt))
	cp.etcd, err = startProc(binDir, "etcd", filepath.Join(workDir, "etcd.log"),
		"--name=tandem-test",
		"--data-dir="+dataDir,
		"--listen-client-urls="+cp.EtcdURL,
		"--advertise-client-urls="+cp.EtcdURL,
		"--listen-peer-urls="+peerURL,
		"--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=tandem-test="+peerURL,
		"--initial-cluster-state=new",
		"--unsafe-no-fsync",
	)
	if err != nil {
		return nil, err
	}
	cp.apiserver, err = startProc(binDir, "kube-apiserver", filepath.Join(workDir, "kube-apiserver.log"),
		"--etcd-servers="+cp.EtcdURL,
		"--bind-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(ports[2]),
		"--advertise-address=127.0.0.1",
		// The default reconciler would publish 127.0.0.1 in the
		// "kubernetes" Endpoints, which the API server itself refuses.
		"--endpoint-reconciler-type=none",
		"--service-cluster-ip-range="+ServiceClusterIPRange,
		"--tls-cert-file="+pki.serverCert,
		"--tls-private-key-file="+pki.serverKey,
		"--token-auth-file="+pki.tokenFile,
		"--authorization-mode=RBAC",
		"--service-account-issuer="+ServiceAccountIssuer,
		"--service-account-key-file="+pki.saPub,
		"--service-account-signing-key-file="+pki.saKey,
		// No controller manager creates namespaces' "default"
		// ServiceAccount, which this plugin would demand of every pod.
		"--disable-admission-plugins=ServiceAccount",
		"--allow-privileged=true",
	)
	if err != nil {
		return nil, err
	}
	if err := cp.waitReady(ctx); err != nil {
		return nil, err
	}
	cp.Kubeconfig = filepath.Join(workDir, "kubeconfig")
	if err := os.WriteFile(cp.Kubeconfig, []byte(kubeconfig(cp.URL, pki.caPEM, cp.Token)), 0o600); err != nil {
		return nil, err
	}
	return cp, nil
}

func startProc(binDir, name, logPath string, args ...string) (*proc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own descriptor
	fmt.Fprintf(logf, "==== %s %s\n", time.Now().Format(time.RFC3339), strings.Join(append([]string{name}, args...), " "))
	cmd := exec.Command(filepath.Join(binDir, name), args...)
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (cp *ControlPlane) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	client, err := cp.httpClient()
	if err != nil {
		return err
	}
	client.Timeout = 2 * time.Second
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last string
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, cp.URL+"/readyz", nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+cp.Token)
		resp, err := client.Do(req)
		if err == nil {
			var body bytes.Buffer
			_, _ = body.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%s: %s", resp.Status, lastLines(body.String(), 10))
		} else {
			last = err.Error()
		}
		select {
		case <-cp.etcd.done:
			return fmt.Errorf("etcd exited: %w", cp.etcd.err)
		case <-cp.apiserver.done:
			return fmt.Errorf("kube-apiserver exited: %w", cp.apiserver.err)
		case <-ctx.Done():
			return fmt.Errorf("kube-apiserver not ready (%v); last /readyz: %s", context.Cause(ctx), last)
		case <-tick.C:
		}
	}
}

// httpClient returns a client that trusts the serving CA.
func (cp *ControlPlane) httpClient() (*http.Client, error) {
	caPEM, err := os.ReadFile(cp.CAFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("no certificate in %s", cp.CAFile)
	}
	return &http.Client{Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
	}}, nil
}

// Stop kills kube-apiserver and etcd and waits for them to exit. It is safe
// to call more than once; it leaves Dir in place.
func (cp *ControlPlane) Stop() {
	cp.stopOnce.Do(func() {
		for _, p := range []*proc{cp.apiserver, cp.etcd} {
			if p == nil {
				continue
			}
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
}

// Kubectl runs kubectl against the control plane with args, stdin as its
// standard input when non-nil, and returns its combined output. The error,
// if any, includes the command line and the output.
func (cp *ControlPlane) Kubectl(ctx context.Context, stdin []byte, args ...string) ([]byte, error) {
	full := append([]string{
		"--kubeconfig=" + cp.Kubeconfig,
		"--cache-dir=" + filepath.Join(cp.Dir, "kubectl-cache"),
	}, args...)
	cmd := exec.CommandContext(ctx, filepath.Join(cp.BinDir, "kubectl"), full...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("kubectl %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return out, nil
}

// tails returns the last lines of both logs, for an error message.
func (cp *ControlPlane) tails() string {
	var b strings.Builder
	for _, p := range []*proc{cp.etcd, cp.apiserver} {
		if p == nil {
			continue
		}
		data, err := os.ReadFile(p.log)
		if err != nil {
			continue
		}
		fmt.Fprintf(&b, "\n--- last lines of %s:\n%s", p.log, lastLines(string(data), 25))
	}
	return b.String()
}

// lastLines returns at most n trailing lines of s, each cut to 400 bytes.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	for i, l := range lines {
		if len(l) > 400 {
			lines[i] = l[:400] + "…"
		}
	}
	return strings.Join(lines, "\n")
}

func kubeconfig(server string, caPEM []byte, token string) string {
	return `apiVersion: v1
kind: Config
clusters:
- name: tandem-test
  cluster:
    server: ` + server + `
    certificate-authority-data: ` + base64.StdEncoding.EncodeToString(caPEM) + `
users:
- name: admin
  user:
    token: ` + token + `
contexts:
- name: tandem-test
  context:
    cluster: tandem-test
    user: admin
    namespace: default
current-context: tandem-test
`
}

func randomToken() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}
