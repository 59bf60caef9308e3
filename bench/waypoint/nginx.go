package main

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/template"
	"time"

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

// nginx is the running reverse proxy.
type nginx struct {
	cmd  *exec.Cmd
	dir  string
	done chan struct{}
}

// startNginx writes the configuration into dir (which holds the PKI's
// files) and runs nginx in the foreground until stop.
func startNginx(bin, dir, listen, backend string, workers int) (*nginx, error) {
	path, err := writeNginxConf(dir, listen, backend, workers)
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "nginx.out"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(bin, "-p", dir, "-c", path)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start nginx: %w", err)
	}
	n := &nginx{cmd: cmd, dir: dir, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		close(n.done)
	}()
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", listen, time.Second)
		if err == nil {
			c.Close()
			return n, nil
		}
		select {
		case <-n.done:
			return nil, fmt.Errorf("nginx exited: %s", n.errorLog())
		default:
		}
		if time.Now().After(deadline) {
			n.stop()
			return nil, fmt.Errorf("nginx not listening on %s: %v; %s", listen, err, n.errorLog())
		}
		time.Sleep(50 * time.Millisecond)
	}
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

func (n *nginx) errorLog() string {
	var out []string
	for _, f := range []string{"nginx.out", "error.log"} {
		if data, err := os.ReadFile(filepath.Join(n.dir, f)); err == nil && len(data) > 0 {
			out = append(out, strings.TrimSpace(string(data[max(0, len(data)-2000):])))
		}
	}
	return strings.Join(out, "\n")
}

// stop asks nginx to quit (SIGQUIT: graceful), then kills its group.
func (n *nginx) stop() {
	pgid := n.cmd.Process.Pid
	_ = syscall.Kill(pgid, syscall.SIGQUIT)
	select {
	case <-n.done:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-n.done
	}
}

// pids are the master and its workers.
func (n *nginx) pids() ([]int, error) {
	master := n.cmd.Process.Pid
	kids, err := children(master)
	if err != nil {
		return nil, err
	}
	if len(kids) == 0 {
		return nil, errors.New("nginx has no worker processes")
	}
	return append([]int{master}, kids...), nil
}

// cpu is the CPU time of nginx's processes.
func (n *nginx) cpu() (time.Duration, error) {
	pids, err := n.pids()
	if err != nil {
		return 0, err
	}
	var sum time.Duration
	for _, pid := range pids {
		t, err := benchmesh.CPUTime(pid)
		if err != nil {
			return 0, err
		}
		sum += t
	}
	return sum, nil
}

// children lists the processes whose parent is pid.
func children(pid int) ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone meanwhile
		}
		// Field 4 (ppid) follows the parenthesised command name.
		i := bytes.LastIndexByte(data, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(data[i+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, child)
		}
	}
	return out, nil
}
