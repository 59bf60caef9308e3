package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/causeway-mesh/causeway/bench/internal/faultload"
	"github.com/causeway-mesh/causeway/internal/testcluster"
)

func noFailures(_ []faultload.Result, fresh, existing faultload.Summary, _ outcome) string {
	return faultload.NoFailures(fresh, existing)
}

func rows() []row {
	return []row{
		{
			name: "controlplane-delete", fault: "every control plane pod deleted (kubectl delete pod, both replicas); the Deployment starts new ones",
			expectation: "0 failed on existing and new connections (last configuration and certificates kept)",
			inject:      deletePods(testcluster.SystemNS, "app.kubernetes.io/name="+testcluster.ControlPlane, 2), judge: noFailures,
		},
		{
			name: "waypoint-delete", fault: "a waypoint replica force-deleted (kubectl delete pod --grace-period=0 --force: the pod object goes at once, the kubelet kills its process 2 s later), 2 replicas",
			expectation: "requests in flight on it fail at most once each (the load does not retry); requests started after it died 0 failed",
			inject:      waypointDelete, judge: afterKillNoFailures,
			after: func(ctx context.Context, h *harness) error {
				return h.c.Do(ctx, []string{"-n", "shop", "rollout", "status", "deployment/" + waypoint, "--timeout=180s"})
			},
		},
		{
			name: "waypoint-kill", fault: "a waypoint replica's process killed (SIGKILL to its container's task, as a crash or the OOM killer would; the kubelet restarts it in place), 2 replicas",
			expectation: "requests in flight on it fail at most once each (the load does not retry); requests started after it died 0 failed",
			inject:      waypointKill, judge: afterKillNoFailures,
		},
		{
			name: "waypoint-rollout", fault: "kubectl rollout restart of the waypoint Deployment (2 replicas, surge 1)",
			expectation: "0 failed: GOAWAY, drain, exit",
			inject:      rollout("shop", "deployment/"+waypoint, waypointSelector, 2), judge: noFailures,
		},
		{
			name: "nodeproxy-rollout", fault: "kubectl rollout restart of the node proxy DaemonSet (maxSurge 1: the new pod listens beside the draining one)",
			expectation: "0 failed",
			inject:      rollout(testcluster.SystemNS, "daemonset/"+testcluster.NodeProxy, testcluster.NodeProxySelector, 1), judge: noFailures,
		},
		{
			name: "policy-edit", fault: "the waypoint's policy ConfigMap edited every second (kubectl apply)",
			expectation: "0 failed; every request decided by exactly one revision; the edits take effect",
			inject:      policyEdit,
			judge: func(_ []faultload.Result, fresh, existing faultload.Summary, _ outcome) string {
				why := faultload.NoFailures(fresh, existing)
				seen := map[string]bool{}
				for _, s := range []faultload.Summary{fresh, existing} {
					for rev := range s.Revisions {
						seen[rev] = true
					}
				}
				if len(seen) < 2 {
					why = strings.TrimPrefix(why+fmt.Sprintf(", answers show %d policy revision(s)", len(seen)), ", ")
				}
				return why
			},
		},
		{
			name: "route-edit", fault: "the HTTPRoute edited every second (kubectl apply: weights 100/0, 0/100, 50/50; a header rule added and removed)",
			expectation: "0 failed",
			inject:      routeEdit, judge: noFailures,
		},
		{
			name: "backend-delete", fault: "one of the two endpoints of the route's backend deleted (kubectl delete pod: reviews-v2's, 2 s grace); its Deployment starts a new one",
			expectation: "failures within the route's retry policy (no retry stanza: the standard channel has none; the waypoint retries a connect failure once on another endpoint): 0 failed",
			before: func(ctx context.Context, h *harness) error {
				if err := h.c.Apply(ctx, faultload.SingleBackendRoute("")); err != nil {
					return err
				}
				faultload.Sleep(ctx, 2*time.Second) // the control plane's debounce and push
				return nil
			},
			inject: deletePods("shop", "app=reviews,version=v2", 1), judge: noFailures,
			after: func(ctx context.Context, h *harness) error {
				return h.c.Apply(ctx, faultload.Route(50, 50, "", ""))
			},
		},
	}
}

// deletePods deletes the pods matching selector (gracefully) and waits
// until n new ones are ready and the old ones gone.
func deletePods(ns, selector string, n int) func(context.Context, *harness, *remoteLoad) (outcome, error) {
	return func(ctx context.Context, h *harness, _ *remoteLoad) (outcome, error) {
		old, err := h.c.Pods(ctx, ns, selector)
		if err != nil {
			return outcome{}, err
		}
		at := time.Now()
		if _, err := h.c.Run(ctx, time.Minute, "", "-n", ns, "delete", "pod", "-l", selector, "--wait=false"); err != nil {
			return outcome{}, err
		}
		readyAfter, goneAfter, err := h.c.replaced(ctx, ns, selector, old, n, at, 3*time.Minute)
		return outcome{at: at, note: fmt.Sprintf("%s deleted; new pods ready after %v, the old ones gone after %v",
			names(old), readyAfter.Round(100*time.Millisecond), goneAfter.Round(100*time.Millisecond))}, err
	}
}

// rollout restarts a workload (kubectl rollout restart) and waits until n
// new pods are ready and the old ones gone.
func rollout(ns, workload, selector string, n int) func(context.Context, *harness, *remoteLoad) (outcome, error) {
	return func(ctx context.Context, h *harness, _ *remoteLoad) (outcome, error) {
		old, err := h.c.Pods(ctx, ns, selector)
		if err != nil {
			return outcome{}, err
		}
		at := time.Now()
		if _, err := h.c.Run(ctx, time.Minute, "", "-n", ns, "rollout", "restart", workload); err != nil {
			return outcome{}, err
		}
		readyAfter, goneAfter, err := h.c.replaced(ctx, ns, selector, old, n, at, 3*time.Minute)
		return outcome{at: at, note: fmt.Sprintf("%d new pods ready after %v, the old ones gone after %v",
			n, readyAfter.Round(100*time.Millisecond), goneAfter.Round(100*time.Millisecond))}, err
	}
}

func names(ps []corev1.Pod) string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Name)
	}
	return strings.Join(out, ", ")
}

// waypointVictim picks one of the two ready waypoint pods and the host
// PID of its container's process (its running containerd task).
func (h *harness) waypointVictim(ctx context.Context) (corev1.Pod, int, error) {
	ps, err := h.c.Pods(ctx, "shop", waypointSelector)
	if err != nil {
		return corev1.Pod{}, 0, err
	}
	if len(ps) != 2 || !testcluster.Ready(ps[0]) || !testcluster.Ready(ps[1]) {
		return corev1.Pod{}, 0, fmt.Errorf("want 2 ready waypoint pods, have %d (%s)", len(ps), names(ps))
	}
	victim := ps[0]
	if len(victim.Status.ContainerStatuses) != 1 {
		return victim, 0, fmt.Errorf("%s: %d containers, want 1", victim.Name, len(victim.Status.ContainerStatuses))
	}
	task, ok := strings.CutPrefix(victim.Status.ContainerStatuses[0].ContainerID, "containerd://")
	if !ok {
		return victim, 0, fmt.Errorf("%s: container %q is not containerd's", victim.Name, victim.Status.ContainerStatuses[0].ContainerID)
	}
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(tctx, "ctr", "--address", h.ctrAddress, "-n", "k8s.io", "tasks", "ls").Output()
	if err != nil {
		return victim, 0, fmt.Errorf("ctr tasks ls: %w", err)
	}
	pid := runningPID(string(out), task)
	if pid == 0 {
		return victim, 0, fmt.Errorf("%s: its task %s is not running", victim.Name, task)
	}
	return victim, pid, nil
}

// runningPID reads `ctr tasks ls` (TASK PID STATUS): the task's PID if it
// is RUNNING, else 0.
func runningPID(out, id string) int {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == id && f[2] == "RUNNING" {
			pid, _ := strconv.Atoi(f[1])
			return pid
		}
	}
	return 0
}

// exited waits (polling every 10 ms, up to a minute) until the process is
// gone or a zombie, and says when it saw that.
func exited(ctx context.Context, pid int) (time.Time, error) {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if errors.Is(err, os.ErrNotExist) || err == nil && dead(string(b)) {
			return time.Now(), nil
		}
		if err != nil {
			return time.Time{}, err
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Time{}, fmt.Errorf("process %d still running a minute on (%v)", pid, ctx.Err())
}

// dead reads /proc/PID/stat: the state after the command's name is Z
// (exited, not yet reaped) or X.
func dead(stat string) bool {
	i := strings.LastIndexByte(stat, ')')
	f := strings.Fields(stat[i+1:])
	return i >= 0 && len(f) > 0 && (f[0] == "Z" || f[0] == "X")
}

// waypointDelete force-deletes one waypoint pod and notes when its
// process died: outcome.at is that moment.
func waypointDelete(ctx context.Context, h *harness, _ *remoteLoad) (outcome, error) {
	victim, pid, err := h.waypointVictim(ctx)
	if err != nil {
		return outcome{}, err
	}
	deleted := time.Now()
	if _, err := h.c.Run(ctx, time.Minute, "", "-n", "shop", "delete", "pod", victim.Name, "--grace-period=0", "--force", "--wait=false"); err != nil {
		return outcome{}, err
	}
	died, err := exited(ctx, pid)
	if err != nil {
		return outcome{}, err
	}
	readyAfter, _, err := h.c.replaced(ctx, "shop", waypointSelector, []corev1.Pod{victim}, 2, deleted, 3*time.Minute)
	return outcome{at: died, note: fmt.Sprintf("%s force-deleted; its process exited %v after; a new replica ready %v after the delete",
		victim.Name, died.Sub(deleted).Round(100*time.Millisecond), readyAfter.Round(100*time.Millisecond))}, err
}

// waypointKill sends SIGKILL to one waypoint pod's process and waits until
// the kubelet has restarted its container and it is ready again.
func waypointKill(ctx context.Context, h *harness, _ *remoteLoad) (outcome, error) {
	victim, pid, err := h.waypointVictim(ctx)
	if err != nil {
		return outcome{}, err
	}
	restarts := victim.Status.ContainerStatuses[0].RestartCount
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return outcome{}, fmt.Errorf("kill %s's process %d: %w", victim.Name, pid, err)
	}
	killed := time.Now()
	_, ok, err := testcluster.Until(ctx, 3*time.Minute, func() (bool, error) {
		ps, err := h.c.Pods(ctx, "shop", waypointSelector)
		if err != nil {
			return false, err
		}
		n := 0
		for _, p := range ps {
			if testcluster.Ready(p) && (p.UID != victim.UID || p.Status.ContainerStatuses[0].RestartCount > restarts) {
				n++
			}
		}
		return n == 2, nil
	})
	if err == nil && !ok {
		err = fmt.Errorf("%s not restarted and ready within 3 minutes of the kill", victim.Name)
	}
	return outcome{at: killed, note: fmt.Sprintf("%s's process killed; restarted by the kubelet and ready again %v after",
		victim.Name, time.Since(killed).Round(100*time.Millisecond))}, err
}

// afterKillNoFailures: requests that started before the waypoint's process
// died may fail (they were in flight on it, or on their way to it); every
// one started after must succeed.
func afterKillNoFailures(rs []faultload.Result, _, _ faultload.Summary, out outcome) string {
	var inFlight, after []string
	for _, r := range rs {
		if r.Cause == "" {
			continue
		}
		if r.Start.Before(out.at) {
			inFlight = append(inFlight, r.Conn)
		} else {
			after = append(after, fmt.Sprintf("%s (%s, %v after)", r.Cause, r.Conn, r.Start.Sub(out.at).Round(time.Millisecond)))
		}
	}
	if len(after) > 0 {
		return fmt.Sprintf("%d requests started after the process died failed: %s", len(after), strings.Join(after, "; "))
	}
	return ""
}

// policyEdit applies a new revision of the policy every second for half
// the row, then waits until answers carry the last one (the kubelet
// refreshes ConfigMap volumes on its own period, a minute by default).
func policyEdit(ctx context.Context, h *harness, l *remoteLoad) (outcome, error) {
	n := int(h.rowTime / 2 / time.Second)
	at := time.Now()
	var last time.Time
	for i := 0; i < n && ctx.Err() == nil; i++ {
		h.policyRev++
		if err := h.c.Apply(ctx, policyConfigMap(h.policyRev)); err != nil {
			return outcome{}, err
		}
		last = time.Now()
		faultload.Sleep(ctx, time.Until(at.Add(time.Duration(i+1)*time.Second)))
	}
	want := fmt.Sprintf("rev-%d", h.policyRev)
	var first faultload.Result
	took, ok, err := testcluster.Until(ctx, 3*time.Minute, func() (bool, error) {
		var found bool
		first, found = l.first(func(r faultload.Result) bool { return r.Revision == want })
		return found, nil
	})
	out := outcome{at: at}
	if ok {
		out.note = fmt.Sprintf("%d edits in %v; the first answer with the last revision came %v after the last edit; answers show %d revisions",
			n, last.Sub(at).Round(100*time.Millisecond), first.End.Sub(last).Round(100*time.Millisecond), l.revisions())
	} else {
		out.note = fmt.Sprintf("%d edits in %v", n, last.Sub(at).Round(100*time.Millisecond))
		out.problem = fmt.Sprintf("no answer with the last revision (%s) %v after the last edit", want, took.Round(time.Second))
	}
	return out, err
}

// routeEdit applies a new HTTPRoute every second for half the row, then
// the row's 50/50 route again.
func routeEdit(ctx context.Context, h *harness, _ *remoteLoad) (outcome, error) {
	n := int(h.rowTime / 2 / time.Second)
	weights := [][2]int{{100, 0}, {0, 100}, {50, 50}}
	at := time.Now()
	for i := 0; i < n && ctx.Err() == nil; i++ {
		extra := ""
		if i%2 == 1 {
			extra = faultload.ExtraRule
		}
		w := weights[i%len(weights)]
		if err := h.c.Apply(ctx, faultload.Route(w[0], w[1], extra, "")); err != nil {
			return outcome{}, err
		}
		faultload.Sleep(ctx, time.Until(at.Add(time.Duration(i+1)*time.Second)))
	}
	return outcome{at: at, note: fmt.Sprintf("%d edits", n)}, h.c.Apply(ctx, faultload.Route(50, 50, "", ""))
}
