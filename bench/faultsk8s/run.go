package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/causeway-mesh/causeway/bench/internal/faultload"
	"github.com/causeway-mesh/causeway/internal/testcluster"
)

type options struct {
	kubeconfig, kubectl, ctrAddress, repo, image string
	rate, repeat                                 int
	rowTime                                      time.Duration
	only, results                                string
	keep                                         bool
}

// harness is the installed mesh and how the rows reach it.
type harness struct {
	c          *cluster
	ctrAddress string
	rate       int
	rowTime    time.Duration
	// policyRev is the revision of the policy in the ConfigMap.
	policyRev int
}

// outcome is what injecting a fault observed besides the load: when it
// struck, a note for the table and, when the fault's own checks failed, a
// problem.
type outcome struct {
	at            time.Time
	note, problem string
}

// row is one fault and what it must show.
type row struct {
	name, fault, expectation string
	// before prepares the row (before the load starts).
	before func(ctx context.Context, h *harness) error
	// inject injects the fault while the load runs and returns when it is
	// over (a rollout finished, the old pods gone).
	inject func(ctx context.Context, h *harness, l *remoteLoad) (outcome, error)
	// judge says whether the figures meet the expectation ("" if so).
	judge func(rs []faultload.Result, fresh, existing faultload.Summary, out outcome) string
	// after mends what the fault broke, once the load has stopped.
	after func(ctx context.Context, h *harness) error
}

func runMain(ctx context.Context, args []string) error {
	var o options
	fs := flagSet("run")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "the test cluster's admin kubeconfig (hack/cluster/lib.sh KUBECONFIG_ADMIN)")
	fs.StringVar(&o.kubectl, "kubectl", "kubectl", "kubectl to run")
	fs.StringVar(&o.ctrAddress, "ctr-address", "", "the cluster's containerd socket (hack/cluster/lib.sh CONTAINERD_SOCK): the waypoint row watches the killed container's task")
	fs.StringVar(&o.repo, "repo", ".", "the repository (manifests/, examples/)")
	fs.StringVar(&o.image, "image", "causeway.dev/faultsk8s:dev", "the client pod's image (this program)")
	fs.IntVar(&o.rate, "rate", 25, "requests per second on each kind of connection (new, existing)")
	fs.DurationVar(&o.rowTime, "row", 24*time.Second, "how long the load runs for each row at least; the fault comes after a quarter of it, and the load goes on for a quarter after the fault is over")
	fs.IntVar(&o.repeat, "repeat", 1, "run the rows this many times (to catch what does not happen every time)")
	fs.StringVar(&o.only, "only", "", "run only the rows whose name matches this regular expression")
	fs.StringVar(&o.results, "results", "", "write every row's requests to DIR/<row>-<n>.jsonl (start, end, cause), for a closer look at a gap")
	fs.BoolVar(&o.keep, "keep", false, "leave the mesh and the sample installed (to read logs; uninstall with kubectl delete -k)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	only, err := regexp.Compile(o.only)
	if err != nil {
		return fmt.Errorf("-only: %w", err)
	}
	if o.kubeconfig == "" || o.ctrAddress == "" {
		return fmt.Errorf("-kubeconfig and -ctr-address are required")
	}
	if o.rate <= 0 || o.repeat <= 0 || o.rowTime < 4*time.Second {
		return fmt.Errorf("-rate %d, -repeat %d, -row %v: want at least 1, 1 and 4s", o.rate, o.repeat, o.rowTime)
	}
	h := &harness{c: &cluster{testcluster.Cluster{Kubectl: o.kubectl, Kubeconfig: o.kubeconfig, Repo: o.repo}}, ctrAddress: o.ctrAddress, rate: o.rate, rowTime: o.rowTime}

	start := time.Now()
	logf("installing the mesh and the sample; load average %s", testcluster.LoadAvg())
	defer testcluster.Remove(o.keep, start, logf, h.c.uninstall)
	if err := h.c.install(ctx, o.image); err != nil {
		return fmt.Errorf("install: %w", err)
	}
	logf("installed after %v", time.Since(start).Round(time.Second))

	fmt.Printf("faultsk8s: %d req/s on new and on existing connections from web/%s to http://reviews.shop/, at least %v per row, fault after %v\n\n",
		o.rate, clientPod, o.rowTime, o.rowTime/4)
	for _, r := range rows() {
		if only.MatchString(r.name) {
			fmt.Printf("- %s: %s; expected: %s\n", r.name, r.fault, r.expectation)
		}
	}
	fmt.Println()
	fmt.Print(faultload.TableHeader)
	missed := 0
	var selected []row
	for range o.repeat {
		for _, r := range rows() {
			if only.MatchString(r.name) {
				selected = append(selected, r)
			}
		}
	}
	for i, r := range selected {
		if r.before != nil {
			if err := r.before(ctx, h); err != nil {
				return fmt.Errorf("%s: %w", r.name, err)
			}
		}
		rs, fresh, existing, out, err := h.window(ctx, r.inject)
		if err != nil {
			return fmt.Errorf("%s: %w", r.name, err)
		}
		note := strings.TrimPrefix(out.note+"; load average "+testcluster.LoadAvg(), "; ")
		result, met := faultload.Verdict(r.judge(rs, fresh, existing, out), out.problem, note)
		if !met {
			missed++
		}
		faultload.PrintRow(os.Stdout, r.name, fresh, existing, result)
		if o.results != "" {
			if err := writeResults(filepath.Join(o.results, fmt.Sprintf("%s-%d.jsonl", r.name, i)), rs, out); err != nil {
				return err
			}
		}
		if r.after != nil {
			if err := r.after(ctx, h); err != nil {
				return fmt.Errorf("%s: mend: %w", r.name, err)
			}
		}
	}
	if missed > 0 {
		return fmt.Errorf("%d rows did not meet their expectation", missed)
	}
	return nil
}

// window runs the in-pod load for one row: the fault after a quarter of
// the row time, the load until the row time has passed and at least a
// quarter of it since the fault was over.
func (h *harness) window(ctx context.Context, inject func(context.Context, *harness, *remoteLoad) (outcome, error)) (rs []faultload.Result, fresh, existing faultload.Summary, out outcome, err error) {
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := exec.CommandContext(lctx, h.c.Kubectl, "--kubeconfig", h.c.Kubeconfig, "-n", "web", "exec", "-i", clientPod, "-c", "load", "--",
		"/usr/local/bin/faultsk8s", "load", "-url", "http://reviews.shop/", "-rate", fmt.Sprint(h.rate))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err = cmd.Start(); err != nil {
		return
	}
	l := newRemoteLoad()
	var readErr error
	readDone := make(chan struct{})
	go func() {
		readErr = l.read(stdout)
		_, _ = io.Copy(io.Discard, stdout)
		close(readDone)
	}()
	finish := func() error {
		stdin.Close()
		var err error
		select {
		case <-readDone:
			err = readErr
		case <-time.After(time.Minute):
			err = fmt.Errorf("the load did not end within a minute of its stdin")
		}
		// kubectl exits once the stream is over; kill it if it does not.
		waited := make(chan error, 1)
		go func() { waited <- cmd.Wait() }()
		select {
		case werr := <-waited:
			if err == nil && werr != nil {
				err = werr
			}
		case <-time.After(30 * time.Second):
			cancel()
			<-waited
		}
		if err != nil {
			err = fmt.Errorf("the load: %w: %s", err, strings.TrimSpace(stderr.String()))
		}
		return err
	}
	select {
	case <-l.startedc:
	case <-readDone:
		err = fmt.Errorf("the load ended before it started: %v", readErr)
	case <-time.After(2 * time.Minute):
		err = fmt.Errorf("the load did not start within 2 minutes")
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		if ferr := finish(); ferr != nil {
			err = fmt.Errorf("%w (%v)", err, ferr)
		}
		return
	}
	_, from, _ := l.window()
	faultload.Sleep(ctx, time.Until(from.Add(h.rowTime/4)))
	out, err = inject(ctx, h, l)
	end := from.Add(h.rowTime)
	if tail := time.Now().Add(h.rowTime / 4); tail.After(end) {
		end = tail
	}
	faultload.Sleep(ctx, time.Until(end))
	if ferr := finish(); err == nil {
		err = ferr
	}
	if err != nil {
		return
	}
	rs, from, to := l.window()
	return rs, faultload.Summarize(rs, "new", from, to), faultload.Summarize(rs, "existing", from, to), out, nil
}

var logf = testcluster.Logger("faultsk8s")

// writeResults writes the fault's moment, then a row's requests in the
// order they started, a JSON line each.
func writeResults(path string, rs []faultload.Result, out outcome) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i].Start.Before(rs[j].Start) })
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	if err := enc.Encode(map[string]time.Time{"fault": out.at}); err != nil {
		return err
	}
	for _, r := range rs {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}
