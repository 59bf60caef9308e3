package e2ek8s

import (
	"errors"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"

	"github.com/causeway-mesh/causeway/pkg/capture/cni"
	"github.com/causeway-mesh/causeway/pkg/capture/podns"
)

// expectMigrateReq checks that connections queued at a closing node proxy
// listener in the pod move to the next node proxy: the CNI plugin set
// tcp_migrate_req in the pod's network namespace (read from this node,
// where the runtime names the namespaces under /run/netns).
func expectMigrateReq(t *testing.T, p corev1.Pod) {
	t.Helper()
	if p.Spec.NodeName != nodeName {
		t.Logf("pod %s/%s runs on %s, not on this machine's node %s: its namespace is not checked", p.Namespace, p.Name, p.Spec.NodeName, nodeName)
		return
	}
	ip, err := netip.ParseAddr(p.Status.PodIP)
	if err != nil {
		t.Fatalf("pod %s/%s address %q: %v", p.Namespace, p.Name, p.Status.PodIP, err)
	}
	idx, err := podns.Scan("/run/netns")
	if err != nil {
		t.Fatal(err)
	}
	path, err := idx.Lookup(ip)
	if err != nil {
		t.Fatalf("pod %s/%s: %v", p.Namespace, p.Name, err)
	}
	var v []byte
	err = ns.WithNetNSPath(path, func(ns.NetNS) error {
		var err error
		v, err = os.ReadFile(cni.MigrateReqSysctl)
		return err
	})
	switch {
	case errors.Is(err, os.ErrNotExist):
		t.Logf("%s: not in this kernel (Linux 5.14+)", cni.MigrateReqSysctl)
	case err != nil:
		t.Fatal(err)
	case strings.TrimSpace(string(v)) != "1":
		t.Errorf("%s in pod %s/%s: %q, want 1 (set by the CNI plugin)", cni.MigrateReqSysctl, p.Namespace, p.Name, strings.TrimSpace(string(v)))
	}
}
