package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func init() {
	register("log-level", "read or set the log level of mesh pods: log-level [POD] [debug|info|warn|error] [-n NS] (no POD: every node proxy, waypoint and control plane pod)", runLogLevel)
}

// podLevel is one pod's log level.
type podLevel struct {
	Pod   string `json:"pod"`
	Kind  string `json:"kind"`
	Level string `json:"level,omitempty"`
	Error string `json:"error,omitempty"`
}

func runLogLevel(args []string) error {
	const usage = "meshctl log-level [POD] [LEVEL] [-n NAMESPACE] [-o table|json|yaml]"
	kf, pos, err := parseArgs(flag.NewFlagSet("log-level", flag.ContinueOnError), args, true, 2, usage)
	if err != nil {
		return err
	}
	var podName, level string
	switch len(pos) {
	case 0:
	case 1:
		// One argument: a level (for every pod) or a pod (to read).
		if isLevel(pos[0]) {
			level = pos[0]
		} else {
			podName = pos[0]
		}
	case 2:
		podName, level = pos[0], pos[1]
	}
	if level != "" && !isLevel(level) {
		return fmt.Errorf("log level %q: want debug, info, warn or error", level)
	}
	c, err := kf.connect()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*kubeTimeout)
	defer cancel()
	var pods []*corev1.Pod
	if podName != "" {
		p, _, err := c.proxyPod(ctx, podName, true)
		if err != nil {
			return err
		}
		pods = append(pods, p)
	} else if pods, err = c.meshPods(ctx); err != nil {
		return err
	}
	levels := make([]podLevel, 0, len(pods))
	failed := 0
	for _, p := range pods {
		pl := podLevel{Pod: p.Namespace + "/" + p.Name, Kind: proxyKind(p)}
		pl.Level, err = c.logLevel(ctx, p, level)
		if err != nil {
			pl.Error = err.Error()
			failed++
		}
		levels = append(levels, pl)
	}
	if err := render(os.Stdout, kf.output, levels, func(w io.Writer) error {
		tw := newTable(w)
		fmt.Fprintln(tw, "POD\tKIND\tLEVEL")
		for _, l := range levels {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", l.Pod, l.Kind, orDefault(l.Level, "error: "+l.Error))
		}
		return tw.Flush()
	}); err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d pods did not answer", failed, len(pods))
	}
	return nil
}

func isLevel(s string) bool {
	switch s {
	case "debug", "info", "warn", "error":
		return true
	}
	return false
}

// logLevel reads the pod's level through its admin /logging (zap's
// AtomicLevel handler: GET, and PUT {"level": ...}), setting it first
// when level is given.
func (c *cluster) logLevel(ctx context.Context, p *corev1.Pod, level string) (string, error) {
	a, err := c.forwardAdmin(ctx, p, adminPort)
	if err != nil {
		return "", err
	}
	defer a.Close()
	return a.logLevel(ctx, level)
}

// logLevel reads, or sets and reads, the level of a's pod.
func (a *adminClient) logLevel(ctx context.Context, level string) (string, error) {
	method, body := http.MethodGet, []byte(nil)
	if level != "" {
		method = http.MethodPut
		body, _ = json.Marshal(map[string]string{"level": level})
	}
	data, err := a.do(ctx, method, "/logging", body)
	if err != nil {
		return "", err
	}
	var got struct {
		Level string `json:"level"`
	}
	if err := json.Unmarshal(data, &got); err != nil || got.Level == "" {
		return "", fmt.Errorf("admin /logging of %s answered %q, not a level", a.pod, strings.TrimSpace(string(data[:min(len(data), 200)])))
	}
	return got.Level, nil
}

// meshPods lists the running control plane, node proxy and waypoint pods.
func (c *cluster) meshPods(ctx context.Context) ([]*corev1.Pod, error) {
	var out []*corev1.Pod
	for _, q := range []struct{ ns, selector string }{
		{systemNamespace, controlPlaneSelector},
		{systemNamespace, nodeProxySelector},
		{"", waypointLabel},
	} {
		list, err := c.client.CoreV1().Pods(q.ns).List(ctx, metav1.ListOptions{LabelSelector: q.selector})
		if err != nil {
			return nil, fmt.Errorf("list pods (%s): %w", q.selector, err)
		}
		for i := range list.Items {
			p := &list.Items[i]
			if p.Status.Phase == corev1.PodRunning && proxyKind(p) != "" {
				out = append(out, p)
			}
		}
	}
	return out, nil
}
