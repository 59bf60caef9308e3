package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"text/template"

	"github.com/causeway-mesh/causeway/bench/internal/benchmesh"
)

// nginxConf is nginx doing what the ingress gateway does: TLS 1.3 in with
// the listener's certificate, HTTP/1.1 to one upstream over pooled
// keep-alive connections, an access log line per request written in
// batches at the latest a second later, as the gateway writes its own.
var nginxConf = template.Must(template.New("nginx").Parse(`# Written by bench/ingress; nginx runs as its child.
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
    ssl_certificate {{.Dir}}/tls.crt;
    ssl_certificate_key {{.Dir}}/tls.key;
    ssl_session_cache shared:tls:10m;
    location / {
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
`))

// startNginx writes dir/nginx.conf (dir holds tls.crt and tls.key) and
// runs nginx in the foreground until stopped.
func startNginx(bin, dir, listen, backend string, workers int) (*benchmesh.Daemon, error) {
	var conf bytes.Buffer
	if err := nginxConf.Execute(&conf, map[string]any{"Dir": dir, "Listen": listen, "Backend": backend, "Workers": workers}); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, conf.Bytes(), 0o600); err != nil {
		return nil, fmt.Errorf("nginx configuration: %w", err)
	}
	return benchmesh.StartDaemon("nginx", dir, []string{listen}, []string{"error.log"}, bin, "-p", dir, "-c", path)
}
