// Command images builds Causeway's container images with go-containerregistry
// (no Docker, no daemon), pushes them to a registry, and checks a release's
// pinned digests against it. It is a build tool, not part of Causeway.
//
//	images push -registry HOST[:PORT][/PATH] [-tag TAG] [-platforms linux/amd64,linux/arm64]
//	       [-version V] [-revision SHA] [-source URL] [-created RFC3339]
//	       [-refs FILE] [-registry-ca PEM] [-binary PATH]... [-file DEST=SRC]... [PACKAGE...]
//	images verify -tag TAG [-registry-ca PEM] FILE...
//
// push builds every Go PACKAGE for every platform (CGO_ENABLED=0, -trimpath,
// the version stamped into pkg/version) and makes of each an image index with
// one image per platform, ko-style: a base layer with /etc/passwd, /etc/group,
// Mozilla's CA bundle and /tmp, and a layer with the binary at
// /usr/local/bin/NAME (NAME: the package's last path element), its
// entrypoint; it runs as nonroot (65532). A -binary is a static executable
// built elsewhere: an index of the one platform it was built for. -file adds
// a file to every image, in a layer of its own (the conformance suite's echo
// image: a server, the client its tests exec, a certificate). Each index
// is pushed as REGISTRY/NAME:TAG (credentials from the docker config file,
// as `docker login` writes it) and printed as REGISTRY/NAME:TAG@DIGEST; -refs
// writes the same lines, "NAME REF@DIGEST", for the release step. Nothing
// depends on the clock or the machine: one commit gives the same digests.
//
// verify reads YAML or text FILEs, and checks every image reference pinned
// by digest in them (REPOSITORY@sha256:...) against the registry: its TAG
// must resolve to exactly that digest. It fails on any mismatch, on a
// missing image, and when FILE pins nothing.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: images push|verify [flags] (images <command> -h for its flags)")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "push":
		err = pushMain(ctx, os.Args[2:])
	case "verify":
		err = verifyMain(ctx, os.Args[2:])
	default:
		err = usageError(fmt.Sprintf("unknown command %q: want push or verify", os.Args[1]))
	}
	var usage usageError
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case errors.As(err, &usage):
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(2)
	case err != nil:
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

// usageError is a mistake in the command line (exit status 2).
type usageError string

func (e usageError) Error() string { return string(e) }

// remoteOptions are the registry client's: the docker config file's
// credentials, and the system's roots plus caFile's certificates.
func remoteOptions(ctx context.Context, caFile string) ([]remote.Option, error) {
	opts := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)}
	if caFile == "" {
		return opts, nil
	}
	pemCerts, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pemCerts) {
		return nil, fmt.Errorf("-registry-ca %s holds no PEM certificate", caFile)
	}
	tr := remote.DefaultTransport.(*http.Transport).Clone()
	if tr.TLSClientConfig == nil {
		tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	tr.TLSClientConfig.RootCAs = pool
	// An unreachable registry fails within a bound, not after the kernel's.
	tr.ResponseHeaderTimeout = time.Minute
	return append(opts, remote.WithTransport(tr)), nil
}

// stringList is a repeatable flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }
