package main

import (
	"flag"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/causeway-mesh/causeway/bench/internal/benchmesh"
	"github.com/causeway-mesh/causeway/pkg/backendtls/backendtlstest"
	"github.com/causeway-mesh/causeway/pkg/config"
	"github.com/causeway-mesh/causeway/pkg/localmesh"
)

// The benchmark's mesh loads as local mode reads it, its certificates in
// place: the ingress gateway's pod with its own address, the waypoint,
// and the backend on node-b with the app address the fortio server serves;
// the mesh's own ports stay in the benchmark's range, clear of its
// listeners'.
func TestMeshYAML(t *testing.T) {
	dir := t.TempDir()
	ca, err := backendtlstest.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	secrets := backendtlstest.SecretYAML("edge", "direct-cert", ca.SecretData(t, hostDirect)) + "---\n" +
		backendtlstest.SecretYAML("edge", "waypoint-cert", ca.SecretData(t, hostWaypoint))
	if err := os.WriteFile(filepath.Join(dir, "mesh.yaml"), []byte(meshYAML+"---\n"+secrets), 0o644); err != nil {
		t.Fatal(err)
	}
	snap, err := config.NewDirSource(dir, config.DirOptions{}).Load()
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	plan, err := localmesh.NewPlan(snap, basePort)
	if err != nil {
		t.Fatal(err)
	}
	var ingress, waypoint bool
	for _, w := range plan.Waypoints {
		switch {
		case w.Ingress && w.Namespace == "edge" && w.Name == "ingress" && w.IP == gatewayIP:
			ingress = true
		case !w.Ingress && w.Namespace == "bench" && w.IP == waypointIP:
			waypoint = true
		}
	}
	if !ingress || !waypoint {
		t.Fatalf("waypoints %+v: want the ingress gateway at %s and bench's waypoint at %s", plan.Waypoints, gatewayIP, waypointIP)
	}
	pod, err := plan.Pod("bench/backend")
	if err != nil {
		t.Fatal(err)
	}
	if pod.Node != "node-b" {
		t.Errorf("backend on %q, want node-b", pod.Node)
	}
	if _, ok := plan.Node("node-b"); !ok {
		t.Error("no node proxy for node-b")
	}
	var addrs []string
	for _, n := range plan.Nodes {
		addrs = append(addrs, n.Admin, n.Status, n.SOCKS5)
	}
	for _, w := range plan.Waypoints {
		addrs = append(addrs, w.Admin, w.Status)
	}
	addrs = append(addrs, plan.ControlPlane.GRPC, plan.ControlPlane.Status)
	for _, a := range addrs {
		_, port, _ := strings.Cut(a, ":")
		if n, err := strconv.Atoi(port); err != nil || n < 27000 || n > 27999 || port == appPort || port == strconv.Itoa(httpsPort) {
			t.Errorf("mesh address %s outside 27000-27999 or on a listener's port", a)
		}
	}
}

func TestFlags(t *testing.T) {
	parse := func(args ...string) (options, string, error) {
		fs := flag.NewFlagSet("ingress", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		return parseFlags(fs, args)
	}
	o, _, err := parse("-paths", "nginx, gateway,nginx")
	if err != nil || !slices.Equal(o.paths, []string{"gateway", "nginx"}) {
		t.Errorf("paths %v, %v; want gateway,nginx in the rounds' order, once each", o.paths, err)
	}
	if o, _, err := parse(); err != nil || !slices.Equal(o.paths, allPaths) || o.rate != 1000 || o.conns != 64 || o.rounds != 3 {
		t.Errorf("defaults %+v, %v", o, err)
	}
	for _, args := range [][]string{{"-paths", "direct,l5"}, {"-rate", "0"}, {"-conns", "0"}, {"-rounds", "0"}, {"-duration", "-1s"}, {"-nginx-workers", "0"}} {
		if _, _, err := parse(args...); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
	if _, serve, err := parse("-serve", "127.0.27.102:27080"); err != nil || serve != "127.0.27.102:27080" {
		t.Errorf("-serve: %q, %v", serve, err)
	}
}

// nginx accepts the configuration: the listener's certificate in, plain
// HTTP to the backend.
func TestNginxConfigValid(t *testing.T) {
	bin, err := benchmesh.LookTool("nginx", "/usr/sbin/nginx")
	if err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	ca, err := backendtlstest.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range ca.SecretData(t, hostDirect) {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	conf, err := nginxProxy(dir, 2).WriteConf()
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "-t", "-p", dir, "-c", conf).CombinedOutput(); err != nil {
		t.Fatalf("nginx -t: %v\n%s", err, out)
	}
	data, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), "proxy_pass http://backend;") || strings.Contains(string(data), "ssl_verify_client") {
		t.Errorf("configuration is not TLS in, plain HTTP out:\n%s", data)
	}
}
