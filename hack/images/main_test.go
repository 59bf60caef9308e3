package main

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/validate"
	"golang.org/x/crypto/bcrypt"

	"github.com/causeway-mesh/causeway/pkg/backendtls/backendtlstest"
)

var testMeta = meta{source: "https://example.com/causeway", revision: "0123456789abcdef", version: "v0.0.1-test",
	created: time.Date(2026, 12, 6, 3, 0, 0, 0, time.UTC)}

var bothPlatforms = []v1.Platform{{OS: "linux", Architecture: "amd64"}, {OS: "linux", Architecture: "arm64"}}

// buildPause builds the index of ./pause for both platforms in a work
// directory of its own.
func buildPause(t *testing.T) v1.ImageIndex {
	t.Helper()
	o := pushOptions{platforms: bothPlatforms, meta: testMeta, packages: []string{"./pause"}}
	idx, err := buildIndexes(context.Background(), o, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return idx[0]
}

// TestReproducibleIndex builds the same package twice, a second apart (a
// timestamp taken from the clock would show), and checks the two indexes
// are identical, hold both platforms, and run the binary as nonroot with
// the CA bundle and the annotations.
func TestReproducibleIndex(t *testing.T) {
	first := buildPause(t)
	time.Sleep(1100 * time.Millisecond)
	second := buildPause(t)
	d1, err := first.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if d2, _ := second.Digest(); d1 != d2 {
		t.Fatalf("two builds of one commit: digests %s and %s", d1, d2)
	}
	checkIndex(t, first, "pause", bothPlatforms)
}

// checkIndex checks what every index of the tool holds.
func checkIndex(t *testing.T, idx v1.ImageIndex, bin string, platforms []v1.Platform) {
	t.Helper()
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if im.MediaType != "application/vnd.oci.image.index.v1+json" || im.Annotations[annotationVersion] != testMeta.version ||
		im.Annotations[annotationRevision] != testMeta.revision || im.Annotations[annotationSource] != testMeta.source ||
		im.Annotations[annotationCreated] != "2026-12-06T03:00:00Z" {
		t.Fatalf("index media type %s, annotations %v", im.MediaType, im.Annotations)
	}
	if len(im.Manifests) != len(platforms) {
		t.Fatalf("%d manifests, want %d", len(im.Manifests), len(platforms))
	}
	for i, desc := range im.Manifests {
		if desc.Platform == nil || !desc.Platform.Equals(platforms[i]) {
			t.Fatalf("manifest %d: platform %v, want %v", i, desc.Platform, platforms[i])
		}
		img, err := idx.Image(desc.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Architecture != platforms[i].Architecture || cfg.Config.User != "65532:65532" ||
			strings.Join(cfg.Config.Entrypoint, " ") != "/usr/local/bin/"+bin || !cfg.Created.Equal(testMeta.created) {
			t.Fatalf("%s config: arch %s user %q entrypoint %q created %v", platforms[i], cfg.Architecture, cfg.Config.User, cfg.Config.Entrypoint, cfg.Created)
		}
		files := imageFiles(t, img)
		if got, _ := elfPlatform(files["usr/local/bin/"+bin]); got != platforms[i].Architecture {
			t.Fatalf("%s: /usr/local/bin/%s is for %q", platforms[i], bin, got)
		}
		if !strings.Contains(string(files["etc/passwd"]), "nonroot:x:65532:65532:") {
			t.Fatalf("/etc/passwd: %q", files["etc/passwd"])
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(files[caBundlePath]) || bytes.Count(files[caBundlePath], []byte("BEGIN CERTIFICATE")) < 100 {
			t.Fatalf("/%s does not hold Mozilla's roots (%d bytes)", caBundlePath, len(files[caBundlePath]))
		}
	}
}

// imageFiles are the regular files of img's layers, by path.
func imageFiles(t *testing.T, img v1.Image) map[string][]byte {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if !h.ModTime.Equal(epoch) {
				t.Fatalf("%s: modification time %v", h.Name, h.ModTime)
			}
			if h.Typeflag == tar.TypeReg {
				files[h.Name], _ = io.ReadAll(tr)
			}
		}
		rc.Close()
	}
	return files
}

// TestExtraFiles: -file puts each file at its path in every image, with
// its parent directories, executable when its source is; an ELF
// executable must be built for the image's platform.
func TestExtraFiles(t *testing.T) {
	dir := t.TempDir()
	cert, client := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "arm64", "pause")
	if err := os.WriteFile(cert, []byte("not secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	arm := v1.Platform{OS: "linux", Architecture: "arm64"}
	if err := goBuild(context.Background(), filepath.Dir(client), arm, testMeta, []string{"./pause"}); err != nil {
		t.Fatal(err)
	}
	o, err := parsePush([]string{"-registry", "r.example", "-platforms", "linux/arm64",
		"-file", "/cert.crt=" + cert, "-file", "/opt/echo/bin/client=" + client, "./pause"})
	if err != nil {
		t.Fatal(err)
	}
	o.meta = testMeta
	idx, err := buildIndexes(context.Background(), o, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	checkIndex(t, idx[0], "pause", []v1.Platform{arm})
	im, _ := idx[0].IndexManifest()
	img, err := idx[0].Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	layers, _ := img.Layers()
	rc, err := layers[len(layers)-1].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got := map[string]int64{}
	tr := tar.NewReader(rc)
	for h, err := tr.Next(); err != io.EOF; h, err = tr.Next() {
		if err != nil {
			t.Fatal(err)
		}
		got[h.Name] = h.Mode
	}
	want := map[string]int64{"cert.crt": 0o644, "opt/": 0o755, "opt/echo/": 0o755, "opt/echo/bin/": 0o755, "opt/echo/bin/client": 0o755}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("the files' layer holds %v, want %v (modes in decimal)", got, want)
	}
	if files := imageFiles(t, img); string(files["cert.crt"]) != "not secret\n" {
		t.Fatalf("/cert.crt holds %q", files["cert.crt"])
	}

	// The arm64 executable in an amd64 image.
	o.platforms = []v1.Platform{{OS: "linux", Architecture: "amd64"}}
	if _, err := buildIndexes(context.Background(), o, t.TempDir()); err == nil || !strings.Contains(err.Error(), "built for arm64, not amd64") {
		t.Fatalf("an arm64 -file in an amd64 image: %v", err)
	}
}

func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "run.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"./pause"}, "-registry is required"},
		{[]string{"-registry", "Bad Host", "./pause"}, "-registry"},
		{[]string{"-registry", "r.example", "-tag", "a:b", "./pause"}, "-tag"},
		{[]string{"-registry", "r.example", "-platforms", "linux/s390x", "./pause"}, "-platforms"},
		{[]string{"-registry", "r.example", "-created", "yesterday", "./pause"}, "-created"},
		{[]string{"-registry", "r.example"}, "nothing to build"},
		{[]string{"-registry", "r.example", "./pause", "-binary", "x/pause"}, "two images"},
		{[]string{"-registry", "r.example", "-file", "cert.pem", "./pause"}, "DEST=SRC"},
		{[]string{"-registry", "r.example", "-file", "cert.crt=cert.pem", "./pause"}, "absolute"},
		{[]string{"-registry", "r.example", "-file", "/a/../cert.crt=cert.pem", "./pause"}, "clean"},
		{[]string{"-registry", "r.example", "-file", "/cert.crt=", "./pause"}, "DEST=SRC"},
	} {
		if _, err := parsePush(tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("push %q: %v, want an error mentioning %q", tc.args, err, tc.want)
		}
	}
	o := pushOptions{platforms: bothPlatforms, meta: testMeta, binaries: []string{script}}
	if _, err := buildIndexes(context.Background(), o, t.TempDir()); err == nil || !strings.Contains(err.Error(), "not an ELF") {
		t.Errorf("a shell script as -binary: %v", err)
	}
	o = pushOptions{platforms: bothPlatforms, meta: testMeta, packages: []string{"./pause"}, files: []extraFile{{"/cert.crt", filepath.Join(dir, "absent")}}}
	if _, err := buildIndexes(context.Background(), o, t.TempDir()); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("a -file that does not exist: %v", err)
	}
}

// registryBin is the CNCF distribution registry the Makefile builds
// (make test sets CAUSEWAY_REGISTRY_BIN).
func registryBin(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("CAUSEWAY_REGISTRY_BIN")
	if bin == "" {
		t.Skip("CAUSEWAY_REGISTRY_BIN is not set: `make test` builds the distribution registry and sets it")
	}
	return bin
}

// toolBin builds this command.
func toolBin(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "images")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

type registry struct {
	host   string // localhost:PORT (listening on 127.0.0.1)
	caFile string
}

// startRegistry runs a distribution registry over TLS (a CA of the test's
// own) on a loopback port, with htpasswd authentication when users is not
// empty (user: password).
func startRegistry(t *testing.T, users map[string]string) registry {
	t.Helper()
	bin := registryBin(t)
	dir := t.TempDir()
	caFile, certFile, keyFile := testCerts(t, dir)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().(*net.TCPAddr)
	l.Close()
	host := fmt.Sprintf("localhost:%d", addr.Port)
	cfg := fmt.Sprintf(`version: 0.1
log: {level: warn, accesslog: {disabled: true}}
storage: {filesystem: {rootdirectory: %s}}
http: {addr: %s, tls: {certificate: %s, key: %s}}
`, filepath.Join(dir, "data"), addr, certFile, keyFile)
	if len(users) > 0 {
		var lines strings.Builder
		for u, p := range users {
			h, err := bcrypt.GenerateFromPassword([]byte(p), bcrypt.MinCost)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&lines, "%s:%s\n", u, h)
		}
		pw := filepath.Join(dir, "htpasswd")
		if err := os.WriteFile(pw, []byte(lines.String()), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg += fmt.Sprintf("auth: {htpasswd: {realm: causeway-test, path: %s}}\n", pw)
	}
	cfgFile := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	cmd := exec.Command(bin, "serve", cfgFile)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("registry log:\n%s", logs.String())
		}
	})
	r := registry{host: host, caFile: caFile}
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsConfig(t, caFile)}}
	for deadline := time.Now().Add(30 * time.Second); ; {
		resp, err := client.Get("https://" + host + "/v2/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusUnauthorized {
				return r
			}
		}
		select {
		case <-exited:
			t.Fatalf("registry exited: %s", logs.String())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("registry not serving on %s within 30s: %v", host, err)
		}
	}
}

// run runs the tool with args and env, returning its stdout and stderr.
func run(t *testing.T, tool string, env []string, args ...string) (string, string, error) {
	t.Helper()
	cmd := exec.Command(tool, args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// emptyDockerConfig is a docker config directory with no credentials, so
// that the host's never leak into a test.
func emptyDockerConfig(t *testing.T) []string {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	return []string{"DOCKER_CONFIG=" + dir}
}

// TestPushTwiceAndVerify pushes one package twice to a real registry: the
// same digest both times, the index in the registry holds both platforms,
// and verify accepts what was pushed and refuses any other digest.
func TestPushTwiceAndVerify(t *testing.T) {
	reg := startRegistry(t, nil)
	tool := toolBin(t)
	env := emptyDockerConfig(t)
	refsFile := filepath.Join(t.TempDir(), "refs")
	push := func() string {
		out, stderr, err := run(t, tool, env, "push", "-registry", reg.host+"/causeway", "-tag", "v0.0.1-test",
			"-registry-ca", reg.caFile, "-refs", refsFile, "-version", testMeta.version, "-revision", testMeta.revision,
			"-source", testMeta.source, "-created", "2026-12-06T03:00:00Z", "./pause")
		if err != nil {
			t.Fatalf("push: %v\n%s", err, stderr)
		}
		return out
	}
	first := push()
	second := push()
	want := reg.host + "/causeway/pause:v0.0.1-test@sha256:"
	if !strings.HasPrefix(first, want) || strings.Count(first, "\n") != 1 {
		t.Fatalf("push printed %q, want one line %s...", first, want)
	}
	if first != second {
		t.Fatalf("two pushes of one commit: %q and %q", first, second)
	}
	pinned := strings.TrimSpace(first)
	if refs, _ := os.ReadFile(refsFile); string(refs) != "pause "+pinned+"\n" {
		t.Fatalf("-refs file holds %q", refs)
	}

	// What the registry holds, read back as a kubelet would.
	ref, err := name.NewDigest(pinned)
	if err != nil {
		t.Fatal(err)
	}
	opts, err := remoteOptions(context.Background(), reg.caFile)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := remote.Index(ref, opts...)
	if err != nil {
		t.Fatal(err)
	}
	// Digests, sizes and diff IDs agree with the blobs the registry serves.
	if err := validate.Index(idx); err != nil {
		t.Fatal(err)
	}
	checkIndex(t, idx, "pause", bothPlatforms)

	// verify: the pinned digest passes; another digest (here the amd64
	// image's, which the tag does not name) is refused.
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	os.WriteFile(good, []byte("image: "+pinned+"\n"), 0o644)
	if out, stderr, err := run(t, tool, env, "verify", "-tag", "v0.0.1-test", "-registry-ca", reg.caFile, good); err != nil {
		t.Fatalf("verify of what was pushed: %v\n%s%s", err, out, stderr)
	}
	im, _ := idx.IndexManifest()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("image: "+ref.Context().String()+"@"+im.Manifests[0].Digest.String()+"\n"), 0o644)
	_, stderr, err := run(t, tool, env, "verify", "-tag", "v0.0.1-test", "-registry-ca", reg.caFile, bad)
	if code := exitCode(err); code != 1 || !strings.Contains(stderr, "but the registry's") {
		t.Fatalf("verify of a digest that was not pushed as the tag: exit %d, %s", code, stderr)
	}
	_, stderr, err = run(t, tool, env, "verify", "-tag", "v9", "-registry-ca", reg.caFile, good)
	if code := exitCode(err); code != 1 || !strings.Contains(stderr, "MANIFEST_UNKNOWN") && !strings.Contains(stderr, "404") {
		t.Fatalf("verify against a tag never pushed: exit %d, %s", code, stderr)
	}
	os.WriteFile(bad, []byte("image: causeway/pause:v1\n"), 0o644)
	if _, stderr, err = run(t, tool, env, "verify", "-tag", "v1", bad); exitCode(err) != 1 || !strings.Contains(stderr, "pins no image") {
		t.Fatalf("verify of a file pinning nothing: %v, %s", err, stderr)
	}
}

// TestPushFailsWithTheRegistrysError: an unreachable registry, and one
// that wants credentials the docker config does not have, fail the push
// with the registry's error and exit status 1; with the credentials in the
// docker config file it succeeds.
func TestPushFailsWithTheRegistrysError(t *testing.T) {
	reg := startRegistry(t, map[string]string{"ci": "s3cret"})
	tool := toolBin(t)
	push := func(env []string, host string) (string, error) {
		_, stderr, err := run(t, tool, env, "push", "-registry", host, "-platforms", "linux/amd64", "-registry-ca", reg.caFile, "./pause")
		return stderr, err
	}

	// A port nothing listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	stderr, err := push(emptyDockerConfig(t), closed)
	if exitCode(err) != 1 || !strings.Contains(stderr, "connection refused") {
		t.Fatalf("push to %s (nothing listening): exit %d, %s", closed, exitCode(err), stderr)
	}

	stderr, err = push(emptyDockerConfig(t), reg.host)
	if exitCode(err) != 1 || !strings.Contains(stderr, "401 Unauthorized") {
		t.Fatalf("push without credentials: exit %d, %s", exitCode(err), stderr)
	}

	wrong := dockerConfig(t, reg.host, "ci", "wrong")
	if stderr, err = push(wrong, reg.host); exitCode(err) != 1 || !strings.Contains(stderr, "401 Unauthorized") {
		t.Fatalf("push with a wrong password: exit %d, %s", exitCode(err), stderr)
	}

	if stderr, err = push(dockerConfig(t, reg.host, "ci", "s3cret"), reg.host); err != nil {
		t.Fatalf("push with the credentials in the docker config: %v\n%s", err, stderr)
	}
}

// dockerConfig is a docker config directory holding host's credentials
// the way `docker login` writes them.
func dockerConfig(t *testing.T, host, user, password string) []string {
	dir := t.TempDir()
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + password))
	cfg := fmt.Sprintf(`{"auths": {%q: {"auth": %q}}}`, host, auth)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return []string{"DOCKER_CONFIG=" + dir}
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	return -1
}

// testCerts writes a CA and a serving certificate for localhost it signed.
func testCerts(t *testing.T, dir string) (caFile, certFile, keyFile string) {
	t.Helper()
	ca, err := backendtlstest.NewCA("images test CA")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Leaf([]string{"localhost"}, nil, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(leaf.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	write := func(file string, data []byte) string {
		p := filepath.Join(dir, file)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return write("ca.pem", ca.PEM), write("cert.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf.Certificate[0]})),
		write("key.pem", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
}

func tlsConfig(t *testing.T, caFile string) *tls.Config {
	pemCerts, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pemCerts)
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}
