package main

import "github.com/causeway-mesh/causeway/bench/internal/benchmesh"

// nginxProxy is nginx doing what the waypoint does, without the policy:
// mutual TLS 1.3 in, HTTP/1.1 routing to one upstream, mutual TLS 1.3 out
// over pooled keep-alive connections; dir holds the PKI's files.
func nginxProxy(dir, listen, backend string, workers int) benchmesh.NginxProxy {
	return benchmesh.NginxProxy{Dir: dir, Listen: listen, Upstream: backend, Workers: workers,
		Cert: "nginx.bench.pem", Key: "nginx.bench.key", ClientCA: "ca.pem",
		UpstreamTLS: &benchmesh.NginxUpstreamTLS{Cert: "nginx-client.bench.pem", Key: "nginx-client.bench.key", CA: "ca.pem", Name: "backend.bench"}}
}
