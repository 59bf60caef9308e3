// Package peers runs the TLS tunnel pairs a user could run instead of the
// node proxy pair (nginx's stream module, stunnel), for the benchmarks to
// measure against on the same traffic: the client side takes plain TCP
// and opens mutual TLS 1.3 (client certificate) to the server side, which
// requires and verifies the client certificate and connects to the app in
// plain TCP, as node proxy B does. All TLS is TLS_AES_128_GCM_SHA256 with
// ECDSA P-256 certificates, what the mesh negotiates, so the pairs differ
// in how they do the work, not in the cipher. Neither pair pools: each
// connection is a TLS session of its own (resumed where the daemon caches
// sessions), where the node proxy opens an HTTP/2 stream on a pooled
// connection.
//
// nginx_plain is the same nginx pair with plain TCP between its sides: two
// user-space hops that copy bytes and nothing else, the floor under any
// proxy pair on the host (what the kernel's sockets and the scheduler's
// wake-ups cost, without encryption or framing).
package peers

import (
	"bytes"
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

// The names in the PKI's certificates, and the one cipher suite.
const (
	ServerName = "server.bench"
	clientName = "client.bench"
	cipher     = "TLS_AES_128_GCM_SHA256"
)

// stream module of Debian's libnginx-mod-stream.
const nginxStreamModule = "/usr/lib/nginx/modules/ngx_stream_module.so"

var nginxStreamConf = template.Must(template.New("nginx").Parse(`# Written by a Causeway benchmark; nginx runs as its child.
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
{{if not $.TLS}}    listen {{$.Listen}}:{{.}};
    proxy_pass {{$.Upstream}}:{{.}};
{{else if $.Client}}    listen {{$.Listen}}:{{.}};
    proxy_pass {{$.Upstream}}:{{.}};
    proxy_ssl on;
    proxy_ssl_protocols TLSv1.3;
    proxy_ssl_conf_command Ciphersuites ` + cipher + `;
    proxy_ssl_certificate {{$.PKI}}/` + clientName + `.pem;
    proxy_ssl_certificate_key {{$.PKI}}/` + clientName + `.key;
    proxy_ssl_trusted_certificate {{$.PKI}}/ca.pem;
    proxy_ssl_verify on;
    proxy_ssl_name ` + ServerName + `;
    proxy_ssl_session_reuse on;
{{else}}    listen {{$.Listen}}:{{.}} ssl;
    ssl_protocols TLSv1.3;
    ssl_conf_command Ciphersuites ` + cipher + `;
    ssl_certificate {{$.PKI}}/` + ServerName + `.pem;
    ssl_certificate_key {{$.PKI}}/` + ServerName + `.key;
    ssl_client_certificate {{$.PKI}}/ca.pem;
    ssl_verify_client on;
    proxy_pass {{$.Upstream}}:{{.}};
{{end}}  }
{{end}}}
`))

var stunnelConf = template.Must(template.New("stunnel").Parse(`; Written by a Causeway benchmark; stunnel runs as its child.
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
checkHost = ` + ServerName + `
{{else}}requireCert = yes
cert = {{$.PKI}}/` + ServerName + `.pem
key = {{$.PKI}}/` + ServerName + `.key
{{end}}{{end}}`))

// side is one daemon of a pair.
type side struct {
	Dir, PKI         string
	Listen, Upstream string // IPs; the ports are Ports
	Ports            []string
	Client           bool // takes plain TCP, opens TLS
	TLS              bool // false: plain TCP between the sides (nginx_plain)
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

// Config says where a pair runs.
type Config struct {
	Name     string // nginx_stream, nginx_plain or stunnel
	Work     string // the pair's directories go in Work/Name
	PKI      string // written by NewPKI
	ClientIP string // the client side listens here, on Ports
	ServerIP string // the server side listens here, on Ports
	AppIP    string // the server side connects here, on the same port
	Ports    []string
	Workers  int // nginx's worker processes
	Files    int // nginx's descriptors per worker
}

// Pair is a running pair.
type Pair struct {
	Name   string
	Listen string // the client side's IP
	a, b   *benchmesh.Daemon
}

// Stop stops both daemons.
func (p *Pair) Stop() {
	p.a.Stop()
	p.b.Stop()
}

// CPU is the CPU time both daemons have used.
func (p *Pair) CPU() (time.Duration, error) {
	a, err := p.a.CPU()
	if err != nil {
		return 0, err
	}
	b, err := p.b.CPU()
	return a + b, err
}

// PIDs are both daemons' processes (nginx's workers too).
func (p *Pair) PIDs() ([]int, error) {
	a, err := p.a.PIDs()
	if err != nil {
		return nil, err
	}
	b, err := p.b.PIDs()
	return append(a, b...), err
}

// Start starts the pair c names, server side first. An error that is an
// *ErrMissing means the tool is not installed: a benchmark goes on
// without that pair.
func Start(c Config) (*Pair, error) {
	var (
		bin, module string
		t           *template.Template
		args        func(conf, dir string) []string
		logs        []string
	)
	withTLS := c.Name != "nginx_plain"
	switch c.Name {
	case "nginx_stream", "nginx_plain":
		var err error
		if bin, err = benchmesh.LookTool("nginx", "/usr/sbin/nginx"); err != nil {
			return nil, missing(err, "nginx libnginx-mod-stream")
		}
		if _, err := os.Stat(nginxStreamModule); err == nil {
			module = nginxStreamModule
		} else if out, _ := exec.Command(bin, "-V").CombinedOutput(); !bytes.Contains(out, []byte("--with-stream ")) {
			return nil, missing(fmt.Errorf("nginx has no stream module (%s)", nginxStreamModule), "libnginx-mod-stream")
		}
		t, logs = nginxStreamConf, []string{"error.log"}
		args = func(conf, dir string) []string { return []string{"-p", dir, "-c", conf} }
	case "stunnel":
		var err error
		if bin, err = benchmesh.LookTool("stunnel4", "stunnel", "/usr/bin/stunnel4"); err != nil {
			return nil, missing(err, "stunnel4")
		}
		t, logs = stunnelConf, []string{"stunnel.log"}
		args = func(conf, _ string) []string { return []string{conf} }
	default:
		return nil, fmt.Errorf("unknown peer %q (nginx_stream, nginx_plain, stunnel)", c.Name)
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
		return benchmesh.StartDaemon(c.Name, s.Dir, addrs, logs, bin, args(conf, s.Dir)...)
	}
	common := side{PKI: c.PKI, TLS: withTLS, Ports: c.Ports, Workers: c.Workers, Files: c.Files, Module: module, Root: os.Getuid() == 0}
	sb := common
	sb.Dir, sb.Listen, sb.Upstream = filepath.Join(c.Work, c.Name, "b"), c.ServerIP, c.AppIP
	b, err := start(sb)
	if err != nil {
		return nil, err
	}
	sa := common
	sa.Dir, sa.Listen, sa.Upstream, sa.Client = filepath.Join(c.Work, c.Name, "a"), c.ClientIP, c.ServerIP, true
	a, err := start(sa)
	if err != nil {
		b.Stop()
		return nil, err
	}
	return &Pair{Name: c.Name, Listen: c.ClientIP, a: a, b: b}, nil
}

// ErrMissing marks a peer that is not installed.
type ErrMissing struct {
	err error
	pkg string
}

func (e *ErrMissing) Error() string {
	return fmt.Sprintf("%v (Debian: apt-get install -y %s)", e.err, e.pkg)
}

func missing(err error, pkg string) error { return &ErrMissing{err: err, pkg: pkg} }

// NewPKI writes the pairs' CA and the two leaves into dir, and returns the
// client configuration that verifies the server side (and TLS-direct
// references) with the client's certificate.
func NewPKI(dir string) (*tls.Config, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	pk, err := benchmesh.NewPKI(dir)
	if err != nil {
		return nil, err
	}
	if _, err := pk.Issue(ServerName, 2); err != nil {
		return nil, err
	}
	cc, err := pk.Issue(clientName, 3)
	if err != nil {
		return nil, err
	}
	return &tls.Config{MinVersion: tls.VersionTLS13, ServerName: ServerName, RootCAs: pk.Pool,
		Certificates: []tls.Certificate{*cc}, ClientSessionCache: tls.NewLRUClientSessionCache(256)}, nil
}

// ServerTLS is the server configuration of the PKI in dir (an app serving
// TLS as the server side does: client certificates required).
func ServerTLS(dir string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, ServerName+".pem"), filepath.Join(dir, ServerName+".key"))
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
