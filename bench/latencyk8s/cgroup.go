package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/causeway-mesh/causeway/pkg/readlimit"
)

// cgroups reads the counters of pods' cgroups (v1, the kubelet's cgroupfs
// layout: <root>/<controller>/[<node>/]kubepods/[<qos>/]pod<UID>/<container
// ID>) on this host: every node of the test cluster shares its kernel.
type cgroups struct{ root string }

// maxDepth bounds the search for a pod's directory below a controller's
// root (kubepods/burstable/pod<UID> is 3 deep; a node's cgroup root adds one).
const maxDepth = 5

// dir is the cgroup directory of a pod (container "") or of one of its
// containers, relative to a controller's hierarchy.
func (g cgroups) dir(p corev1.Pod, container string) (string, error) {
	rel, err := g.podDir(string(p.UID))
	if err != nil {
		return "", fmt.Errorf("pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	if container == "" {
		return rel, nil
	}
	for _, s := range p.Status.ContainerStatuses {
		if s.Name == container {
			_, id, ok := strings.Cut(s.ContainerID, "://")
			if !ok || id == "" {
				return "", fmt.Errorf("pod %s/%s: container %s has no ID yet", p.Namespace, p.Name, container)
			}
			return filepath.Join(rel, id), nil
		}
	}
	return "", fmt.Errorf("pod %s/%s has no container %s", p.Namespace, p.Name, container)
}

// podDir finds the directory named pod<uid> in the cpuacct hierarchy.
func (g cgroups) podDir(uid string) (string, error) {
	if uid == "" {
		return "", errors.New("no UID")
	}
	base := filepath.Join(g.root, "cpuacct")
	want := "pod" + uid
	var found string
	err := filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			// A pod's cgroup removed during the walk.
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(base, p)
		switch {
		case d.Name() == want:
			found = rel
			return fs.SkipAll
		case strings.HasPrefix(d.Name(), "pod") || strings.Count(rel, string(filepath.Separator)) >= maxDepth-1:
			return fs.SkipDir
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	if found == "" {
		return "", fmt.Errorf("no cgroup %s within %d levels of %s (cgroup v1 with the kubelet's cgroupfs driver is what this reads)", want, maxDepth, base)
	}
	return found, nil
}

// counters are one cgroup's readings.
type counters struct {
	cpu time.Duration // cpuacct.usage: CPU time of every task in it, ever
	// workingSet is memory.usage_in_bytes minus total_inactive_file (as
	// the kubelet computes it); rss is total_rss.
	workingSet, rss uint64
}

func (g cgroups) read(rel string) (counters, error) {
	var c counters
	cpu, err := g.number("cpuacct", rel, "cpuacct.usage")
	if err != nil {
		return c, err
	}
	c.cpu = time.Duration(cpu)
	usage, err := g.number("memory", rel, "memory.usage_in_bytes")
	if err != nil {
		return c, err
	}
	b, err := readlimit.File(filepath.Join(g.root, "memory", rel, "memory.stat"), 64<<10)
	if err != nil {
		return c, err
	}
	stat, err := parseStat(b)
	if err != nil {
		return c, fmt.Errorf("%s: %w", filepath.Join("memory", rel, "memory.stat"), err)
	}
	if inactive := stat["total_inactive_file"]; inactive < usage {
		c.workingSet = usage - inactive
	}
	c.rss = stat["total_rss"]
	return c, nil
}

// number reads a file holding one decimal number.
func (g cgroups) number(controller, rel, file string) (uint64, error) {
	p := filepath.Join(g.root, controller, rel, file)
	b, err := readlimit.File(p, 64)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(string(bytes.TrimSpace(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", p, err)
	}
	return n, nil
}

// parseStat parses memory.stat: "key value" lines.
func parseStat(b []byte) (map[string]uint64, error) {
	out := map[string]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			return nil, fmt.Errorf("line %q: want key and value", sc.Text())
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("line %q: %w", sc.Text(), err)
		}
		out[k] = n
	}
	return out, sc.Err()
}

// component is one part of a path whose resources are reported: the
// cgroups of its pods (or containers), summed.
type component struct {
	name string
	dirs []string
}

// usage is what a component used over a window.
type usage struct {
	cpu time.Duration
	// The peaks of the sums sampled during the window.
	workingSet, rss uint64
}

// total sums a component's readings.
func (g cgroups) total(c component) (counters, error) {
	var sum counters
	for _, d := range c.dirs {
		r, err := g.read(d)
		if err != nil {
			return sum, fmt.Errorf("%s: %w", c.name, err)
		}
		sum.cpu += r.cpu
		sum.workingSet += r.workingSet
		sum.rss += r.rss
	}
	return sum, nil
}

// measure runs f and says what each component used meanwhile: CPU from
// the counters before and after, memory peaks from samples every interval.
func (g cgroups) measure(comps []component, interval time.Duration, f func() error) ([]usage, error) {
	out := make([]usage, len(comps))
	start := make([]counters, len(comps))
	for i, c := range comps {
		var err error
		if start[i], err = g.total(c); err != nil {
			return nil, err
		}
		out[i].workingSet, out[i].rss = start[i].workingSet, start[i].rss
	}
	// sample runs in the sampler, then (once it has stopped) here.
	var sampleErr error
	sample := func() []counters {
		now := make([]counters, len(comps))
		for i, c := range comps {
			r, err := g.total(c)
			if err != nil {
				sampleErr = errors.Join(sampleErr, err)
				continue
			}
			now[i] = r
			out[i].workingSet = max(out[i].workingSet, r.workingSet)
			out[i].rss = max(out[i].rss, r.rss)
		}
		return now
	}
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				sample()
			}
		}
	}()
	err := f()
	close(stop)
	<-stopped
	end := sample()
	if err != nil {
		return nil, err
	}
	if sampleErr != nil {
		return nil, sampleErr
	}
	for i := range comps {
		out[i].cpu = end[i].cpu - start[i].cpu
	}
	return out, nil
}
