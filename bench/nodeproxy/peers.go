package main

import (
	"context"
	"crypto/tls"
	"net"

	"github.com/causeway-mesh/causeway/bench/internal/peers"
)

// The peers (bench/internal/peers) on addresses of their own, carrying the
// same traffic between the same client and app as the node proxy pair.
const (
	nginxAIP   = "127.0.92.1"
	nginxBIP   = "127.0.92.2"
	stunnelAIP = "127.0.93.1"
	stunnelBIP = "127.0.93.2"
	plainAIP   = "127.0.94.1"
	plainBIP   = "127.0.94.2"
	tlsAppIP   = "127.0.190.3" // pod B's app behind TLS (the TLS-direct reference)
)

var appPorts = []string{bulkPort, rrPort, holdPort}

// startPeer starts the named pair in work/name, in front of pod B's app.
func startPeer(name, work, pki string, workers, files int) (*peers.Pair, error) {
	client, server := peerIPs(name)
	return peers.Start(peers.Config{Name: name, Work: work, PKI: pki, ClientIP: client, ServerIP: server,
		AppIP: appIP, Ports: appPorts, Workers: workers, Files: files})
}

// peerIPs are the client and server sides' addresses of the named pair.
func peerIPs(name string) (client, server string) {
	switch name {
	case "stunnel":
		return stunnelAIP, stunnelBIP
	case "nginx_plain":
		return plainAIP, plainBIP
	}
	return nginxAIP, nginxBIP
}

// tlsDialer connects from pod A's address with TLS to pod B's TLS app.
func tlsDialer(conf *tls.Config) func(context.Context, string) (net.Conn, error) {
	d := &tls.Dialer{NetDialer: localDialer(), Config: conf}
	return func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }
}
