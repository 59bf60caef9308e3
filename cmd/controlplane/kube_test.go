package main

import (
	"flag"
	"io"
	"strings"
	"testing"
)

func parseKubeFlags(t *testing.T, kubeSource bool, args ...string) (kubeOptions, error) {
	t.Helper()
	var k kubeOptions
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	k.register(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return k, k.check(fs, kubeSource)
}

func TestKubeFlags(t *testing.T) {
	if _, err := parseKubeFlags(t, false, "--waypoint-image", "x"); err == nil || !strings.Contains(err.Error(), "--waypoint-image: only with --source kubernetes") {
		t.Errorf("a Kubernetes flag without the Kubernetes source: %v", err)
	}
	if _, err := parseKubeFlags(t, false); err != nil {
		t.Errorf("defaults in local mode: %v", err)
	}
	k, err := parseKubeFlags(t, true)
	if err != nil {
		t.Fatal(err)
	}
	if k.namespace != "causeway-system" || k.webhookDNSNames[0] != "causeway-controlplane.causeway-system.svc" || k.identity == "" ||
		k.waypointXDSAddress != "causeway-controlplane.causeway-system.svc:15012" {
		t.Errorf("defaults: %+v", k)
	}
	if _, err := parseKubeFlags(t, true, "--leader-lease-duration", "5s", "--leader-renew-deadline", "5s"); err == nil {
		t.Error("a lease no longer than the renew deadline was accepted")
	}
	if k.waypointPullPolicy != "IfNotPresent" || k.waypointReplicas != 2 {
		t.Errorf("waypoint defaults: pull policy %q, %d replicas", k.waypointPullPolicy, k.waypointReplicas)
	}
	for _, bad := range [][]string{{"--waypoint-image-pull-policy", "Sometimes"}, {"--waypoint-replicas", "0"}} {
		if _, err := parseKubeFlags(t, true, bad...); err == nil || !strings.Contains(err.Error(), bad[0]) {
			t.Errorf("%v: %v, want an error naming the flag", bad, err)
		}
	}
	if _, err := parseKubeFlags(t, true, "--waypoint-template", "/nonexistent"); err == nil {
		t.Error("a missing template was accepted")
	}
}

// Static Gateway addresses: none by default; the CIDRs given, checked.
func TestGatewayAddressFlag(t *testing.T) {
	k, err := parseKubeFlags(t, true)
	if err != nil || !k.gatewayAddresses.Empty() {
		t.Errorf("default: %v %v, want no static address allowed", k.gatewayAddresses, err)
	}
	if k, err = parseKubeFlags(t, true, "--gateway-address-cidrs", "192.0.2.0/28,2001:db8::/120"); err != nil || k.gatewayAddresses.String() != "192.0.2.0/28, 2001:db8::/120" {
		t.Errorf("two CIDRs: %v %v", k.gatewayAddresses, err)
	}
	if _, err := parseKubeFlags(t, false, "--gateway-address-cidrs", "192.0.2.0/28"); err == nil || !strings.Contains(err.Error(), "only with --source kubernetes") {
		t.Errorf("without the Kubernetes source: %v", err)
	}
	var k2 kubeOptions
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	k2.register(fs)
	if err := fs.Parse([]string{"--gateway-address-cidrs", "192.0.2.1/28"}); err == nil || !strings.Contains(err.Error(), "host bits set") {
		t.Errorf("a CIDR with host bits: %v", err)
	}
}
