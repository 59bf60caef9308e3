// Command faults runs a local mesh (pkg/localmesh: the real binaries on
// loopback) under a fixed-rate load and injects one fault per row while the
// load runs: processes killed, restarted gracefully, configuration edited.
// For each row it prints requests sent, failed (by cause) and the longest
// gap between successful answers, on new connections (one per request) and
// on existing ones (keep-alive), then whether the row met its expectation.
// It exits 1 when any row did not.
//
//	go run ./bench/faults -bin bin [-row 20s] [-rate 25] [-only policy] [-base-port 21000]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/causeway-mesh/causeway/bench/internal/benchmesh"
	"github.com/causeway-mesh/causeway/bench/internal/faultload"
	"github.com/causeway-mesh/causeway/pkg/localmesh"
	"github.com/causeway-mesh/causeway/pkg/trust/certmanager"
)

type options struct {
	bin      string
	work     string
	basePort int
	rate     int
	rowTime  time.Duration
	only     string
	keep     bool
	certTTL  time.Duration
	soak     soakOptions
}

func main() {
	var o options
	flag.StringVar(&o.bin, "bin", "bin", "directory of the built binaries (make build)")
	flag.StringVar(&o.work, "work", "", "work directory (default: a new temporary one, removed afterwards)")
	flag.IntVar(&o.basePort, "base-port", 21000, "first of the 127.0.0.1 ports the mesh's admin and status listeners take")
	flag.IntVar(&o.rate, "rate", 25, "requests per second on each kind of connection (new, existing)")
	flag.DurationVar(&o.rowTime, "row", 20*time.Second, "how long the load runs for each row; the fault comes after a quarter of it")
	flag.StringVar(&o.only, "only", "", "run only the rows whose name matches this regular expression")
	flag.DurationVar(&o.certTTL, "cert-ttl", 40*time.Second, "lifetime of every mesh certificate (the control plane's --cert-ttl); the CA row keeps the CA down for 60 % of it")
	flag.BoolVar(&o.keep, "keep", false, "keep the work directory (logs of every process)")
	flag.DurationVar(&o.soak.duration, "soak", time.Minute, "how long the soak row holds its connections (the issue's figure: 10m)")
	flag.IntVar(&o.soak.idle, "soak-idle", 10000, "idle connections the soak row holds")
	flag.IntVar(&o.soak.active, "soak-active", 1000, "active connections the soak row holds")
	flag.DurationVar(&o.soak.interval, "soak-interval", 5*time.Second, "time between two GETs of one active connection")
	flag.DurationVar(&o.soak.sample, "soak-sample", 10*time.Second, "how often the soak row samples goroutines, file descriptors and RSS")
	flag.IntVar(&o.soak.openRate, "soak-open-rate", 200, "connections the soak row opens per second")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "faults:", err)
		os.Exit(1)
	}
}

// harness is the running mesh, its configuration and the load.
type harness struct {
	mesh     *localmesh.Mesh
	cfg, pol string
	load     *faultload.Load
	rowTime  time.Duration
	certTTL  time.Duration
	// policyRev is the revision marker of the policy on disk.
	policyRev int
	// clockFile is node-a's --clock-offset-file.
	clockFile string
}

// outcome is what injecting a fault observed besides the load: a note for
// the table and, when the fault's own checks failed, a problem.
type outcome struct{ note, problem string }

// row is one fault and what it must show.
type row struct {
	name, fault, expectation string
	inject                   func(ctx context.Context, h *harness) (outcome, error)
	// judge says whether the figures meet the expectation ("" if so).
	judge func(fresh, existing faultload.Summary) string
	// before prepares the row (before the mesh is checked to serve).
	before func(h *harness) error
	// after mends what the fault broke, once the load has stopped.
	after func(ctx context.Context, h *harness) error
}

func run(ctx context.Context, o options) error {
	only, err := regexp.Compile(o.only)
	if err != nil {
		return fmt.Errorf("-only: %w", err)
	}
	work := o.work
	if work == "" {
		if work, err = os.MkdirTemp("", "causeway-faults-"); err != nil {
			return err
		}
	}
	keep := o.keep
	defer func() {
		if keep {
			fmt.Fprintln(os.Stderr, "faults: work directory kept:", work)
		} else {
			os.RemoveAll(work)
		}
	}()
	if only.MatchString("soak") {
		if err := raiseFileLimit(uint64(o.soak.idle+o.soak.active) + 4096); err != nil {
			return err
		}
	}
	h := &harness{cfg: filepath.Join(work, "config"), pol: filepath.Join(work, "policies"), rowTime: o.rowTime, certTTL: o.certTTL,
		clockFile: filepath.Join(work, "clock-offset-node-a")}
	if err := os.MkdirAll(h.cfg, 0o755); err != nil {
		return err
	}
	if err := h.writeRoute(50, 50, ""); err != nil {
		return err
	}
	mesh, err := benchmesh.Start(ctx, benchmesh.Setup{BinDir: o.bin, WorkDir: work, Mesh: meshTemplate, BasePort: o.basePort,
		Policies:         map[string]string{"authz.rego": faultload.Policy(0)},
		ControlPlaneArgs: []string{"--cert-ttl", o.certTTL.String()},
		NodeProxyArgs:    map[string][]string{"node-a": {"--clock-offset-file", h.clockFile}}})
	if err != nil {
		keep = true
		return fmt.Errorf("start mesh: %w", err)
	}
	defer mesh.Stop()
	h.mesh = mesh
	client, err := mesh.Plan.Client("web/frontend")
	if err != nil {
		return err
	}
	fresh := client.HTTP(false)
	fresh.Timeout = 10 * time.Second
	h.load = &faultload.Load{URL: "http://reviews.shop/", Rate: o.rate, Fresh: fresh,
		Existing: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: client.DialContext,
			MaxIdleConnsPerHost: 4, MaxConnsPerHost: 4, IdleConnTimeout: time.Minute}}}

	fmt.Printf("faults: %d req/s on new and on existing connections, %v per row, fault after %v\n\n", o.rate, o.rowTime, o.rowTime/4)
	for _, r := range rows(o) {
		if only.MatchString(r.name) {
			fmt.Printf("- %s: %s; expected: %s\n", r.name, r.fault, r.expectation)
		}
	}
	fmt.Println()
	fmt.Print(faultload.TableHeader)
	missed := 0
	for _, r := range rows(o) {
		if !only.MatchString(r.name) {
			continue
		}
		if r.before != nil {
			if err := r.before(h); err != nil {
				return fmt.Errorf("%s: %w", r.name, err)
			}
			faultload.Sleep(ctx, 2*time.Second) // the control plane's debounce and push
		}
		if err := h.settle(ctx); err != nil {
			keep = true
			return fmt.Errorf("%s: mesh not serving before the fault: %w", r.name, err)
		}
		fresh, existing, out, err := h.window(ctx, r.inject)
		if err != nil {
			keep = true
			return fmt.Errorf("%s: %w", r.name, err)
		}
		result, met := faultload.Verdict(r.judge(fresh, existing), out.problem, out.note)
		if !met {
			missed++
		}
		faultload.PrintRow(os.Stdout, r.name, fresh, existing, result)
		if r.after != nil {
			if err := r.after(ctx, h); err != nil {
				keep = true
				return fmt.Errorf("%s: mend: %w", r.name, err)
			}
		}
		select {
		case died := <-mesh.Died:
			keep = true
			return fmt.Errorf("%s: a process died: %s", r.name, died)
		default:
		}
	}
	if missed > 0 {
		keep = true
		return fmt.Errorf("%d rows did not meet their expectation", missed)
	}
	return nil
}

// window runs the load for one row, injecting the fault after a quarter
// of it.
func (h *harness) window(ctx context.Context, inject func(context.Context, *harness) (outcome, error)) (fresh, existing faultload.Summary, out outcome, err error) {
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	from := time.Now()
	go func() {
		h.load.Run(lctx)
		close(done)
	}()
	faultload.Sleep(ctx, h.rowTime/4)
	out, err = inject(ctx, h)
	faultload.Sleep(ctx, time.Until(from.Add(h.rowTime)))
	cancel()
	<-done
	rs := h.load.Take()
	to := time.Now()
	return faultload.Summarize(rs, "new", from, to), faultload.Summarize(rs, "existing", from, to), out, err
}

// settle waits until a request succeeds again, so a row starts on a
// serving mesh whatever the row before it did.
func (h *harness) settle(ctx context.Context) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := h.load.One(h.load.Fresh)
		if r.Cause == "" {
			h.load.Take()
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("last answer: %s", r.Cause)
		}
		faultload.Sleep(ctx, 200*time.Millisecond)
	}
}

func (h *harness) writeRoute(v1, v2 int, extra string) error {
	return writeAtomic(filepath.Join(h.cfg, "route.yaml"), faultload.Route(v1, v2, extra, faultload.RetryOn5xx))
}

// writeAtomic replaces a file by renaming, as an editor or a Git checkout
// would, so that a reader never sees half of it.
func writeAtomic(path, content string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Process names as pkg/localmesh gives them.
const (
	controlPlane = "controlplane"
	nodeProxyA   = "nodeproxy-node-a" // the client's node
	waypoint0    = "waypoint-shop-waypoint-0"
	waypoint1    = "waypoint-shop-waypoint-1"
	backendV2    = "app-shop-reviews-v2"
)

// kill sends sig to a process and waits (up to grace) for it to exit,
// returning how long that took.
func (h *harness) kill(ctx context.Context, name string, sig syscall.Signal, grace time.Duration) (time.Duration, error) {
	exited, err := h.mesh.Exited(name)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if err := h.mesh.Signal(name, sig); err != nil {
		return 0, err
	}
	select {
	case <-exited:
		return time.Since(start), nil
	case <-time.After(grace):
		return 0, fmt.Errorf("%s still running %v after %v", name, grace, sig)
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// restart kills a process with sig, starts it again and says how long it
// took to exit and how long until the new one was ready.
func restart(sig syscall.Signal, name string, down time.Duration) func(context.Context, *harness) (outcome, error) {
	return func(ctx context.Context, h *harness) (outcome, error) {
		exit, err := h.kill(ctx, name, sig, 30*time.Second)
		if err != nil {
			return outcome{}, err
		}
		faultload.Sleep(ctx, down)
		start := time.Now()
		if err := h.mesh.Restart(ctx, name); err != nil {
			return outcome{}, err
		}
		return outcome{note: fmt.Sprintf("%s exited %v after %v, down %v, ready %v after restart", name, exit.Round(time.Millisecond), sig,
			down, time.Since(start).Round(time.Millisecond))}, nil
	}
}

// certificateStates reads every node proxy's certificates from its
// /config_dump.
func (h *harness) certificateStates() ([]certmanager.CertificateStatus, error) {
	client := &http.Client{Timeout: 5 * time.Second}
	var all []certmanager.CertificateStatus
	for _, n := range h.mesh.Plan.Nodes {
		resp, err := client.Get("http://" + n.Admin + "/config_dump")
		if err != nil {
			return nil, err
		}
		var dump struct {
			Certificates []certmanager.CertificateStatus
		}
		err = json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&dump)
		resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("%s /config_dump: %w", n.Node, err)
		}
		all = append(all, dump.Certificates...)
	}
	return all, nil
}

// waitRefreshed waits until every node proxy certificate is Available
// without a failing refresh, and says when that was.
func (h *harness) waitRefreshed(ctx context.Context, limit time.Duration) (time.Time, error) {
	deadline := time.Now().Add(limit)
	for {
		states, err := h.certificateStates()
		if err != nil {
			return time.Time{}, err
		}
		done := true
		for _, c := range states {
			done = done && c.State == certmanager.StateAvailable && c.RefreshError == ""
		}
		if done {
			return time.Now(), nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return time.Time{}, fmt.Errorf("certificates not refreshed %v after the CA came back: %+v", limit, states)
		}
		faultload.Sleep(ctx, 200*time.Millisecond)
	}
}

func rows(o options) []row {
	return []row{
		{
			name: "controlplane-kill", fault: "control plane killed (SIGKILL), restarted after 5 s",
			expectation: "0 failed on existing and new connections (last configuration and certificates kept)",
			inject:      restart(syscall.SIGKILL, controlPlane, 5*time.Second), judge: faultload.NoFailures,
		},
		{
			name: "waypoint-sigterm", fault: "waypoint replica restarted gracefully (SIGTERM), 2 replicas",
			expectation: "0 failed: GOAWAY, drain, exit",
			inject:      restart(syscall.SIGTERM, waypoint0, 0), judge: faultload.NoFailures,
		},
		{
			name: "waypoint-kill", fault: "waypoint replica killed (SIGKILL), 2 replicas, left down",
			expectation: "in-flight requests fail at most once each; new requests 0 failed; node proxies stop choosing it within a bound",
			inject: func(ctx context.Context, h *harness) (outcome, error) {
				logPath := h.mesh.LogPath(nodeProxyA)
				logFrom, err := fileSize(logPath)
				if err != nil {
					return outcome{}, err
				}
				if _, err := h.kill(ctx, waypoint1, syscall.SIGKILL, 10*time.Second); err != nil {
					return outcome{}, err
				}
				killed := time.Now()
				// The first connection whose dial to it fails ejects it.
				addr := ""
				for _, w := range h.mesh.Plan.Waypoints {
					if "waypoint-"+w.Namespace+"-"+w.Pod == waypoint1 {
						addr = w.HBONE
					}
				}
				var line string
				_, ejected := h.until(ctx, 5*time.Second, func() bool {
					line, err = firstLineWith(logPath, logFrom, []string{"hop unreachable", addr})
					return err != nil || line != ""
				})
				if err != nil {
					return outcome{}, err
				}
				if !ejected {
					return outcome{note: waypoint1 + " killed", problem: fmt.Sprintf("%s did not eject %s within 5 s", nodeProxyA, addr)}, nil
				}
				var entry struct{ TS time.Time }
				if err := json.Unmarshal([]byte(line), &entry); err != nil {
					return outcome{}, fmt.Errorf("%s log: %w", nodeProxyA, err)
				}
				return outcome{note: fmt.Sprintf("%s killed; %s tries it last from %v after (its first failed dial; for 5 s, doubling while dials fail)",
					waypoint1, nodeProxyA, entry.TS.Sub(killed).Round(time.Millisecond))}, nil
			},
			judge: faultload.NoFailures,
			after: func(ctx context.Context, h *harness) error { return h.mesh.Restart(ctx, waypoint1) },
		},
		{
			name: "nodeproxy-restart", fault: "client's node proxy restarted gracefully (SIGTERM)",
			expectation: "existing connections drained within the deadline; new connections refused for a measured gap",
			inject:      restart(syscall.SIGTERM, nodeProxyA, 0),
			// New connections are refused while it drains and until the new
			// one listens: that gap is the figure. Requests on connections
			// made before keep being answered while it drains (the pool
			// of the "existing" kind dials a few new ones, refused too).
			judge: func(_, existing faultload.Summary) string {
				if existing.LongestGap > 2*time.Second {
					return fmt.Sprintf("existing connections stopped for %v", existing.LongestGap.Round(time.Millisecond))
				}
				return ""
			},
		},
		{
			name: "policy-edit", fault: "policy edited every second",
			expectation: "0 failed; every request decided by exactly one revision",
			inject: func(ctx context.Context, h *harness) (outcome, error) {
				n := int(h.rowTime / 2 / time.Second)
				for i := 1; i <= n && ctx.Err() == nil; i++ {
					h.policyRev++
					if err := writeAtomic(filepath.Join(h.pol, "authz.rego"), faultload.Policy(h.policyRev)); err != nil {
						return outcome{}, err
					}
					faultload.Sleep(ctx, time.Second)
				}
				return outcome{note: fmt.Sprintf("%d edits", n)}, nil
			},
			// The edits must take effect: answers show several revisions.
			judge: func(fresh, existing faultload.Summary) string {
				why := faultload.NoFailures(fresh, existing)
				if seen := len(fresh.Revisions); seen < 2 {
					why = strings.TrimPrefix(why+fmt.Sprintf(", answers show %d policy revision(s)", seen), ", ")
				}
				return why
			},
		},
		{
			name: "route-edit", fault: "route edited every second (weights, a new rule)",
			expectation: "0 failed",
			inject: func(ctx context.Context, h *harness) (outcome, error) {
				n := int(h.rowTime / 2 / time.Second)
				weights := [][2]int{{100, 0}, {0, 100}, {50, 50}}
				for i := 0; i < n && ctx.Err() == nil; i++ {
					extra := ""
					if i%2 == 1 {
						extra = faultload.ExtraRule
					}
					w := weights[i%len(weights)]
					if err := h.writeRoute(w[0], w[1], extra); err != nil {
						return outcome{}, err
					}
					faultload.Sleep(ctx, time.Second)
				}
				return outcome{note: fmt.Sprintf("%d edits", n)}, h.writeRoute(50, 50, "")
			},
			judge: faultload.NoFailures,
		},
		{
			name: "backend-kill", fault: "one of the two endpoints of the route's backend killed (SIGKILL), left down",
			expectation: "failures within the route's retry policy (2 attempts on 502/503)",
			inject: func(ctx context.Context, h *harness) (outcome, error) {
				_, err := h.kill(ctx, backendV2, syscall.SIGKILL, 10*time.Second)
				return outcome{note: backendV2 + " killed"}, err
			},
			judge: faultload.NoFailures,
			before: func(h *harness) error {
				return writeAtomic(filepath.Join(h.cfg, "route.yaml"), faultload.SingleBackendRoute(faultload.RetryOn5xx))
			},
			after: func(ctx context.Context, h *harness) error {
				if err := h.writeRoute(50, 50, ""); err != nil {
					return err
				}
				return h.mesh.Restart(ctx, backendV2)
			},
		},
		{
			name: "clock-skew", fault: fmt.Sprintf("client's node proxy clock %v ahead for %v, right, %v behind for %v, right", skew, skewPhase, skew, skewPhase),
			expectation: "refused with the reason (expired / not yet valid, by how much) in its log and metrics; served again once the clock is right",
			inject:      clockSkew,
			// New connections need node-a's own certificate, expired by
			// its clock ahead: they must fail then (or the skew did not
			// take). Connections made before keep their TLS sessions.
			judge: func(fresh, existing faultload.Summary) string {
				why := faultload.NoFailures(faultload.Summary{}, existing)
				if fresh.Failed == 0 {
					why = strings.TrimPrefix(why+", no new connection refused", ", ")
				}
				return why
			},
			after: func(ctx context.Context, h *harness) error { return h.setClock(0) },
		},
		{
			name: "soak", fault: fmt.Sprintf("%d idle connections (to a pod without a waypoint, across both node proxies) and %d active ones (a GET every %v through the waypoints), opened %d a second, held for %v",
				o.soak.idle, o.soak.active, o.soak.interval, o.soak.openRate, o.soak.duration),
			expectation: "goroutines, file descriptors and RSS of the proxies flat while held (sampled), back down once closed; no connection closed by the mesh " +
				"(the kernel's keepalive aborts, counted by the host's TCPAbortOnTimeout, are reported as the host's)",
			inject: soakRow(o.soak), judge: faultload.NoFailures,
		},
		// Last: certificates may expire while the CA is down, and the
		// rows after it would measure the recovery instead of their fault.
		{
			name: "ca-unreachable", fault: "CA (the control plane) down for 60 % of a certificate's life",
			expectation: "traffic continues until expiry (less the margin before it); certificates Available (refresh failing) until then",
			inject: func(ctx context.Context, h *harness) (outcome, error) {
				if _, err := h.kill(ctx, controlPlane, syscall.SIGKILL, 10*time.Second); err != nil {
					return outcome{}, err
				}
				down := h.certTTL * 6 / 10
				faultload.Sleep(ctx, down)
				states, err := h.certificateStates()
				if err != nil {
					return outcome{}, err
				}
				sampled := time.Now()
				if err := h.mesh.Restart(ctx, controlPlane); err != nil {
					return outcome{}, err
				}
				back := time.Now()
				refreshed, err := h.waitRefreshed(ctx, 3*h.certTTL)
				if err != nil {
					return outcome{}, err
				}
				var problems []string
				valid, failing := 0, 0
				for _, c := range states {
					expired, expiring := len(c.CertChain) == 0, false
					if !expired {
						notAfter, err := time.Parse(time.RFC3339, c.CertChain[0].ExpirationTime)
						if err != nil {
							return outcome{}, fmt.Errorf("%s: expiration time: %w", c.Identity, err)
						}
						expired = !sampled.Before(notAfter)
						// Within the margin no longer handed out: either state.
						expiring = !expired && !sampled.Add(certmanager.ExpiryMargin(h.certTTL)+time.Second).Before(notAfter)
					}
					switch {
					case expiring:
					case !expired && c.State != certmanager.StateAvailable:
						problems = append(problems, fmt.Sprintf("%s %q before expiry", c.Identity, c.State))
					case expired && !strings.HasPrefix(c.State, certmanager.StateUnavailable+": "):
						problems = append(problems, fmt.Sprintf("%s %q after expiry", c.Identity, c.State))
					}
					if !expired {
						valid++
					}
					if c.RefreshError != "" {
						failing++
					}
				}
				return outcome{note: fmt.Sprintf("CA down %v with certificates of %v; at its end %d of %d certificates valid and Available (%d with a failing refresh), the rest expired and Unavailable; all refreshed %v after the CA was back",
					down, h.certTTL, valid, len(states), failing, refreshed.Sub(back).Round(100*time.Millisecond)), problem: strings.Join(problems, "; ")}, nil
			},
			// A certificate is refreshed at 40-50 % of its life and handed
			// out until 90 %: one may lapse from 40 % of its life into the
			// outage on. New connections then fail until it is refreshed,
			// at most the rest of the outage and 5 s; existing ones never.
			judge: func(fresh, existing faultload.Summary) string {
				why := faultload.NoFailures(faultload.Summary{}, existing)
				if limit := o.certTTL*6/10 - o.certTTL*4/10 + 5*time.Second; fresh.LongestGap > limit {
					why = strings.TrimPrefix(why+fmt.Sprintf(", new connections stopped for %v (at most %v: the outage after the earliest lapse, and 5 s)",
						fresh.LongestGap.Round(time.Millisecond), limit), ", ")
				}
				return why
			},
		},
	}
}
