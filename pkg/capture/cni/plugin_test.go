package cni

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
)

const conf = `{"cniVersion":"1.0.0","name":"k8s","type":"causeway-cni"%s,
  "prevResult":{"cniVersion":"1.0.0","ips":[{"address":"10.244.0.7/24","gateway":"10.244.0.1"},{"address":"fd00::7/64"}]}}`

func args(extra, cniArgs string) *skel.CmdArgs {
	return &skel.CmdArgs{ContainerID: "c1", Netns: "/var/run/netns/x", IfName: "eth0", Args: cniArgs,
		StdinData: []byte(strings.Replace(conf, "%s", extra, 1))}
}

func TestEvent(t *testing.T) {
	a := args("", "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=cart-1;K8S_POD_UID=u")
	c, timeout, err := parseConfig(a.StdinData)
	if err != nil {
		t.Fatal(err)
	}
	if c.AgentSocket != DefaultAgentSocket || timeout <= 0 {
		t.Errorf("defaults: socket %q timeout %s", c.AgentSocket, timeout)
	}
	ev, err := event(a, c)
	if err != nil || ev == nil {
		t.Fatalf("event = %+v, %v", ev, err)
	}
	if ev.PodName != "cart-1" || ev.Namespace != "shop" || ev.ContainerID != "c1" || ev.Netns != a.Netns {
		t.Errorf("event %+v", ev)
	}
	if want := []netip.Addr{netip.MustParseAddr("10.244.0.7"), netip.MustParseAddr("fd00::7")}; !slices.Equal(ev.IPs, want) {
		t.Errorf("IPs %v, want %v", ev.IPs, want)
	}
	if want := []netip.Addr{netip.MustParseAddr("10.244.0.1")}; !slices.Equal(ev.Gateways, want) {
		t.Errorf("Gateways %v, want %v", ev.Gateways, want)
	}
}

func TestEventSkips(t *testing.T) {
	for _, tc := range []struct{ name, extra, args string }{
		{"not a Kubernetes pod", "", ""},
		{"no pod name", "", "K8S_POD_NAMESPACE=shop"},
		{"system namespace", "", "K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns"},
		{"excluded namespace", `,"exclude_namespaces":["shop"]`, "K8S_POD_NAMESPACE=shop;K8S_POD_NAME=cart-1"},
	} {
		a := args(tc.extra, tc.args)
		c, _, err := parseConfig(a.StdinData)
		if err != nil {
			t.Fatal(err)
		}
		if ev, err := event(a, c); err != nil || ev != nil {
			t.Errorf("%s: event = %+v, %v; want none", tc.name, ev, err)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	for _, extra := range []string{`,"timeout":"soon"`, `,"timeout":"-1s"`} {
		if _, _, err := parseConfig(args(extra, "").StdinData); err == nil {
			t.Errorf("config with %s accepted", extra)
		}
	}
	if _, _, err := parseConfig([]byte("{")); err == nil {
		t.Error("bad JSON accepted")
	}
}
