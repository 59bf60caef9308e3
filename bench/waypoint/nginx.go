package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"text/template"

	"github.com/causeway-mesh/causeway/bench/internal/benchmesh"
)

// nginxConf is nginx doing what the waypoint does, without the policy:
// mutual TLS 1.3 in, HTTP/1.1 routing to one upstream, mutual TLS 1.3 out
// over pooled keep-alive connections, an access log line per request,
// written in batches at the latest a second later, as the waypoint writes
// its own.
var nginxConf = template.Must(template.New("nginx").Parse(`# Written by bench/waypoint; nginx runs as its child.
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
    server {{.Backend}};
    keepalive 256;
    keepalive_requests 10000000;
  }
  server {
    listen {{.Listen}} ssl;
    ssl_protocols TLSv1.3;
    ssl_certificate {{.Dir}}/nginx.bench.pem;
    ssl_certificate_key {{.Dir}}/nginx.bench.key;
    ssl_client_certificate {{.Dir}}/ca.pem;
    ssl_verify_client on;
    location / {
      proxy_pass https://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_ssl_protocols TLSv1.3;
      proxy_ssl_certificate {{.Dir}}/nginx-client.bench.pem;
      proxy_ssl_certificate_key {{.Dir}}/nginx-client.bench.key;
      proxy_ssl_trusted_certificate {{.Dir}}/ca.pem;
      proxy_ssl_verify on;
      proxy_ssl_name backend.bench;
      proxy_ssl_session_reuse on;
    }
  }
}
`))

// startNginx writes the configuration into dir (which holds the PKI's
// files) and runs nginx in the foreground until stopped.
func startNginx(bin, dir, listen, backend string, workers int) (*benchmesh.Daemon, error) {
	path, err := writeNginxConf(dir, listen, backend, workers)
	if err != nil {
		return nil, err
	}
	return benchmesh.StartDaemon("nginx", dir, []string{listen}, []string{"error.log"}, bin, "-p", dir, "-c", path)
}

// writeNginxConf writes dir/nginx.conf and returns its path.
func writeNginxConf(dir, listen, backend string, workers int) (string, error) {
	var conf bytes.Buffer
	if err := nginxConf.Execute(&conf, map[string]any{"Dir": dir, "Listen": listen, "Backend": backend, "Workers": workers}); err != nil {
		return "", err
	}
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, conf.Bytes(), 0o600); err != nil {
		return "", fmt.Errorf("nginx configuration: %w", err)
	}
	return path, nil
}
