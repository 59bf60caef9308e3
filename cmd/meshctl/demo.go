package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/causeway-mesh/causeway/pkg/localmesh"
	"github.com/causeway-mesh/causeway/pkg/policy"
)

func init() {
	register("demo", "start the sample mesh (DIR, default examples/local), take a scripted tour, stop it", runDemo)
}

// echoReply is the part of the echo backend's JSON answer the tour reads.
type echoReply struct {
	Pod     string              `json:"pod"`
	Path    string              `json:"path"`
	Headers map[string][]string `json:"headers"`
}

type tour struct {
	mesh   *localmesh.Mesh
	out    io.Writer
	failed []string
}

func (t *tour) step(title string, f func() (string, error)) {
	fmt.Fprintf(t.out, "\n== %s\n", title)
	detail, err := f()
	if detail != "" {
		fmt.Fprintln(t.out, indent(detail))
	}
	if err != nil {
		fmt.Fprintf(t.out, "   FAIL: %v\n", err)
		t.failed = append(t.failed, title)
		return
	}
	fmt.Fprintln(t.out, "   ok")
}

func indent(s string) string {
	return "   " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n   ")
}

// get sends a request as pod and returns the status, the body and the echo's answer.
func (t *tour) request(pod, method, url string, hdr http.Header) (int, string, *echoReply, error) {
	c, err := t.mesh.Plan.Client(pod)
	if err != nil {
		return 0, "", nil, err
	}
	req, err := http.NewRequest(method, url, strings.NewReader(""))
	if err != nil {
		return 0, "", nil, err
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := c.HTTP(false).Do(req)
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return 0, "", nil, err
	}
	var e echoReply
	if json.Unmarshal(body, &e) != nil {
		return resp.StatusCode, string(body), nil, nil
	}
	return resp.StatusCode, string(body), &e, nil
}

func runDemo(args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	var m meshFlags
	m.register(fs)
	keep := fs.Bool("keep", false, "keep the mesh running after the tour (Ctrl-C stops it)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dir := "examples/local"
	if fs.NArg() > 0 {
		dir = fs.Arg(0)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	fmt.Printf("Starting the sample mesh from %s (state and logs in %s)...\n\n", dir, m.state)
	mesh, err := m.startMesh(ctx, dir)
	if err != nil {
		return err
	}
	defer mesh.Stop()
	printPlan(os.Stdout, mesh)

	t := &tour{mesh: mesh, out: os.Stdout}
	t.step("web/frontend GETs http://reviews.shop/ 20 times: the waypoint splits 80/20 between v1 and v2", func() (string, error) {
		count := map[string]int{}
		for range 20 {
			code, body, e, err := t.request("web/frontend", http.MethodGet, "http://reviews.shop/", nil)
			if err != nil {
				return "", err
			}
			if code != http.StatusOK || e == nil {
				return "", fmt.Errorf("status %d: %s", code, body)
			}
			count[e.Pod]++
		}
		detail := fmt.Sprintf("reviews-v1: %d, reviews-v2: %d", count["reviews-v1"], count["reviews-v2"])
		if count["reviews-v1"] == 0 || count["reviews-v1"]+count["reviews-v2"] != 20 {
			return detail, errors.New("want most requests on v1 and the rest on v2")
		}
		return detail, nil
	})
	t.step("web/frontend GETs with header x-version: v2: the HTTPRoute header match sends it to v2", func() (string, error) {
		code, body, e, err := t.request("web/frontend", http.MethodGet, "http://reviews.shop/", http.Header{"X-Version": {"v2"}})
		if err != nil {
			return "", err
		}
		if code != http.StatusOK || e == nil || e.Pod != "reviews-v2" {
			return body, fmt.Errorf("status %d, want 200 from reviews-v2", code)
		}
		return fmt.Sprintf("answered by %s; the destination saw x-causeway-source-principal %v", e.Pod, e.Headers["X-Causeway-Source-Principal"]), nil
	})
	t.step("web/frontend POSTs to reviews.shop: the OPA policy denies it", func() (string, error) {
		code, body, _, err := t.request("web/frontend", http.MethodPost, "http://reviews.shop/reviews", nil)
		if err != nil {
			return "", err
		}
		detail := fmt.Sprintf("%d %s", code, strings.TrimSpace(body))
		if code != http.StatusForbidden || !strings.Contains(body, "only the admin identity may write") {
			return detail, errors.New("want 403 with the policy's reason")
		}
		return detail, nil
	})
	t.step("web/admin POSTs to reviews.shop: allowed for the admin identity", func() (string, error) {
		code, body, _, err := t.request("web/admin", http.MethodPost, "http://reviews.shop/reviews", nil)
		if err != nil {
			return "", err
		}
		if code != http.StatusOK {
			return body, fmt.Errorf("status %d, want 200", code)
		}
		return "200", nil
	})
	t.step("web/frontend calls gRPC shop.Ratings/Get on ratings.shop:9090 through the waypoint", func() (string, error) {
		c, err := mesh.Plan.Client("web/frontend")
		if err != nil {
			return "", err
		}
		conn, err := c.GRPC("ratings.shop:9090")
		if err != nil {
			return "", err
		}
		defer conn.Close()
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		out := new(wrapperspb.StringValue)
		if err := conn.Invoke(cctx, "/shop.Ratings/Get", wrapperspb.String("book-1"), out); err != nil {
			return "", err
		}
		var e echoReply
		if err := json.Unmarshal([]byte(out.GetValue()), &e); err != nil || e.Pod != "ratings" {
			return out.GetValue(), errors.New("want an answer from the ratings pod")
		}
		return "answered by " + e.Pod + " for " + e.Path, nil
	})
	t.step("outside/outsider (not in the mesh) connects to a reviews pod: hairpin through the waypoint, unauthenticated", func() (string, error) {
		pod, err := mesh.Plan.Pod("shop/reviews-v1")
		if err != nil {
			return "", err
		}
		url := "http://" + pod.IP + ":8080"
		code, body, _, err := t.request("outside/outsider", http.MethodGet, url+"/reviews", nil)
		if err != nil {
			return "", err
		}
		detail := fmt.Sprintf("GET /reviews: %d %s", code, strings.TrimSpace(body))
		if code != http.StatusForbidden || !strings.Contains(body, "unauthenticated") {
			return detail, errors.New("want 403: the caller has no identity")
		}
		code, _, _, err = t.request("outside/outsider", http.MethodGet, url+"/public/catalog", nil)
		if err != nil {
			return detail, err
		}
		detail += fmt.Sprintf("\nGET /public/catalog: %d", code)
		if code != http.StatusOK {
			return detail, errors.New("want 200 for the public path")
		}
		return detail, nil
	})
	t.step("connection policies: shop's node proxies admitted the waypoint's connections (shop/ingress), the waypoint the tunnels from web and the hairpin (shop/waypoint-tunnels)", func() (string, error) {
		var statuses []string
		for _, n := range mesh.Plan.Nodes {
			statuses = append(statuses, n.Status)
		}
		ingress, err := policyDecisions(statuses, "shop/ingress")
		if err != nil {
			return "", err
		}
		var wps []string
		for _, w := range mesh.Plan.Waypoints {
			if !w.Ingress {
				wps = append(wps, w.Status)
			}
		}
		tunnels, err := policyDecisions(wps, "shop/waypoint-tunnels")
		if err != nil {
			return "", err
		}
		detail := fmt.Sprintf("shop/ingress: %v\nshop/waypoint-tunnels: %v", ingress, tunnels)
		if ingress["allow"] == 0 || tunnels["allow"] == 0 || ingress["deny"]+ingress["error"]+tunnels["deny"]+tunnels["error"] > 0 {
			return detail, errors.New("want allows only")
		}
		return detail, nil
	})
	if mesh.Policies != nil && len(mesh.Plan.Waypoints) > 0 {
		t.policyCommits(mesh.Policies, mesh.Plan.Waypoints[0])
	}
	node := mesh.Plan.Nodes[0]
	t.step("meshctl certificates --admin "+node.Admin+" (node proxy "+node.Node+")", func() (string, error) {
		d, err := loadDump("certificates", []string{"--admin", node.Admin})
		if err != nil {
			return "", err
		}
		var b strings.Builder
		if err := writeCertificates(&b, d.Certificates, time.Now()); err != nil {
			return "", err
		}
		if strings.Contains(b.String(), "Unavailable") {
			return b.String(), errors.New("a certificate is unavailable")
		}
		return b.String(), nil
	})
	t.step("meshctl workloads --admin "+node.Admin+" (what node proxy "+node.Node+" knows)", func() (string, error) {
		d, err := loadDump("workloads", []string{"--admin", node.Admin})
		if err != nil {
			return "", err
		}
		var b strings.Builder
		err = writeWorkloads(&b, d)
		return b.String(), err
	})

	select {
	case died := <-mesh.Died:
		return errors.New(died)
	default:
	}
	if len(t.failed) > 0 {
		return fmt.Errorf("%d step(s) failed: %s (logs in %s)", len(t.failed), strings.Join(t.failed, "; "), mesh.Opts.StateDir)
	}
	fmt.Println("\nEvery step behaved as expected.")
	if *keep {
		fmt.Println("The mesh keeps running; Ctrl-C stops it.")
		<-ctx.Done()
	}
	return nil
}

// feedbackRule lets the frontend POST /feedback: the commit the tour makes.
const feedbackRule = `
# Feedback from the frontend (committed by meshctl demo).
allowed_by contains "frontend-feedback" if {
	principal == frontend
	method == "POST"
	input.parsed_path[0] == "feedback"
}
`

// frontendWritesRule breaks the policy's own test that the frontend may
// not write: the commit the waypoint must refuse.
const frontendWritesRule = `
# The frontend may write anything (contradicts test_frontend_may_not_write).
allowed_by contains "frontend-write" if principal == frontend
`

// policyCommits commits to the policy repository: a change the waypoint
// activates, then a commit whose tests fail, which it refuses while the
// last good commit stays.
func (t *tour) policyCommits(repo *localmesh.PolicyRepo, wp localmesh.WaypointPlan) {
	name := wp.Namespace + "/" + wp.Name
	feedback := func() (int, error) {
		code, _, _, err := t.request("web/frontend", http.MethodPost, "http://reviews.shop/feedback", nil)
		return code, err
	}
	var good string
	t.step("commit to the policy repository (the frontend may POST /feedback): waypoint "+name+" activates the commit", func() (string, error) {
		if code, err := feedback(); err != nil || code != http.StatusForbidden {
			return "", fmt.Errorf("before the commit: POST /feedback %d (%v), want 403", code, err)
		}
		current, err := repo.File("authz.rego")
		if err != nil {
			return "", err
		}
		sha, err := repo.Commit("policy: the frontend may send feedback", map[string][]byte{"authz.rego": append(current, feedbackRule...)})
		if err != nil {
			return "", err
		}
		st, err := t.waitPolicy(wp, func(st *policy.Status) bool { return st.Revision == sha })
		if err != nil {
			return "", err
		}
		detail := "committed " + sha + "\nactive: " + describeGit(st)
		code, err := feedback()
		if err != nil {
			return detail, err
		}
		detail += fmt.Sprintf("\nPOST /feedback: %d", code)
		if code != http.StatusOK {
			return detail, errors.New("want 200 under the new commit")
		}
		good = sha
		return detail, nil
	})
	t.step("commit a policy whose tests fail: waypoint "+name+" refuses it, the last good commit stays", func() (string, error) {
		if good == "" {
			return "", errors.New("no good commit to keep (the previous step failed)")
		}
		current, err := repo.File("authz.rego")
		if err != nil {
			return "", err
		}
		sha, err := repo.Commit("policy: the frontend may write", map[string][]byte{"authz.rego": append(current, frontendWritesRule...)})
		if err != nil {
			return "", err
		}
		st, err := t.waitPolicy(wp, func(st *policy.Status) bool {
			return st.LastRejection != nil && st.LastRejection.Revision == sha
		})
		if err != nil {
			return "", err
		}
		r := st.LastRejection
		detail := fmt.Sprintf("committed %s\nrejected at %s: %s %v\nactive: %s", sha, r.Stage, r.Reason, r.FailedTests, describeGit(st))
		if st.Revision != good || r.Stage != "test" {
			return detail, fmt.Errorf("want the test failure refused and %s kept", good)
		}
		code, _, _, err := t.request("web/frontend", http.MethodPost, "http://reviews.shop/reviews", nil)
		if err != nil {
			return detail, err
		}
		detail += fmt.Sprintf("\nPOST /reviews: %d", code)
		if code != http.StatusForbidden {
			return detail, errors.New("want 403: the refused commit must not apply")
		}
		return detail, nil
	})
}

// waitPolicy polls the waypoint's /config_dump until ok holds (30 s at most).
func (t *tour) waitPolicy(wp localmesh.WaypointPlan, ok func(*policy.Status) bool) (*policy.Status, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		d, err := loadDump("policies", []string{"--admin", wp.Admin})
		if err == nil && d.Policies != nil && ok(d.Policies) {
			return d.Policies, nil
		}
		if time.Now().After(deadline) {
			if err == nil && d.Policies != nil {
				err = fmt.Errorf("revision %s, last rejection %+v", d.Policies.Revision, d.Policies.LastRejection)
			}
			return nil, fmt.Errorf("waypoint %s/%s did not get there: %v", wp.Namespace, wp.Name, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// describeGit is the active revision as /config_dump tells it.
func describeGit(st *policy.Status) string {
	s := st.Revision
	if c := st.Sources[policy.GitSource].Commit; c != nil {
		s += fmt.Sprintf(" (%s, committed %s: %q)", c.Ref, c.Time.Format(time.RFC3339), c.Subject)
	}
	return s
}

// policyDecisions sums connection_policy_decisions_total of one policy
// by result over the /metrics of the given status addresses.
func policyDecisions(statuses []string, policyName string) (map[string]float64, error) {
	out := map[string]float64{}
	for _, addr := range statuses {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return nil, err
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		mfs, err := parser.TextToMetricFamilies(io.LimitReader(resp.Body, 16<<20))
		resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("%s/metrics: %w", addr, err)
		}
		for _, m := range mfs["connection_policy_decisions_total"].GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["policy"] == policyName {
				out[labels["result"]] += m.GetCounter().GetValue()
			}
		}
	}
	return out, nil
}
