package e2ek8s

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/causeway-mesh/causeway/pkg/gwstatus"
)

// Installed as shipped, nothing is wrong or noisy: the mesh's components
// (the control plane, the node proxy pod's containers, waypoints) log no
// error and no Forbidden while nothing is wrong, and every status
// condition they write says what the test saw.

// meshPods are the selectors of the mesh's own pods, by namespace ("" for
// every namespace).
var meshPods = map[string]string{
	systemNS: "",
	"":       "gateway.networking.k8s.io/gateway-name",
}

// expectedLogErrors are the errors the test causes on purpose, each with
// the test that causes it; any other error fails.
var expectedLogErrors = []struct {
	re  *regexp.Regexp
	why string
}{
	// testdata/connection-policy-broken: present but bad stays an error.
	{regexp.MustCompile(`"policy_set":"e2e-broken"`), "the install's broken policy set (connection policy admission)"},
}

// logProblem is one line a component should not have logged.
type logProblem struct {
	source string // namespace/pod/container
	line   string
}

func (p logProblem) String() string { return p.source + ": " + p.line }

// klogError is client-go's (klog) error line: "E1206 03:04:05.678901 ...".
var klogError = regexp.MustCompile(`^E\d{4} \d\d:\d\d:\d\d`)

// noisyLine says whether a log line is an error (zap JSON or console, or
// klog) or mentions a Forbidden answer, and is not expected.
func noisyLine(line []byte) bool {
	line = bytes.TrimSpace(line)
	if len(line) == 0 {
		return false
	}
	bad := bytes.Contains(bytes.ToLower(line), []byte("forbidden")) || klogError.Match(line)
	if !bad && line[0] == '{' {
		var entry struct {
			Level string `json:"level"`
		}
		if json.Unmarshal(line, &entry) == nil {
			bad = errorLevel(entry.Level)
		}
	} else if !bad {
		// Console: time, level, logger, caller, message, tab-separated.
		if f := strings.SplitN(string(line), "\t", 3); len(f) >= 2 {
			bad = errorLevel(f[1])
		}
	}
	if !bad {
		return false
	}
	for _, e := range expectedLogErrors {
		if e.re.Match(line) {
			return false
		}
	}
	return true
}

func errorLevel(l string) bool {
	switch strings.ToLower(strings.TrimSpace(l)) {
	case "error", "dpanic", "panic", "fatal":
		return true
	}
	return false
}

// maxLogBytes bounds what is read of one container's log.
const maxLogBytes = 8 << 20

// scanLog returns the noisy lines of r (each cut to 600 bytes).
func scanLog(source string, r io.Reader) []logProblem {
	var out []logProblem
	sc := bufio.NewScanner(io.LimitReader(r, maxLogBytes))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if noisyLine(sc.Bytes()) {
			line := sc.Text()
			if len(line) > 600 {
				line = line[:600] + "..."
			}
			out = append(out, logProblem{source, line})
		}
	}
	return out
}

// meshContainers lists the mesh's pods and their containers (init
// containers too).
func meshContainers(ctx context.Context) (map[*corev1.Pod][]string, error) {
	out := map[*corev1.Pod][]string{}
	for ns, sel := range meshPods {
		list, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return nil, err
		}
		for i := range list.Items {
			p := &list.Items[i]
			for _, c := range append(append([]corev1.Container(nil), p.Spec.InitContainers...), p.Spec.Containers...) {
				out[p] = append(out[p], c.Name)
			}
		}
	}
	return out, nil
}

// expectQuietLogs fails the test for every error or Forbidden the mesh's
// running components logged since since (the current and the previous
// instance of each container), saying when in the test it looked.
func expectQuietLogs(t *testing.T, when string, since time.Time) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pods, err := meshContainers(ctx)
	if err != nil {
		t.Fatalf("list the mesh's pods: %v", err)
	}
	var problems []logProblem
	for p, containers := range pods {
		for _, c := range containers {
			for _, previous := range []bool{false, true} {
				st := metav1.NewTime(since)
				rc, err := client.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{
					Container: c, Previous: previous, SinceTime: &st, LimitBytes: new(int64(maxLogBytes)),
				}).Stream(ctx)
				if err != nil {
					if !previous && !apierrors.IsNotFound(err) {
						t.Errorf("logs of %s/%s/%s: %v", p.Namespace, p.Name, c, err)
					}
					continue // no previous instance, or the pod went (replaced)
				}
				problems = append(problems, scanLog(p.Namespace+"/"+p.Name+"/"+c, rc)...)
				rc.Close()
			}
		}
	}
	reportProblems(t, when, problems)
}

func reportProblems(t *testing.T, when string, problems []logProblem) {
	t.Helper()
	if len(problems) == 0 {
		return
	}
	lines := make([]string, 0, len(problems))
	for _, p := range problems {
		lines = append(lines, "  "+p.String())
	}
	t.Errorf("%s: the mesh's components logged %d error or Forbidden line(s):\n%s", when, len(problems), strings.Join(lines, "\n"))
}

// followMeshLogs follows, from now, the log of every container of the
// mesh's pods in ns until it ends (the pod is deleted) or ctx does;
// the returned function waits for that and fails the test for every noisy
// line, so what components log while they are uninstalled is checked too.
func followMeshLogs(t *testing.T, ctx context.Context, ns string) (check func(when string)) {
	t.Helper()
	pods, err := meshContainers(ctx)
	if err != nil {
		t.Fatalf("list the mesh's pods: %v", err)
	}
	var (
		mu       sync.Mutex
		problems []logProblem
		wg       sync.WaitGroup
	)
	now := metav1.Now()
	for p, containers := range pods {
		if p.Namespace != ns {
			continue
		}
		for _, c := range containers {
			rc, err := client.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{
				Container: c, Follow: true, SinceTime: &now, LimitBytes: new(int64(maxLogBytes)),
			}).Stream(ctx)
			if err != nil {
				continue // an init container that finished long ago, a container gone
			}
			wg.Go(func() {
				defer rc.Close()
				found := scanLog(p.Namespace+"/"+p.Name+"/"+c, rc)
				mu.Lock()
				problems = append(problems, found...)
				mu.Unlock()
			})
		}
	}
	return func(when string) {
		t.Helper()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		reportProblems(t, when, problems)
	}
}

// expectSampleStatus checks every status condition the mesh wrote on the
// sample's objects against what the test saw: the waypoint serves the
// shop's Services (traffic went through it), so it is Accepted and
// Programmed, both Services are bound to it, and both routes are accepted,
// their backends resolved and applied by it.
func expectSampleStatus(t *testing.T) {
	t.Helper()
	eventually(t, 30*time.Second, "the sample's status conditions", sampleStatus)
}

func sampleStatus() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wrong []string
	check := func(what string, conds []metav1.Condition, typ string, status metav1.ConditionStatus, reason string) {
		c := meta.FindStatusCondition(conds, typ)
		if c == nil || c.Status != status || c.Reason != reason {
			wrong = append(wrong, fmt.Sprintf("%s: condition %s is %+v, want %s (%s)", what, typ, c, status, reason))
		}
	}
	get := func(obj any, args ...string) error {
		out, err := runKubectl(ctx, append([]string{"get", "-o", "json"}, args...)...)
		if err != nil {
			return err
		}
		return json.Unmarshal([]byte(out), obj)
	}
	var (
		class gwv1.GatewayClass
		gw    gwv1.Gateway
		hr    gwv1.HTTPRoute
		gr    gwv1.GRPCRoute
	)
	for _, err := range []error{
		get(&class, "gatewayclass", "causeway-waypoint"), get(&gw, "-n", "shop", "gateway", "waypoint"),
		get(&hr, "-n", "shop", "httproute", "reviews"), get(&gr, "-n", "shop", "grpcroute", "ratings"),
	} {
		if err != nil {
			return err
		}
	}
	check("GatewayClass causeway-waypoint", class.Status.Conditions, "Accepted", metav1.ConditionTrue, "Accepted")
	check("Gateway shop/waypoint", gw.Status.Conditions, "Accepted", metav1.ConditionTrue, "Accepted")
	check("Gateway shop/waypoint", gw.Status.Conditions, "Programmed", metav1.ConditionTrue, "Programmed")
	for _, name := range []string{"reviews", "ratings"} {
		svc, err := client.CoreV1().Services("shop").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		check("Service shop/"+name, svc.Status.Conditions, gwstatus.ConditionWaypointBound, metav1.ConditionTrue, "Bound")
	}
	for name, st := range map[string]gwv1.RouteStatus{"HTTPRoute shop/reviews": hr.Status.RouteStatus, "GRPCRoute shop/ratings": gr.Status.RouteStatus} {
		var ours []gwv1.RouteParentStatus
		for _, p := range st.Parents {
			if p.ControllerName == gwstatus.ControllerName {
				ours = append(ours, p)
			}
		}
		if len(ours) != 1 {
			wrong = append(wrong, fmt.Sprintf("%s: %d parent entries of the mesh, want 1: %+v", name, len(ours), st.Parents))
			continue
		}
		check(name, ours[0].Conditions, "Accepted", metav1.ConditionTrue, "Accepted")
		check(name, ours[0].Conditions, "ResolvedRefs", metav1.ConditionTrue, "ResolvedRefs")
		check(name, ours[0].Conditions, gwstatus.ConditionWaypointBound, metav1.ConditionTrue, "Bound")
	}
	if len(wrong) > 0 {
		return errors.New(strings.Join(wrong, "\n"))
	}
	return nil
}

func TestNoisyLine(t *testing.T) {
	for line, want := range map[string]bool{
		`{"level":"info","msg":"node agent started"}`:                                false,
		`{"level":"warn","msg":"retrying"}`:                                          false,
		`{"level":"error","msg":"status not fully written; retrying"}`:               true,
		`{"level":"info","msg":"x","error":"services \"a\" is forbidden: User ..."}`: true,
		"2026-12-06T03:04:05.000Z\tERROR\tleader\tx.go:1\tlost":                      true,
		"2026-12-06T03:04:05.000Z\tINFO\tleader\tx.go:1\tleading":                    false,
		`E1206 03:04:05.678901       1 reflector.go:1] "Failed to watch" err="boom"`: true,
		`{"level":"error","msg":"policy rejected","policy_set":"e2e-broken"}`:        false,
		``: false,
	} {
		if got := noisyLine([]byte(line)); got != want {
			t.Errorf("noisyLine(%q) = %v, want %v", line, got, want)
		}
	}
}
