package authn

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"

	"go.uber.org/zap"
	"google.golang.org/grpc/metadata"

	"github.com/causeway-mesh/causeway/pkg/readlimit"
	"github.com/causeway-mesh/causeway/pkg/trust"
)

const (
	// MinTokenLength is the shortest token a tokens file may hold; shorter
	// ones are guessable.
	MinTokenLength = 16
	// maxTokensFileSize bounds every read of the tokens file.
	maxTokensFileSize = 1 << 20
	// maxAuthorizationHeader bounds the bearer token a caller may send.
	maxAuthorizationHeader = 8 << 10
)

// BearerToken returns the token of the call's "authorization: Bearer <token>"
// metadata. Without that header (or with another scheme) the error wraps
// ErrNoCredentials; a malformed one wraps ErrInvalidCredentials.
func BearerToken(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	values := md.Get("authorization")
	if len(values) == 0 {
		return "", fmt.Errorf("%w: no authorization header", ErrNoCredentials)
	}
	if len(values) > 1 {
		return "", fmt.Errorf("%w: %d authorization headers", ErrInvalidCredentials, len(values))
	}
	v := values[0]
	if len(v) > maxAuthorizationHeader {
		return "", fmt.Errorf("%w: authorization header longer than %d bytes", ErrInvalidCredentials, maxAuthorizationHeader)
	}
	scheme, token, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", fmt.Errorf("%w: authorization header is not a bearer token", ErrNoCredentials)
	}
	token = strings.TrimSpace(token)
	if token == "" {
		return "", fmt.Errorf("%w: empty bearer token", ErrInvalidCredentials)
	}
	return token, nil
}

// TokenEntry is one line of a tokens file.
type TokenEntry struct {
	digest [sha256.Size]byte // the token itself is not kept
	Caller Caller
}

// ParseTokens parses a tokens file: one entry per line,
// "<token> <namespace>/<serviceaccount> [<node>]", fields separated by
// blanks; empty lines and lines starting with '#' are ignored. Accounts
// are identities in trustDomain. A caller without a node can never
// impersonate (it can only get its own identity).
func ParseTokens(data []byte, trustDomain string) ([]TokenEntry, error) {
	var entries []TokenEntry
	seen := map[[sha256.Size]byte]int{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), maxTokensFileSize)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 2 || len(f) > 3 {
			return nil, fmt.Errorf("line %d: want <token> <namespace>/<serviceaccount> [<node>], found %d fields", n, len(f))
		}
		if len(f[0]) < MinTokenLength {
			return nil, fmt.Errorf("line %d: token shorter than %d characters", n, MinTokenLength)
		}
		ns, sa, ok := strings.Cut(f[1], "/")
		if !ok {
			return nil, fmt.Errorf("line %d: account %q is not <namespace>/<serviceaccount>", n, f[1])
		}
		id, err := trust.NewIdentity(trustDomain, ns, sa)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		e := TokenEntry{digest: sha256.Sum256([]byte(f[0])), Caller: Caller{Account: id}}
		if len(f) == 3 {
			e.Caller.Node = f[2]
		}
		if prev, dup := seen[e.digest]; dup {
			return nil, fmt.Errorf("line %d: same token as line %d", n, prev)
		}
		seen[e.digest] = n
		entries = append(entries, e)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return entries, nil
}

// TokenFile authenticates bearer tokens listed in a file (local mode). The
// file is read again when it changes (checked on each call, so an atomic
// replacement or a Kubernetes secret update takes effect at once); a new
// version that does not parse is logged and the previous one stays in force.
type TokenFile struct {
	path        string
	trustDomain string
	log         *zap.Logger

	mu      sync.Mutex
	entries []TokenEntry
	stamp   fileStamp
}

type fileStamp struct {
	mod  int64 // UnixNano
	size int64
	ino  uint64
}

// NewTokenFile reads the tokens file at path (see ParseTokens) and returns
// an authenticator over it.
func NewTokenFile(path, trustDomain string, log *zap.Logger) (*TokenFile, error) {
	if log == nil {
		log = zap.NewNop()
	}
	t := &TokenFile{path: path, trustDomain: trustDomain, log: log}
	stamp, err := statFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokens file: %w", err)
	}
	entries, err := t.read()
	if err != nil {
		return nil, err
	}
	t.entries, t.stamp = entries, stamp
	return t, nil
}

func (t *TokenFile) read() ([]TokenEntry, error) {
	data, err := readlimit.File(t.path, maxTokensFileSize)
	if err != nil {
		return nil, fmt.Errorf("tokens file %s: %w", t.path, err)
	}
	entries, err := ParseTokens(data, t.trustDomain)
	if err != nil {
		return nil, fmt.Errorf("tokens file %s: %w", t.path, err)
	}
	return entries, nil
}

// current returns the entries, re-reading the file first if it changed.
func (t *TokenFile) current() []TokenEntry {
	t.mu.Lock()
	defer t.mu.Unlock()
	stamp, err := statFile(t.path)
	if err != nil {
		if t.stamp != (fileStamp{}) {
			t.log.Error("tokens file unreadable; keeping the tokens loaded before", zap.String("path", t.path), zap.Error(err))
			t.stamp = fileStamp{}
		}
		return t.entries
	}
	if stamp == t.stamp {
		return t.entries
	}
	entries, err := t.read()
	if err != nil {
		t.log.Error("tokens file changed but is invalid; keeping the tokens loaded before", zap.String("path", t.path), zap.Error(err))
	} else {
		t.entries = entries
		t.log.Info("tokens file reloaded", zap.String("path", t.path), zap.Int("tokens", len(entries)))
	}
	// Remember the stamp either way, so a bad version is reported once.
	t.stamp = stamp
	return t.entries
}

// Authenticate implements Authenticator for "authorization: Bearer <token>".
func (t *TokenFile) Authenticate(ctx context.Context) (Caller, error) {
	token, err := BearerToken(ctx)
	if err != nil {
		return Caller{}, err
	}
	return t.lookup(token)
}

// lookup compares the token's digest with every entry, without stopping at
// a match, so the time taken says nothing about which or how many bytes
// matched.
func (t *TokenFile) lookup(token string) (Caller, error) {
	d := sha256.Sum256([]byte(token))
	found := -1
	entries := t.current()
	for i := range entries {
		if subtle.ConstantTimeCompare(d[:], entries[i].digest[:]) == 1 {
			found = i
		}
	}
	if found < 0 {
		return Caller{}, fmt.Errorf("%w: bearer token not recognised", ErrInvalidCredentials)
	}
	return entries[found].Caller, nil
}

// statFile identifies a version of the file: a rename over it changes the
// inode even when size and time happen to match.
func statFile(path string) (fileStamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, err
	}
	if !fi.Mode().IsRegular() {
		return fileStamp{}, fmt.Errorf("%s: not a regular file", path)
	}
	s := fileStamp{mod: fi.ModTime().UnixNano(), size: fi.Size()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.ino = st.Ino
	}
	return s, nil
}
