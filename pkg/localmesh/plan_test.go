package localmesh

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/causeway-mesh/causeway/pkg/config"
)

func TestPlanOfTheSample(t *testing.T) {
	s, err := config.NewDirSource("../../examples/local", config.DirOptions{}).Load()
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPlan(s, 16000)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Nodes) != 2 || p.Nodes[0].Node != "node-a" || p.Nodes[1].Node != "node-b" {
		t.Fatalf("nodes = %+v", p.Nodes)
	}
	if p.Nodes[1].SOCKS5 != "127.0.0.1:16022" || p.ControlPlane.GRPC != "127.0.0.1:16000" {
		t.Fatalf("ports: %+v %+v", p.ControlPlane, p.Nodes[1])
	}
	if len(p.Waypoints) != 1 || p.Waypoints[0].HBONE != "127.0.10.2:15008" || p.Waypoints[0].ServiceAccount != "waypoint" {
		t.Fatalf("waypoints = %+v", p.Waypoints)
	}
	apps := map[string]string{}
	for _, a := range p.Apps {
		apps[a.Namespace+"/"+a.Name] = strings.Join(a.Listen, ",")
	}
	want := map[string]string{
		"shop/reviews-v1": "127.0.110.11:8080",
		"shop/reviews-v2": "127.0.110.12:8080",
		"shop/ratings":    "127.0.110.13:9090",
	}
	if len(apps) != len(want) {
		t.Fatalf("apps = %v, want %v", apps, want)
	}
	for k, v := range want {
		if apps[k] != v {
			t.Errorf("app %s listens on %q, want %q", k, apps[k], v)
		}
	}
	if _, err := NewPlan(s, 70000); err == nil {
		t.Error("base port out of range accepted")
	}
}

func TestStartRefusesBusyPort(t *testing.T) {
	s, err := config.NewDirSource("../../examples/local", config.DirOptions{}).Load()
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPlan(s, 16900)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", p.Nodes[0].SOCKS5)
	if err != nil {
		t.Skipf("cannot take %s for the test: %v", p.Nodes[0].SOCKS5, err)
	}
	defer ln.Close()
	_, err = Start(context.Background(), p, Options{BinDir: t.TempDir(), StateDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), p.Nodes[0].SOCKS5+" is already in use") {
		t.Fatalf("Start with a busy port: %v", err)
	}
}
