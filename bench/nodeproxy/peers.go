package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"text/template"
	"time"

	"github.com/causeway-mesh/causeway/bench/internal/benchmesh"
)

// The peers: TLS tunnel pairs a user could run instead of the node proxy
// pair, carrying the same traffic between the same client and app. Each
// pair is two daemons on addresses of their own: the client side takes
// plain TCP on pod B's three ports and opens mutual TLS 1.3 (client
// certificate) to the server side, which requires and verifies the client
// certificate and connects to pod B's app in plain TCP, as node proxy B
// does. All TLS is TLS_AES_128_GCM_SHA256 with ECDSA P-256 certificates,
// what the mesh negotiates, so the pairs differ in how they do the work,
// not in the cipher. Neither pair pools: each connection is a TLS session
// of its own (resumed where the daemon caches sessions), where the node
// proxy opens an HTTP/2 stream on a pooled connection.
const (
	nginxAIP   = "127.0.92.1"
	nginxBIP   = "127.0.92.2"
	stunnelAIP = "127.0.93.1"
	stunnelBIP = "127.0.93.2"
	tlsAppIP   = "127.0.190.3" // pod B's app behind TLS (the TLS-direct reference)
	serverName = "server.bench"
	clientName = "client.bench"
	cipher     = "TLS_AES_128_GCM_SHA256"
)

var appPorts = []string{bulkPort, rrPort, holdPort}

// stream module of Debian's libnginx-mod-stream.
const nginxStreamModule = "/usr/lib/nginx/modules/ngx_stream_module.so"

var nginxStreamConf = template.Must(template.New("nginx").Parse(`# Written by bench/nodeproxy; nginx runs as its child.
daemon off;
master_process on;
{{if .Root}}user root root;
{{end}}worker_processes {{.Workers}};
pid {{.Dir}}/nginx.pid;
error_log {{.Dir}}/error.log warn;
{{if .Module}}load_module {{.Module}};
{{end}}worker_rlimit_nofile {{.Files}};
events {
  worker_connections {{.Files}};
}
stream {
  log_format basic '$remote_addr [$time_local] $protocol $status $bytes_sent $bytes_received $session_time';
  access_log {{.Dir}}/access.log basic buffer=64k flush=1s;
{{range .Ports}}  server {
{{if $.Client}}    listen {{$.Listen}}:{{.}};
    proxy_pass {{$.Upstream}}:{{.}};
    proxy_ssl on;
    proxy_ssl_protocols TLSv1.3;
    proxy_ssl_conf_command Ciphersuites ` + cipher + `;
    proxy_ssl_certificate {{$.PKI}}/` + clientName + `.pem;
    proxy_ssl_certificate_key {{$.PKI}}/` + clientName + `.key;
    proxy_ssl_trusted_certificate {{$.PKI}}/ca.pem;
    proxy_ssl_verify on;
    proxy_ssl_name ` + serverName + `;
    proxy_ssl_session_reuse on;
{{else}}    listen {{$.Listen}}:{{.}} ssl;
    ssl_protocols TLSv1.3;
    ssl_conf_command Ciphersuites ` + cipher + `;
    ssl_certificate {{$.PKI}}/` + serverName + `.pem;
    ssl_certificate_key {{$.PKI}}/` + serverName + `.key;
    ssl_client_certificate {{$.PKI}}/ca.pem;
    ssl_verify_client on;
    proxy_pass {{$.Upstream}}:{{.}};
{{end}}  }
{{end}}}
`))

var stunnelConf = template.Must(template.New("stunnel").Parse(`; Written by bench/nodeproxy; stunnel runs as its child.
foreground = yes
pid =
output = {{.Dir}}/stunnel.log
{{range .Ports}}
[port{{.}}]
accept = {{$.Listen}}:{{.}}
connect = {{$.Upstream}}:{{.}}
sslVersionMin = TLSv1.3
ciphersuites = ` + cipher + `
CAfile = {{$.PKI}}/ca.pem
verifyChain = yes
{{if $.Client}}client = yes
cert = {{$.PKI}}/` + clientName + `.pem
key = {{$.PKI}}/` + clientName + `.key
checkHost = ` + serverName + `
{{else}}requireCert = yes
cert = {{$.PKI}}/` + serverName + `.pem
key = {{$.PKI}}/` + serverName + `.key
{{end}}{{end}}`))

// side is one daemon of a peer pair.
type side struct {
	Dir, PKI         string
	Listen, Upstream string // IPs; the ports are appPorts
	Ports            []string
	Client           bool // takes plain TCP, opens TLS
	// nginx only
	Workers, Files int
	Module         string
	Root           bool
}

func writeConf(t *template.Template, s side, name string) (string, error) {
	var b bytes.Buffer
	if err := t.Execute(&b, s); err != nil {
		return "", err
	}
	path := filepath.Join(s.Dir, name)
	return path, os.WriteFile(path, b.Bytes(), 0o600)
}

// peerPair is a running pair.
type peerPair struct {
	name   string
	listen string // the client side's IP
	a, b   *benchmesh.Daemon
}

func (p *peerPair) stop() {
	p.a.Stop()
	p.b.Stop()
}

// cpu is the CPU time both daemons have used.
func (p *peerPair) cpu() (time.Duration, error) {
	a, err := p.a.CPU()
	if err != nil {
		return 0, err
	}
	b, err := p.b.CPU()
	return a + b, err
}

// startPeer starts the named pair (nginx_stream or stunnel) in work/name,
// server side first. An error that starts with errMissing means the tool
// is not installed: the benchmark goes on without that pair.
func startPeer(name, work, pki string, workers, files int) (*peerPair, error) {
	var (
		bin, module  string
		t            *template.Template
		listen, upIP string
		args         func(conf, dir string) []string
		logs         []string
	)
	switch name {
	case "nginx_stream":
		var err error
		if bin, err = benchmesh.LookTool("nginx", "/usr/sbin/nginx"); err != nil {
			return nil, missing(err, "nginx libnginx-mod-stream")
		}
		if _, err := os.Stat(nginxStreamModule); err == nil {
			module = nginxStreamModule
		} else if out, _ := runOutput(bin, "-V"); !bytes.Contains(out, []byte("--with-stream ")) {
			return nil, missing(fmt.Errorf("nginx has no stream module (%s)", nginxStreamModule), "libnginx-mod-stream")
		}
		t, listen, upIP, logs = nginxStreamConf, nginxAIP, nginxBIP, []string{"error.log"}
		args = func(conf, dir string) []string { return []string{"-p", dir, "-c", conf} }
	case "stunnel":
		var err error
		if bin, err = benchmesh.LookTool("stunnel4", "stunnel", "/usr/bin/stunnel4"); err != nil {
			return nil, missing(err, "stunnel4")
		}
		t, listen, upIP, logs = stunnelConf, stunnelAIP, stunnelBIP, []string{"stunnel.log"}
		args = func(conf, _ string) []string { return []string{conf} }
	default:
		return nil, fmt.Errorf("unknown peer %q (nginx_stream, stunnel)", name)
	}
	start := func(s side) (*benchmesh.Daemon, error) {
		if err := os.MkdirAll(s.Dir, 0o700); err != nil {
			return nil, err
		}
		conf, err := writeConf(t, s, "peer.conf")
		if err != nil {
			return nil, err
		}
		var addrs []string
		for _, p := range s.Ports {
			addrs = append(addrs, net.JoinHostPort(s.Listen, p))
		}
		return benchmesh.StartDaemon(name, s.Dir, addrs, logs, bin, args(conf, s.Dir)...)
	}
	common := side{PKI: pki, Ports: appPorts, Workers: workers, Files: files, Module: module, Root: os.Getuid() == 0}
	sb := common
	sb.Dir, sb.Listen, sb.Upstream = filepath.Join(work, name, "b"), upIP, appIP
	b, err := start(sb)
	if err != nil {
		return nil, err
	}
	sa := common
	sa.Dir, sa.Listen, sa.Upstream, sa.Client = filepath.Join(work, name, "a"), listen, upIP, true
	a, err := start(sa)
	if err != nil {
		b.Stop()
		return nil, err
	}
	return &peerPair{name: name, listen: listen, a: a, b: b}, nil
}

// errMissing marks a peer that is not installed.
type errMissing struct {
	err error
	pkg string
}

func (e *errMissing) Error() string {
	return fmt.Sprintf("%v (Debian: apt-get install -y %s)", e.err, e.pkg)
}

func missing(err error, pkg string) error { return &errMissing{err: err, pkg: pkg} }

// peerTLS is what the TLS-direct client and pod B's TLS app use.
type peerTLS struct {
	client, server *tls.Config
}

// newPeerPKI writes the peers' CA and the two leaves into dir.
func newPeerPKI(dir string) (*peerTLS, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	pk, err := benchmesh.NewPKI(dir)
	if err != nil {
		return nil, err
	}
	if _, err := pk.Issue(serverName, 2); err != nil {
		return nil, err
	}
	cc, err := pk.Issue(clientName, 3)
	if err != nil {
		return nil, err
	}
	return &peerTLS{client: &tls.Config{MinVersion: tls.VersionTLS13, ServerName: serverName, RootCAs: pk.Pool,
		Certificates: []tls.Certificate{*cc}, ClientSessionCache: tls.NewLRUClientSessionCache(256)}}, nil
}

// appTLS is pod B's TLS configuration, read from the PKI directory the
// parent wrote (the child's -app-tls).
func appTLS(dir string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, serverName+".pem"), filepath.Join(dir, serverName+".key"))
	if err != nil {
		return nil, err
	}
	pool, err := benchmesh.LoadPool(filepath.Join(dir, "ca.pem"))
	if err != nil {
		return nil, err
	}
	return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool}, nil
}

// tlsDialer connects from pod A's address with TLS to pod B's TLS app.
func tlsDialer(conf *tls.Config) func(context.Context, string) (net.Conn, error) {
	d := &tls.Dialer{NetDialer: localDialer(), Config: conf}
	return func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }
}

func runOutput(bin string, args ...string) ([]byte, error) {
	return exec.Command(bin, args...).CombinedOutput()
}
