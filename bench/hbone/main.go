// Command hbone benchmarks pkg/hbone: bulk throughput of one tunnel against
// plain TCP and TLS 1.3 measured in the same run, and memory per idle tunnel
// with many tunnels open. It prints "bench: <name> <value> <unit>" lines.
//
//	hbone throughput [-size 1GiB] [-rounds 3]
//	hbone memory [-tunnels 10000]
//	hbone all
//
// The memory benchmark runs the server in this process, the clients and the
// TCP sink in two child processes (this binary again), so that each
// process's figures are its own.
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/causeway-mesh/causeway/pkg/hbone"
	"github.com/causeway-mesh/causeway/pkg/trust"
)

const trustDomain = "cluster.local"

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: hbone throughput|memory|all [flags]")
		os.Exit(2)
	}
	cmd, args := os.Args[1], os.Args[2:]
	var err error
	switch cmd {
	case "throughput":
		err = runThroughput(args)
	case "memory":
		err = runMemory(args)
	case "all":
		if err = runThroughput(nil); err == nil {
			err = runMemory(nil)
		}
	case "memclient": // child processes of the memory benchmark
		err = runMemClient(args)
	case "memsink":
		err = runMemSink()
	default:
		err = fmt.Errorf("unknown command %q", cmd)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "hbone bench:", err)
		os.Exit(1)
	}
}

func report(name string, value float64, unit string) {
	fmt.Printf("bench: %s %.3f %s\n", name, value, unit)
}

// material is a CA with a server and a client identity.
type material struct {
	bundle             *trust.Bundle
	serverID, clientID trust.Identity
	serverCert         *tls.Certificate
	clientCert         *tls.Certificate
	clientPEM, keyPEM  []byte
}

func newMaterial() (*material, error) {
	m, err := trust.GenerateSelfSigned(trustDomain, 48*time.Hour)
	if err != nil {
		return nil, err
	}
	ca, err := trust.NewAuthority(m.Key, m.Chain, m.Roots, 24*time.Hour)
	if err != nil {
		return nil, err
	}
	bundle, err := trust.NewBundle(trustDomain, m.Roots)
	if err != nil {
		return nil, err
	}
	mat := &material{bundle: bundle}
	if mat.serverID, err = trust.NewIdentity(trustDomain, "bench", "server"); err != nil {
		return nil, err
	}
	if mat.clientID, err = trust.NewIdentity(trustDomain, "bench", "client"); err != nil {
		return nil, err
	}
	// issue returns the certificate, its PEM chain and its PEM key.
	issue := func(id trust.Identity) (*tls.Certificate, []byte, []byte, error) {
		key, csrPEM, err := trust.NewKeyAndCSR(id)
		if err != nil {
			return nil, nil, nil, err
		}
		csr, err := trust.ParseCSR(csrPEM)
		if err != nil {
			return nil, nil, nil, err
		}
		chain, err := ca.Sign(csr, id, 0)
		if err != nil {
			return nil, nil, nil, err
		}
		cert, err := trust.TLSCertificate(chain, key)
		if err != nil {
			return nil, nil, nil, err
		}
		der, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return nil, nil, nil, err
		}
		return cert, []byte(strings.Join(chain, "")), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
	}
	if mat.serverCert, _, _, err = issue(mat.serverID); err != nil {
		return nil, err
	}
	if mat.clientCert, mat.clientPEM, mat.keyPEM, err = issue(mat.clientID); err != nil {
		return nil, err
	}
	return mat, nil
}

func (m *material) serverTLS() *tls.Config {
	return trust.ServerConfig(m.bundle, func(net.Addr) (*tls.Certificate, error) { return m.serverCert, nil },
		trust.VerifyIfGiven)
}

func (m *material) clientTLS() *tls.Config {
	return trust.ClientConfig(m.bundle, func() (*tls.Certificate, error) { return m.clientCert, nil },
		[]trust.Identity{m.serverID})
}

func (m *material) target(addr netip.AddrPort, authority string) hbone.Target {
	return hbone.Target{
		Address:   addr,
		Authority: authority,
		Source:    m.clientID,
		Cert:      func() (*tls.Certificate, error) { return m.clientCert, nil },
		Expected:  []trust.Identity{m.serverID},
	}
}

func listen() (net.Listener, netip.AddrPort, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, netip.AddrPort{}, err
	}
	return ln, ln.Addr().(*net.TCPAddr).AddrPort(), nil
}

// ---- throughput ----

// sink counts what arrives on each connection and reports it at EOF.
type sink struct {
	ln    net.Listener
	addr  netip.AddrPort
	wrap  func(net.Conn) net.Conn // TLS server side, or nil
	total chan int64
}

func newSink(wrap func(net.Conn) net.Conn) (*sink, error) {
	ln, addr, err := listen()
	if err != nil {
		return nil, err
	}
	s := &sink{ln: ln, addr: addr, wrap: wrap, total: make(chan int64, 16)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if s.wrap != nil {
					c = s.wrap(c)
				}
				buf := make([]byte, 256<<10)
				var n int64
				for {
					m, err := c.Read(buf)
					n += int64(m)
					if err != nil {
						s.total <- n
						return
					}
				}
			}()
		}
	}()
	return s, nil
}

// relay accepts connections (unwrapping TLS when wrap is set) and copies
// each to a new connection to dst, like a proxy would.
func relay(dst netip.AddrPort, wrap func(net.Conn) net.Conn) (net.Listener, netip.AddrPort, error) {
	ln, addr, err := listen()
	if err != nil {
		return nil, addr, err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				if wrap != nil {
					c = wrap(c)
				}
				up, err := net.Dial("tcp", dst.String())
				if err != nil {
					c.Close()
					return
				}
				hbone.Join(context.Background(), c, up)
			}()
		}
	}()
	return ln, addr, nil
}

// send writes size bytes from a random buffer in 256 KiB writes, half-closes
// and returns how long the sink took to receive everything.
func send(c net.Conn, s *sink, size int64, payload []byte) (time.Duration, error) {
	start := time.Now()
	for sent := int64(0); sent < size; {
		n := min(int64(len(payload)), size-sent)
		if _, err := c.Write(payload[:n]); err != nil {
			return 0, err
		}
		sent += n
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	select {
	case got := <-s.total:
		d := time.Since(start)
		c.Close()
		if got != size {
			return 0, fmt.Errorf("sink got %d bytes, want %d", got, size)
		}
		return d, nil
	case <-time.After(5 * time.Minute):
		return 0, errors.New("sink never saw EOF")
	}
}

func runThroughput(args []string) error {
	fs := flag.NewFlagSet("throughput", flag.ExitOnError)
	sizeMiB := fs.Int64("size-mib", 1024, "MiB sent per measurement")
	rounds := fs.Int("rounds", 5, "rounds (the median is reported)")
	only := fs.String("only", "", "measure only this mode (no ratios)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the measurements")
	fs.Parse(args)
	size := *sizeMiB << 20

	mat, err := newMaterial()
	if err != nil {
		return err
	}
	tlsServer := func(c net.Conn) net.Conn { return tls.Server(c, mat.serverTLS()) }
	plainSink, err := newSink(nil)
	if err != nil {
		return err
	}
	tlsSink, err := newSink(tlsServer)
	if err != nil {
		return err
	}
	_, tcpRelay, err := relay(plainSink.addr, nil)
	if err != nil {
		return err
	}
	_, tlsRelay, err := relay(plainSink.addr, tlsServer)
	if err != nil {
		return err
	}
	srvLn, srvAddr, err := listen()
	if err != nil {
		return err
	}
	srv, err := hbone.NewServer(hbone.ServerOptions{
		TLS: mat.serverTLS(),
		Handler: hbone.HandlerFunc(func(ctx context.Context, r *hbone.Request) (hbone.Stream, error) {
			up, err := net.Dial("tcp", r.Authority.String())
			if err != nil {
				return nil, hbone.Unavailable(err.Error())
			}
			return hbone.Splice(up), nil
		}),
	})
	if err != nil {
		return err
	}
	go srv.Serve(srvLn)
	defer srv.Close()
	pool, err := hbone.NewPool(hbone.PoolOptions{Bundle: mat.bundle})
	if err != nil {
		return err
	}
	defer pool.Close()

	payload := make([]byte, 256<<10)
	rand.Read(payload)
	dialTCP := func(a netip.AddrPort) func() (net.Conn, error) {
		return func() (net.Conn, error) { return net.Dial("tcp", a.String()) }
	}
	dialTLS := func(a netip.AddrPort) func() (net.Conn, error) {
		return func() (net.Conn, error) {
			c, err := tls.Dial("tcp", a.String(), mat.clientTLS())
			if err != nil {
				return nil, err
			}
			return c, c.Handshake()
		}
	}
	type mode struct {
		name string
		dial func() (net.Conn, error)
		sink *sink
	}
	modes := []mode{
		{"tcp_direct", dialTCP(plainSink.addr), plainSink},
		{"tls_direct", dialTLS(tlsSink.addr), tlsSink},
		{"tcp_relay", dialTCP(tcpRelay), plainSink},
		{"tls_relay", dialTLS(tlsRelay), plainSink},
		{"hbone", func() (net.Conn, error) {
			return pool.Dial(context.Background(), mat.target(srvAddr, plainSink.addr.String()))
		}, plainSink},
	}
	if *only != "" {
		modes = slices.DeleteFunc(modes, func(m mode) bool { return m.name != *only })
		if len(modes) == 0 {
			return fmt.Errorf("unknown mode %q", *only)
		}
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	// Throughput suffers from whatever else runs on the machine; CPU time
	// per byte (client, server and sink all run in this process) much less.
	results := make(map[string][]float64)
	cpu := make(map[string][]float64)
	for r := 0; r < *rounds; r++ {
		for _, mode := range modes {
			c, err := mode.dial()
			if err != nil {
				return fmt.Errorf("%s: %w", mode.name, err)
			}
			cpu0 := cpuTime()
			d, err := send(c, mode.sink, size, payload)
			if err != nil {
				return fmt.Errorf("%s: %w", mode.name, err)
			}
			results[mode.name] = append(results[mode.name], float64(size)/d.Seconds()/1e6)
			cpu[mode.name] = append(cpu[mode.name], float64(cpuTime()-cpu0)/float64(time.Millisecond)/float64(size>>20))
		}
	}
	median := func(m map[string][]float64, name string) float64 {
		v := slices.Clone(m[name])
		slices.Sort(v)
		return v[len(v)/2]
	}
	for _, mode := range modes {
		report(mode.name+"_throughput", median(results, mode.name), "MB/s")
		report(mode.name+"_cpu_per_mib", median(cpu, mode.name), "ms")
	}
	if *only != "" {
		return nil
	}
	for _, base := range []string{"tls_relay", "tls_direct", "tcp_relay", "tcp_direct"} {
		report("hbone_vs_"+base+"_ratio", median(results, "hbone")/median(results, base), "x")
	}
	// Cost ratios: how much more CPU a tunnelled byte takes.
	for _, base := range []string{"tls_relay", "tls_direct"} {
		report("hbone_vs_"+base+"_cpu_ratio", median(cpu, "hbone")/median(cpu, base), "x")
	}
	return nil
}

// cpuTime is the user plus system CPU time this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// ---- memory ----

type memSample struct {
	rss        int64 // bytes
	heap       int64 // HeapInuse
	stack      int64 // StackInuse
	goroutines int
}

func sampleMemory() (memSample, error) {
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	s := memSample{heap: int64(ms.HeapInuse), stack: int64(ms.StackInuse), goroutines: runtime.NumGoroutine()}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return s, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return s, err
			}
			s.rss = kb << 10
		}
	}
	return s, nil
}

func (s memSample) perTunnel(before memSample, n int, side string) {
	report("hbone_"+side+"_rss_per_tunnel", float64(s.rss-before.rss)/float64(n)/1024, "KiB")
	report("hbone_"+side+"_heap_per_tunnel", float64(s.heap-before.heap)/float64(n)/1024, "KiB")
	report("hbone_"+side+"_stack_per_tunnel", float64(s.stack-before.stack)/float64(n)/1024, "KiB")
	report("hbone_"+side+"_goroutines_per_tunnel", float64(s.goroutines-before.goroutines)/float64(n), "count")
}

func runMemory(args []string) error {
	if os.Getenv("HBONE_BENCH_HEAP_PROFILE") != "" {
		runtime.MemProfileRate = 512
	}
	fs := flag.NewFlagSet("memory", flag.ExitOnError)
	tunnels := fs.Int("tunnels", 10000, "idle tunnels to open")
	fs.Parse(args)

	mat, err := newMaterial()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "hbone-bench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	roots := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: mat.bundle.Roots()[0].Raw})
	for name, data := range map[string][]byte{"roots.pem": roots, "client.pem": mat.clientPEM, "key.pem": mat.keyPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return err
		}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}

	// The sink holds the upstream end of every tunnel.
	sinkCmd := exec.Command(self, "memsink")
	sinkCmd.Stderr = os.Stderr
	sinkOut, err := sinkCmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := sinkCmd.Start(); err != nil {
		return err
	}
	defer func() { sinkCmd.Process.Kill(); sinkCmd.Wait() }()
	sinkLine, err := bufio.NewReader(sinkOut).ReadString('\n')
	if err != nil {
		return fmt.Errorf("sink: %w", err)
	}
	sinkAddr := strings.TrimSpace(strings.TrimPrefix(sinkLine, "sink "))

	srvLn, srvAddr, err := listen()
	if err != nil {
		return err
	}
	srv, err := hbone.NewServer(hbone.ServerOptions{
		TLS: mat.serverTLS(),
		Handler: hbone.HandlerFunc(func(ctx context.Context, r *hbone.Request) (hbone.Stream, error) {
			var d net.Dialer
			up, err := d.DialContext(ctx, "tcp", r.Authority.String())
			if err != nil {
				return nil, hbone.Unavailable(err.Error())
			}
			return hbone.Splice(up), nil
		}),
	})
	if err != nil {
		return err
	}
	go srv.Serve(srvLn)
	defer srv.Close()

	before, err := sampleMemory()
	if err != nil {
		return err
	}
	client := exec.Command(self, "memclient", "-server", srvAddr.String(), "-sink", sinkAddr,
		"-material", dir, "-tunnels", strconv.Itoa(*tunnels))
	client.Stderr = os.Stderr
	stdin, err := client.StdinPipe()
	if err != nil {
		return err
	}
	out, err := client.StdoutPipe()
	if err != nil {
		return err
	}
	if err := client.Start(); err != nil {
		return err
	}
	defer func() { client.Process.Kill(); client.Wait() }()
	lines := bufio.NewScanner(out)
	ready := false
	for lines.Scan() {
		line := lines.Text()
		if line == "ready" {
			ready = true
			break
		}
		fmt.Println(line) // the client's own bench lines
	}
	if !ready {
		return errors.New("client did not open its tunnels")
	}
	if st := srv.Stats(); st.Tunnels != *tunnels {
		return fmt.Errorf("server holds %d tunnels, want %d", st.Tunnels, *tunnels)
	}
	time.Sleep(time.Second) // let the idle tunnels settle (handler stacks, timers)
	after, err := sampleMemory()
	if err != nil {
		return err
	}
	if path := os.Getenv("HBONE_BENCH_HEAP_PROFILE"); path != "" {
		if f, err := os.Create(path); err == nil {
			pprof.WriteHeapProfile(f)
			f.Close()
		}
	}
	report("hbone_idle_tunnels", float64(*tunnels), "count")
	report("hbone_server_connections", float64(srv.Stats().Connections), "count")
	after.perTunnel(before, *tunnels, "server")
	stdin.Close() // the client measures itself, then exits
	for lines.Scan() {
		fmt.Println(lines.Text())
	}
	return client.Wait()
}

func runMemSink() error {
	ln, addr, err := listen()
	if err != nil {
		return err
	}
	fmt.Printf("sink %s\n", addr)
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			// Echo the greeting byte, then hold the connection open.
			var b [1]byte
			if _, err := io.ReadFull(c, b[:]); err == nil {
				c.Write(b[:])
			}
			io.Copy(io.Discard, c)
			c.Close()
		}()
	}
}

func runMemClient(args []string) error {
	fs := flag.NewFlagSet("memclient", flag.ExitOnError)
	server := fs.String("server", "", "HBONE server address")
	sinkAddr := fs.String("sink", "", "upstream sink address")
	dir := fs.String("material", "", "directory with roots.pem, client.pem, key.pem")
	tunnels := fs.Int("tunnels", 10000, "tunnels to open")
	fs.Parse(args)

	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(*dir, name))
		if err != nil {
			panic(err)
		}
		return b
	}
	roots, err := trust.ParseCertificatesPEM(read("roots.pem"))
	if err != nil {
		return err
	}
	bundle, err := trust.NewBundle(trustDomain, roots)
	if err != nil {
		return err
	}
	cert, err := tls.X509KeyPair(read("client.pem"), read("key.pem"))
	if err != nil {
		return err
	}
	serverID, _ := trust.NewIdentity(trustDomain, "bench", "server")
	clientID, _ := trust.NewIdentity(trustDomain, "bench", "client")
	addr, err := netip.ParseAddrPort(*server)
	if err != nil {
		return err
	}
	pool, err := hbone.NewPool(hbone.PoolOptions{Bundle: bundle})
	if err != nil {
		return err
	}
	defer pool.Close()
	target := hbone.Target{
		Address: addr, Authority: *sinkAddr, Source: clientID,
		Cert:     func() (*tls.Certificate, error) { return &cert, nil },
		Expected: []trust.Identity{serverID},
	}

	before, err := sampleMemory()
	if err != nil {
		return err
	}
	conns := make([]net.Conn, *tunnels)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
		sem      = make(chan struct{}, 200)
	)
	for i := range conns {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			c, err := pool.Dial(ctx, target)
			if err == nil {
				// One byte each way: the tunnel reaches the sink.
				c.SetDeadline(time.Now().Add(time.Minute))
				var b [1]byte
				if _, err = c.Write([]byte{'x'}); err == nil {
					_, err = io.ReadFull(c, b[:])
				}
				c.SetDeadline(time.Time{})
			}
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
				return
			}
			conns[i] = c
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return fmt.Errorf("opening tunnels: %w", firstErr)
	}
	time.Sleep(time.Second)
	after, err := sampleMemory()
	if err != nil {
		return err
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin) // until the server has measured
	report("hbone_client_connections", float64(pool.Stats().Connections), "count")
	after.perTunnel(before, *tunnels, "client")
	for _, c := range conns {
		c.Close()
	}
	return nil
}
