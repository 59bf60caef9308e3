package localmesh

// PIDs maps each running process of the mesh, by the name used for its log
// file (controlplane, nodeproxy-<node>, waypoint-<ns>-<pod>, app-<ns>-<pod>),
// to its process id. Benchmarks read /proc/<pid> for CPU time and memory.
// Processes that have exited are left out.
func (m *Mesh) PIDs() map[string]int {
	m.group.mu.Lock()
	defer m.group.mu.Unlock()
	out := make(map[string]int, len(m.group.procs))
	for _, p := range m.group.procs {
		if !p.exited() {
			out[p.name] = p.cmd.Process.Pid
		}
	}
	return out
}
