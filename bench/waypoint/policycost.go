package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/causeway-mesh/causeway/pkg/logging"
	"github.com/causeway-mesh/causeway/pkg/policy"
	"github.com/causeway-mesh/causeway/pkg/trust"
)

// policyCost is the CPU time of one policy.Engine.Decide in this process,
// as the waypoint calls it for every request: the input built from the
// benchmark's request and tunnel peer, the benchmark's policy evaluated,
// the result read; with and without the decision log the waypoint writes
// (JSON lines through zap, from the logger's own goroutine, counted too).
type policyCost struct {
	decide, decideLogged time.Duration
}

func measurePolicyCost(ctx context.Context, policyDir, logDir string, peer trust.Peer, backendID trust.Identity, n int) (policyCost, error) {
	req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(requestText)))
	if err != nil {
		return policyCost{}, err
	}
	pr := &policy.Request{HTTP: req, Source: peer, SourceAddr: netip.MustParseAddrPort(loadgenIP + ":40000"),
		DestAddr: netip.MustParseAddrPort(serviceVIP + ":80"), Destination: backendID, ID: "1"}
	run := func(dl *policy.DecisionLogger) (time.Duration, error) {
		e, err := policy.NewEngine(policy.Options{Dir: policyDir, DecisionLog: dl, Logger: zap.NewNop()})
		if err != nil {
			return 0, err
		}
		if err := e.Load(ctx); err != nil {
			return 0, fmt.Errorf("load policy: %w", err)
		}
		if d := e.Decide(ctx, pr); !d.Allowed {
			return 0, fmt.Errorf("the benchmark request is denied: %s", d.Reason)
		}
		if dl == nil {
			for range n / 10 { // warm caches and the heap
				e.Decide(ctx, pr)
			}
		}
		lctx, stopLog := context.WithCancel(ctx)
		defer stopLog()
		var wg sync.WaitGroup
		defer wg.Wait()
		if dl != nil {
			wg.Go(func() { dl.Run(lctx) })
		}
		before, err := processCPU()
		if err != nil {
			return 0, err
		}
		for range n {
			e.Decide(ctx, pr)
		}
		if dl != nil {
			stopLog() // Run writes what is queued, then returns
			wg.Wait()
		}
		after, err := processCPU()
		if err != nil {
			return 0, err
		}
		return (after - before) / time.Duration(n), nil
	}
	var c policyCost
	if c.decide, err = run(nil); err != nil {
		return c, err
	}
	logFile, err := os.Create(filepath.Join(logDir, "decisions.log"))
	if err != nil {
		return c, err
	}
	defer logFile.Close()
	// The waypoint's decision logger with --decision-log=all: its encoder,
	// buffered, flushed every second (Run syncs what is left as it ends).
	lg, err := logging.New(logging.Options{Output: logFile, FlushInterval: time.Second})
	if err != nil {
		return c, err
	}
	// Room for every decision: none is dropped, each is written.
	dl, err := policy.NewDecisionLogger(lg.Buffered("decisions"), policy.DecisionLogOptions{Mode: policy.LogAllDecisions, Buffer: n + 1})
	if err != nil {
		return c, err
	}
	c.decideLogged, err = run(dl)
	if err == nil && dl.Dropped() > 0 {
		err = fmt.Errorf("decision log dropped %d entries; the logged figure would be low", dl.Dropped())
	}
	return c, err
}

// processCPU is this process's user plus system CPU time.
func processCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, err
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// handshakePeer makes the Peer the waypoint derives for the load
// generator: a real TLS handshake between the mesh's server and client
// configurations, then trust.PeerFromTLS.
func handshakePeer(bundle *trust.Bundle, client, server *tls.Certificate, serverID trust.Identity) (trust.Peer, error) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	srv := tls.Server(a, trust.ServerConfig(bundle, func(net.Addr) (*tls.Certificate, error) { return server, nil }, trust.RequireClientCert))
	cli := tls.Client(b, trust.ClientConfig(bundle, func() (*tls.Certificate, error) { return client, nil }, []trust.Identity{serverID}))
	errc := make(chan error, 1)
	go func() { errc <- cli.Handshake() }()
	serr := srv.Handshake()
	if err := errors.Join(serr, <-errc); err != nil {
		return trust.Peer{}, fmt.Errorf("handshake for the policy peer: %w", err)
	}
	return trust.PeerFromTLS(srv.ConnectionState())
}
