package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// One node gives the four paths on it; two add the four across nodes,
// each compared with no mesh of the same placement, each in a namespace
// of its own.
func TestPaths(t *testing.T) {
	one := paths([]string{"a"})
	if len(one) != 4 {
		t.Fatalf("one node: %d paths", len(one))
	}
	two := paths([]string{"a", "b"})
	var names []string
	seen := map[string]bool{}
	for _, p := range two {
		names = append(names, p.name())
		if seen[p.namespace()] {
			t.Errorf("namespace %s twice", p.namespace())
		}
		seen[p.namespace()] = true
		b := p.baseline()
		if b.mode != noMesh || b.client != p.client || b.server != p.server {
			t.Errorf("%s: baseline %+v", p.name(), b)
		}
		if p.cross() != (p.server == "b") || p.client != "a" {
			t.Errorf("%s: client %s server %s", p.name(), p.client, p.server)
		}
	}
	if got := strings.Join(names, " "); got != "nomesh l4 l7 relay nomesh_cross l4_cross l7_cross relay_cross" {
		t.Errorf("paths %s", got)
	}
}

// The objects of a path decode strictly into the Kubernetes types (no
// misspelt field), enroll the namespace as the mode says and pin the pods
// to the path's nodes; L7 adds the waypoint and its policy, relay the two
// relays, each carrying serverPort to the next hop's Service.
func TestManifests(t *testing.T) {
	for _, p := range paths([]string{"n1", "n2"}) {
		kinds := map[string]int{}
		for _, doc := range strings.Split(p.manifests("img:1"), "---\n") {
			if strings.TrimSpace(doc) == "" {
				continue
			}
			var head struct{ Kind string }
			if err := json.Unmarshal([]byte(doc), &head); err != nil {
				t.Fatalf("%s: %v", p.name(), err)
			}
			kinds[head.Kind]++
			strict := func(v any) {
				d := json.NewDecoder(strings.NewReader(doc))
				d.DisallowUnknownFields()
				if err := d.Decode(v); err != nil {
					t.Fatalf("%s: %s: %v", p.name(), head.Kind, err)
				}
			}
			switch head.Kind {
			case "Namespace":
				var ns corev1.Namespace
				strict(&ns)
				mesh, wp := ns.Labels["causeway.dev/dataplane-mode"], ns.Labels["causeway.dev/use-waypoint"]
				if ns.Name != p.namespace() || (mesh == "mesh") != (p.mode == l4 || p.mode == l7) || (wp == waypoint) != (p.mode == l7) {
					t.Errorf("%s: namespace %s labels %v", p.name(), ns.Name, ns.Labels)
				}
			case "Pod":
				var pod corev1.Pod
				strict(&pod)
				node, args := p.client, serverArgs
				switch pod.Name {
				case "server":
					node = p.server
				case relayFirst:
					args = []string{"proxies", "-P", "8080 relay-b:8080"}
				case relaySecond:
					node, args = p.server, []string{"proxies", "-P", "8080 server:8080"}
				}
				if !slices.Equal(pod.Spec.Containers[0].Args, args) {
					t.Errorf("%s: pod %s args %q", p.name(), pod.Name, pod.Spec.Containers[0].Args)
				}
				terms := pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
				if pod.Namespace != p.namespace() || len(terms) != 1 || terms[0].MatchFields[0].Values[0] != node ||
					pod.Spec.Containers[0].Image != "img:1" || pod.Labels["app"] != pod.Name {
					t.Errorf("%s: pod %+v", p.name(), pod)
				}
			case "Service":
				var s corev1.Service
				strict(&s)
				if s.Spec.Selector["app"] != s.Name || s.Spec.Ports[0].Port != serverPort || *s.Spec.Ports[0].AppProtocol != "http" {
					t.Errorf("%s: service %+v", p.name(), s)
				}
			case "ConfigMap":
				var cm corev1.ConfigMap
				strict(&cm)
				if cm.Name != waypoint+"-policies" || cm.Data["authz.rego"] != allowAll {
					t.Errorf("%s: configmap %+v", p.name(), cm)
				}
			case "Gateway":
				if !strings.Contains(doc, `"gatewayClassName":"causeway-waypoint"`) || !strings.Contains(doc, `"protocol":"HBONE"`) {
					t.Errorf("%s: gateway %s", p.name(), doc)
				}
			default:
				t.Errorf("%s: unexpected %s", p.name(), head.Kind)
			}
		}
		want := map[string]int{"Namespace": 1, "Pod": 2, "Service": 1}
		switch p.mode {
		case l7:
			want["ConfigMap"], want["Gateway"] = 1, 1
		case relay:
			want["Pod"], want["Service"] = 4, 3
		}
		if fmt.Sprint(kinds) != fmt.Sprint(want) {
			t.Errorf("%s: objects %v, want %v", p.name(), kinds, want)
		}
	}
}

// fortio's own output (testdata/fortio.json: fortio v1.68.2 load -json
// -qps 100 -n 200 -c 4 against its server on loopback, ?status=503:2:
// two requests refused with 503) reads
// as the achieved rate, the requests, the failed and the percentiles.
func TestParseFortio(t *testing.T) {
	b, err := os.ReadFile("testdata/fortio.json")
	if err != nil {
		t.Fatal(err)
	}
	r, err := parseFortio(b)
	if err != nil {
		t.Fatal(err)
	}
	if r.requests != 200 || r.failed != 2 || r.qps < 90 || r.qps > 110 || len(r.latency) != len(percentiles) {
		t.Fatalf("%+v", r)
	}
	for i := 1; i < len(r.latency); i++ {
		if r.latency[i] < r.latency[i-1] || r.latency[0] <= 0 {
			t.Fatalf("percentiles out of order: %v", r.latency)
		}
	}
	for _, bad := range []string{`{}`, `{"DurationHistogram": {"Count": 3}}`, `not json`,
		`{"RetCodes": {"x": 1}, "DurationHistogram": {"Count": 1, "Percentiles": []}}`} {
		if _, err := parseFortio([]byte(bad)); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

func TestLoadArgs(t *testing.T) {
	got := strings.Join(load{qps: 1000, conns: 64, duration: 30 * time.Second, uniform: true}.args("http://x/"), " ")
	want := "/usr/local/bin/fortio load -quiet -json - -qps 1000 -c 64 -t 30s -r 0.00001 -p 50,90,99,99.9 -uniform http://x/"
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

// What the mesh's counters must show for each mode.
func TestCheckCapture(t *testing.T) {
	p := func(m mode) path { return path{mode: m, client: "a", server: "a"} }
	for _, c := range []struct {
		p             path
		before, after tally
		sent          int64
		want          string
	}{
		{p(noMesh), tally{any: 5}, tally{any: 5}, 100, ""},
		{p(noMesh), tally{}, tally{any: 2, outbound: 2}, 100, "opened 2 connections"},
		{p(relay), tally{any: 5}, tally{any: 5}, 100, ""},
		{p(relay), tally{}, tally{any: 1, inbound: 1}, 100, "opened 1 connections"},
		{p(l4), tally{}, tally{outbound: 64, inbound: 64, any: 128}, 100, ""},
		{p(l4), tally{outbound: 3, inbound: 3}, tally{outbound: 3, inbound: 64}, 100, "no connection left"},
		{p(l7), tally{}, tally{outbound: 1, inbound: 1, waypointRequests: 120}, 100, ""},
		{p(l7), tally{}, tally{outbound: 1, inbound: 1, waypointRequests: 99}, 100, "answered 99 requests of 100"},
	} {
		if got := checkCapture(c.p, c.before, c.after, c.sent); (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s %+v -> %+v: %q, want %q", c.p.name(), c.before, c.after, got, c.want)
		}
	}
}

// The figures are medians of the rounds; added latency is over no mesh;
// CPU per 1000 requests/s is CPU seconds per 1000 requests.
func TestReport(t *testing.T) {
	ps := paths([]string{"a"})
	win := func(p50 time.Duration, requests int64, npCPU time.Duration) window {
		return window{
			res: result{qps: 1000, requests: requests, latency: []time.Duration{p50, 2 * p50, 3 * p50, 4 * p50}},
			use: []usage{{cpu: npCPU, workingSet: 30 << 20}, {}, {cpu: 2 * time.Second}, {cpu: time.Second}, {cpu: time.Second}},
		}
	}
	ms := time.Millisecond
	rep := report{o: options{rates: []int{1000}, rounds: 3, duration: 30 * time.Second, conns: 64}, paths: ps,
		windows: map[key][]window{
			{ps[0], 1000}: {win(1*ms, 30000, 0), win(3*ms, 30000, 0), win(2*ms, 30000, 0)},
			{ps[1], 1000}: {win(5*ms, 30000, 3*time.Second), win(4*ms, 30000, 6*time.Second), win(9*ms, 30000, 9*time.Second)},
			{ps[2], 1000}: {win(8*ms, 30000, 0), win(8*ms, 30000, 0), win(8*ms, 30000, 0)},
			{ps[3], 1000}: {win(3*ms, 30000, 0), win(4*ms, 30000, 0), win(6*ms, 30000, 0)},
		},
		idle: []counters{{workingSet: 20 << 20, rss: 18 << 20}, {workingSet: 12 << 20}, {}, {}, {}},
		seen: map[path]tally{ps[1]: {outbound: 64, inbound: 64}, ps[2]: {outbound: 2, inbound: 2, waypointRequests: 90010}}}
	var b bytes.Buffer
	rep.print(&b)
	out := b.String()
	for _, want := range []string{
		"bench: nomesh_1000rps_p50 2.000 ms\n",
		"bench: l4_1000rps_p50 5.000 ms\n",
		"bench: l4_1000rps_added_p50 3.000 ms\n",
		"bench: l4_1000rps_added_p999 12.000 ms\n",
		"bench: l7_1000rps_added_p99 18.000 ms\n",
		"bench: l4_1000rps_nodeproxy_cpu_per_1000rps 0.200 vCPU\n",
		"bench: l4_1000rps_nodeproxy_working_set 30.0 MiB\n",
		"bench: l7_1000rps_waypoint_cpu_per_1000rps 0.000 vCPU\n",
		"bench: nodeproxy_idle_working_set 20.0 MiB\n",
		"bench: nodeproxy_idle_rss 18.0 MiB\n",
		"bench: l4_nodeproxy_outbound_opened 64 connections\n",
		"bench: nomesh_nodeproxy_inbound_opened 0 connections\n",
		"bench: l7_waypoint_requests 90010 requests\n",
		"bench: relay_1000rps_added_p50 2.000 ms\n",
		"bench: relay_1000rps_relay_cpu_per_1000rps 0.067 vCPU\n",
		"| l4 | 1000 | 1000.0 | 0 | 5.000 | 10.000 | 15.000 | 20.000 | 3.000 | 6.000 | 9.000 | 12.000 |\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
	for _, unwanted := range []string{"nomesh_1000rps_added", "l4_1000rps_waypoint", "l4_1000rps_relay", "relay_1000rps_waypoint",
		"nodeproxy_after", "l4_waypoint_requests", "relay_waypoint_requests"} {
		if strings.Contains(out, unwanted) {
			t.Errorf("%s in\n%s", unwanted, out)
		}
	}
}

// A pod's cgroups are found and read as the kubelet lays them out: a real
// cgroup pod<UID> with a container's below it, in the cpuacct and memory
// hierarchies, holding a process that spins and holds memory.
func TestCgroups(t *testing.T) {
	root := "/sys/fs/cgroup"
	if os.Geteuid() != 0 {
		t.Skip("creating cgroups needs root")
	}
	if _, err := os.Stat(filepath.Join(root, "cpuacct", "cpuacct.usage")); err != nil {
		t.Skipf("no cgroup v1 cpuacct hierarchy: %v", err)
	}
	uid := fmt.Sprintf("test-%d", time.Now().UnixNano())
	parent := "cw-latencyk8s-" + uid
	rel := filepath.Join(parent, "burstable", "pod"+uid)
	cid := "0123abcd"
	for _, ctl := range []string{"cpuacct", "memory"} {
		dir := filepath.Join(root, ctl, rel, cid)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Skipf("cannot create cgroups here: %v", err)
		}
		t.Cleanup(func() {
			for d := dir; d != filepath.Join(root, ctl); d = filepath.Dir(d) {
				os.Remove(d)
			}
		})
	}
	// A shell that holds 16 MiB in a variable and spins; it joins the
	// container's cgroups first.
	cmd := exec.Command("sh", "-c", `read x; x=$(head -c 16777216 /dev/zero | tr '\0' a); while :; do :; done`)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	for _, ctl := range []string{"cpuacct", "memory"} {
		if err := os.WriteFile(filepath.Join(root, ctl, rel, cid, "cgroup.procs"), []byte(fmt.Sprint(cmd.Process.Pid)), 0o644); err != nil {
			t.Skipf("cannot move a process into %s: %v", ctl, err)
		}
	}
	stdin.Close()

	g := cgroups{root: root}
	pod := corev1.Pod{}
	pod.UID = types.UID(uid)
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "c", ContainerID: "containerd://" + cid}}
	podDir, err := g.dir(pod, "")
	if err != nil || podDir != rel {
		t.Fatalf("pod dir %q, %v; want %q", podDir, err, rel)
	}
	cDir, err := g.dir(pod, "c")
	if err != nil || cDir != filepath.Join(rel, cid) {
		t.Fatalf("container dir %q, %v", cDir, err)
	}
	if _, err := g.dir(pod, "nope"); err == nil {
		t.Error("a container the pod lacks has a directory")
	}
	use, err := g.measure([]component{{"pod", []string{podDir}}, {"container", []string{cDir}}, {"none", nil}}, 100*time.Millisecond,
		func() error { time.Sleep(time.Second); return nil })
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range use[:2] {
		if u.cpu < 100*time.Millisecond || u.workingSet < 16<<20 || u.rss < 16<<20 {
			t.Errorf("%+v: want at least 100 ms CPU and 16 MiB", u)
		}
	}
	if use[2] != (usage{}) {
		t.Errorf("no cgroups used %+v", use[2])
	}
	// The process is found in the pod's cgroup by its executable.
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if pid, err := g.process(podDir, filepath.Base(exe)); err != nil || pid != cmd.Process.Pid {
		t.Errorf("process %s in the pod: %d, %v; want %d", filepath.Base(exe), pid, err, cmd.Process.Pid)
	}
	if _, err := g.process(podDir, "nodeproxy"); err == nil {
		t.Error("a process the pod does not run was found")
	}
	other := corev1.Pod{}
	other.UID = "no-such-pod"
	if _, err := g.dir(other, ""); err == nil {
		t.Error("a pod without a cgroup has a directory")
	}
}
