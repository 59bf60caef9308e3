package benchmesh

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"text/template"
)

// NginxProxy is Debian's nginx as an HTTP/1.1 reverse proxy in front of one
// upstream, what the L7 benchmarks measure the mesh's proxies against: TLS
// 1.3 in, keep-alive connections pooled to the upstream, an access log line
// per request written in batches at the latest a second later (as the
// mesh's proxies batch theirs). Certificate and key names are files in Dir.
type NginxProxy struct {
	Dir      string // configuration, PEM files, logs
	Listen   string // host:port
	Upstream string // host:port
	Workers  int
	Cert     string // the server certificate and its key
	Key      string
	ClientCA string // if set, clients must present a certificate it signed
	// UpstreamTLS, if set, is mutual TLS 1.3 to the upstream; plain HTTP
	// otherwise.
	UpstreamTLS *NginxUpstreamTLS
}

// NginxUpstreamTLS is nginx's side of mutual TLS to the upstream.
type NginxUpstreamTLS struct {
	Cert, Key string // nginx's client certificate and key
	CA        string // verifies the upstream's certificate
	Name      string // the upstream's name in it
}

var nginxProxyConf = template.Must(template.New("nginx").Parse(`# Written by a Causeway benchmark; nginx runs as its child.
daemon off;
master_process on;
user root root;
worker_processes {{.Workers}};
pid {{.Dir}}/nginx.pid;
error_log {{.Dir}}/error.log warn;
worker_rlimit_nofile 8192;
events {
  worker_connections 4096;
}
http {
  access_log {{.Dir}}/access.log combined buffer=64k flush=1s;
  client_body_temp_path {{.Dir}}/client_body;
  proxy_temp_path {{.Dir}}/proxy;
  fastcgi_temp_path {{.Dir}}/fastcgi;
  uwsgi_temp_path {{.Dir}}/uwsgi;
  scgi_temp_path {{.Dir}}/scgi;
  # keepalive_requests also caps HTTP/2 connections; raised for load tests.
  keepalive_requests 10000000;
  keepalive_timeout 120s;
  upstream backend {
    server {{.Upstream}};
    keepalive 256;
    keepalive_requests 10000000;
  }
  server {
    listen {{.Listen}} ssl;
    ssl_protocols TLSv1.3;
    ssl_certificate {{.Dir}}/{{.Cert}};
    ssl_certificate_key {{.Dir}}/{{.Key}};
{{- if .ClientCA}}
    ssl_client_certificate {{.Dir}}/{{.ClientCA}};
    ssl_verify_client on;
{{- end}}
    location / {
      proxy_http_version 1.1;
      proxy_set_header Connection "";
{{- with .UpstreamTLS}}
      proxy_pass https://backend;
      proxy_ssl_protocols TLSv1.3;
      proxy_ssl_certificate {{$.Dir}}/{{.Cert}};
      proxy_ssl_certificate_key {{$.Dir}}/{{.Key}};
      proxy_ssl_trusted_certificate {{$.Dir}}/{{.CA}};
      proxy_ssl_verify on;
      proxy_ssl_name {{.Name}};
      proxy_ssl_session_reuse on;
{{- else}}
      proxy_pass http://backend;
{{- end}}
    }
  }
}
`))

// WriteConf writes Dir/nginx.conf and returns its path.
func (n NginxProxy) WriteConf() (string, error) {
	var conf bytes.Buffer
	if err := nginxProxyConf.Execute(&conf, n); err != nil {
		return "", err
	}
	path := filepath.Join(n.Dir, "nginx.conf")
	if err := os.WriteFile(path, conf.Bytes(), 0o600); err != nil {
		return "", fmt.Errorf("nginx configuration: %w", err)
	}
	return path, nil
}

// Start writes the configuration and runs nginx (bin) in the foreground
// until stopped.
func (n NginxProxy) Start(bin string) (*Daemon, error) {
	path, err := n.WriteConf()
	if err != nil {
		return nil, err
	}
	return StartDaemon("nginx", n.Dir, []string{n.Listen}, []string{"error.log"}, bin, "-p", n.Dir, "-c", path)
}
