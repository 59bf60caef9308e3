package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// report is a run's figures.
type report struct {
	o       options
	paths   []path
	windows map[key][]window
	// idle and after are the memory before the first window and -after
	// past the last (nil if not read), in components' order.
	idle, after []counters
	loads       []float64 // the host's load average after each window
	// seen is what the mesh's metrics counted on each path over the run
	// (warm-up included).
	seen map[path]tally
	// waypointPods is how many pods the waypoint has (its figures are
	// their sums).
	waypointPods int
}

// figures are one path's at one rate: medians of its windows.
type figures struct {
	qps     float64
	failed  int64
	latency []time.Duration // percentiles'
	// cpu is each component's CPU per 1000 requests/s (vCPU: CPU seconds
	// per 1000 requests); workingSet its peak working set (bytes); has
	// says whether the path has the component at all.
	cpu        []float64
	workingSet []float64
	has        []bool
}

func (rep report) figures(k key) figures {
	ws := rep.windows[k]
	f := figures{cpu: make([]float64, len(componentNames)), workingSet: make([]float64, len(componentNames)),
		has: make([]bool, len(componentNames))}
	qps := make([]float64, len(ws))
	for i, w := range ws {
		qps[i] = w.res.qps
		f.failed += w.res.failed
	}
	f.qps = median(qps)
	for i := range percentiles {
		vs := make([]float64, len(ws))
		for j, w := range ws {
			vs[j] = float64(w.res.latency[i])
		}
		f.latency = append(f.latency, time.Duration(median(vs)))
	}
	for c := range componentNames {
		cpu, mem := make([]float64, len(ws)), make([]float64, len(ws))
		for j, w := range ws {
			cpu[j] = w.use[c].cpu.Seconds() / float64(w.res.requests) * 1000
			mem[j] = float64(w.use[c].workingSet)
		}
		f.cpu[c], f.workingSet[c] = median(cpu), median(mem)
		f.has[c] = (c != compWaypoint || k.p.mode == l7) && (c != compRelay || k.p.mode == relay)
	}
	return f
}

// median of vs (the mean of the middle two for an even count; 0 for none).
func median(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// failed counts the requests that failed in every window.
func (rep report) failed() int64 {
	var n int64
	for _, ws := range rep.windows {
		for _, w := range ws {
			n += w.res.failed
		}
	}
	return n
}

func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 3, 64)
}

func mib(b float64) string { return strconv.FormatFloat(b/(1<<20), 'f', 1, 64) }

// pname is a percentile in a figure's name: p50, p90, p99, p999.
func pname(p float64) string {
	return "p" + strings.ReplaceAll(strconv.FormatFloat(p, 'f', -1, 64), ".", "")
}

// print writes the bench lines, then the tables.
func (rep report) print(w io.Writer) {
	line := func(name, value, unit string) { fmt.Fprintf(w, "bench: %s %s %s\n", name, value, unit) }
	for _, q := range rep.o.rates {
		for _, p := range rep.paths {
			f, base := rep.figures(key{p, q}), rep.figures(key{p.baseline(), q})
			n := fmt.Sprintf("%s_%drps", p.name(), q)
			line(n+"_achieved", strconv.FormatFloat(f.qps, 'f', 1, 64), "req/s")
			line(n+"_failed", fmt.Sprint(f.failed), "requests")
			for i, pc := range percentiles {
				line(n+"_"+pname(pc), ms(f.latency[i]), "ms")
			}
			if p.mode != noMesh {
				for i, pc := range percentiles {
					line(n+"_added_"+pname(pc), ms(f.latency[i]-base.latency[i]), "ms")
				}
			}
			for c, cn := range componentNames {
				if f.has[c] {
					line(n+"_"+cn+"_cpu_per_1000rps", strconv.FormatFloat(f.cpu[c], 'f', 3, 64), "vCPU")
					line(n+"_"+cn+"_working_set", mib(f.workingSet[c]), "MiB")
				}
			}
		}
	}
	for _, m := range []struct {
		when string
		cs   []counters
	}{{"idle", rep.idle}, {"after", rep.after}} {
		if m.cs == nil {
			continue
		}
		for _, c := range []int{compNodeProxy, compWaypoint} {
			line(componentNames[c]+"_"+m.when+"_working_set", mib(float64(m.cs[c].workingSet)), "MiB")
			line(componentNames[c]+"_"+m.when+"_rss", mib(float64(m.cs[c].rss)), "MiB")
		}
	}
	for _, p := range rep.paths {
		t := rep.seen[p]
		line(p.name()+"_nodeproxy_outbound_opened", fmt.Sprint(t.outbound), "connections")
		line(p.name()+"_nodeproxy_inbound_opened", fmt.Sprint(t.inbound), "connections")
		if p.mode == l7 {
			line(p.name()+"_waypoint_requests", fmt.Sprint(t.waypointRequests), "requests")
		}
	}
	if len(rep.loads) > 0 {
		line("host_load_average_max", strconv.FormatFloat(slices.Max(rep.loads), 'f', 2, 64), "1")
	}
	rep.tables(w)
}

// tables writes the figures as two Markdown tables, latency and resources.
func (rep report) tables(w io.Writer) {
	fmt.Fprintf(w, "\nLatency (ms; medians of %d rounds of %v at each rate, %d connections; added: over no mesh, same placement)\n\n",
		rep.o.rounds, rep.o.duration, rep.o.conns)
	head := "| path | rate | achieved | failed |"
	for _, p := range percentiles {
		head += " " + pname(p) + " |"
	}
	for _, p := range percentiles {
		head += " +" + pname(p) + " |"
	}
	fmt.Fprintln(w, head)
	fmt.Fprintln(w, "|"+strings.Repeat("---|", 4+2*len(percentiles)))
	for _, q := range rep.o.rates {
		for _, p := range rep.paths {
			f, base := rep.figures(key{p, q}), rep.figures(key{p.baseline(), q})
			row := fmt.Sprintf("| %s | %d | %.1f | %d |", p.name(), q, f.qps, f.failed)
			for i := range percentiles {
				row += " " + ms(f.latency[i]) + " |"
			}
			for i := range percentiles {
				if p.mode == noMesh {
					row += " - |"
				} else {
					row += " " + ms(f.latency[i]-base.latency[i]) + " |"
				}
			}
			fmt.Fprintln(w, row)
		}
	}
	fmt.Fprintf(w, "\nResources (CPU: vCPU per 1000 requests/s; memory: peak working set in the window, MiB; medians of the rounds; waypoint: its %d pods together)\n\n", rep.waypointPods)
	head = "| path | rate |"
	for _, cn := range componentNames {
		head += " " + cn + " CPU |"
	}
	for _, cn := range componentNames {
		head += " " + cn + " MiB |"
	}
	fmt.Fprintln(w, head)
	fmt.Fprintln(w, "|"+strings.Repeat("---|", 2+2*len(componentNames)))
	for _, q := range rep.o.rates {
		for _, p := range rep.paths {
			f := rep.figures(key{p, q})
			row := fmt.Sprintf("| %s | %d |", p.name(), q)
			for c := range componentNames {
				row += cell(f.has[c], strconv.FormatFloat(f.cpu[c], 'f', 3, 64))
			}
			for c := range componentNames {
				row += cell(f.has[c], mib(f.workingSet[c]))
			}
			fmt.Fprintln(w, row)
		}
	}
	if rep.idle != nil {
		fmt.Fprintf(w, "\nIdle, before the first window: node proxy %s MiB working set (%s RSS), waypoint's pods %s (%s)\n",
			mib(float64(rep.idle[compNodeProxy].workingSet)), mib(float64(rep.idle[compNodeProxy].rss)),
			mib(float64(rep.idle[compWaypoint].workingSet)), mib(float64(rep.idle[compWaypoint].rss)))
	}
	if rep.after != nil {
		fmt.Fprintf(w, "%v after the last window: node proxy %s MiB working set (%s RSS), waypoint's pods %s (%s)\n", rep.o.after,
			mib(float64(rep.after[compNodeProxy].workingSet)), mib(float64(rep.after[compNodeProxy].rss)),
			mib(float64(rep.after[compWaypoint].workingSet)), mib(float64(rep.after[compWaypoint].rss)))
	}
	if len(rep.loads) > 0 {
		fmt.Fprintf(w, "Host load average (1 min) after the windows: %.2f to %.2f\n", slices.Min(rep.loads), slices.Max(rep.loads))
	}
}

func cell(has bool, v string) string {
	if !has {
		return " - |"
	}
	return " " + v + " |"
}
