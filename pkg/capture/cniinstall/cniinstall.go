// Package cniinstall puts the chained plugin (cmd/causeway-cni) on a node
// and takes it off again, in the model of Istio's install-cni: the plugin
// binary goes into the CNI binary directory, and the node's primary
// network configuration (the lexically first file of the configuration
// directory, the one container runtimes load: containerd's max_conf_num =
// 1) is copied, with the causeway-cni entry appended to its plugins, into a
// file of our own whose name sorts before it. The primary is never
// modified, so removing our file is all an uninstall needs, and the primary
// changing (the network plugin upgraded) is followed by rewriting ours.
//
// When to uninstall is the caller's decision (cmd/causeway-agent: only when
// its DaemonSet is deleted, never on a restart or an upgrade, when pods
// must keep failing closed until the new agent is up).
package cniinstall

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/causeway-mesh/causeway/pkg/atomicfile"
	"github.com/causeway-mesh/causeway/pkg/readlimit"
)

// PluginType is the plugin's type in a conflist (its binary's name).
const PluginType = "causeway-cni"

// DefaultConfName sorts before the usual primary names (10-bridge.conflist,
// 10-calico.conflist, 05-cilium.conflist); Write refuses a primary that
// sorts before it (00-multus.conf: choose another name then).
const DefaultConfName = "05-causeway.conflist"

// confExtensions are the files container runtimes read (libcni's).
var confExtensions = []string{".conf", ".conflist", ".json"}

// maxConf bounds a configuration file read.
const maxConf = 1 << 20

// Chain returns the conflist of primary (a .conflist, or a single
// plugin's .conf) with entry appended as the last plugin. An entry of the
// plugin's type already there (the primary is itself a chained copy) is
// replaced, never repeated.
func Chain(primary []byte, entry map[string]any) ([]byte, error) {
	var conf map[string]any
	d := json.NewDecoder(bytes.NewReader(primary))
	d.UseNumber() // numbers pass through as written
	if err := d.Decode(&conf); err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	if entry["type"] != PluginType {
		return nil, fmt.Errorf("entry has type %v, want %s", entry["type"], PluginType)
	}
	var plugins []any
	if raw, ok := conf["plugins"]; ok {
		list, ok := raw.([]any)
		if !ok || len(list) == 0 {
			return nil, errors.New(`"plugins" is not a non-empty list`)
		}
		plugins = list
	} else {
		// A single plugin's configuration: the conflist keeps its name and
		// version, the plugin the rest.
		if _, ok := conf["type"].(string); !ok {
			return nil, errors.New(`neither "plugins" nor a plugin "type"`)
		}
		single := conf
		conf = map[string]any{"cniVersion": single["cniVersion"], "name": single["name"]}
		delete(single, "name")
		delete(single, "cniVersion")
		plugins = []any{single}
	}
	if _, ok := conf["name"].(string); !ok {
		return nil, errors.New(`no network "name"`)
	}
	chained := slices.DeleteFunc(slices.Clone(plugins), func(p any) bool {
		m, ok := p.(map[string]any)
		return ok && m["type"] == PluginType
	})
	conf["plugins"] = append(chained, entry)
	out, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

// Installer writes and removes the plugin on one node.
type Installer struct {
	// ConfDir and BinDir are the node's CNI directories as mounted here.
	ConfDir, BinDir string
	// ConfName is our configuration's file name (default DefaultConfName).
	ConfName string
	// Entry is the plugin's entry in the chain ("type": PluginType, its
	// agent_socket, ...).
	Entry map[string]any
}

func (in *Installer) confName() string {
	if in.ConfName != "" {
		return in.ConfName
	}
	return DefaultConfName
}

// Primary returns the path of the configuration runtimes would load but
// for ours, or "" when there is none.
func (in *Installer) Primary() (string, error) {
	entries, err := os.ReadDir(in.ConfDir)
	if err != nil {
		return "", err
	}
	for _, e := range entries { // sorted by name, as libcni sorts
		if e.IsDir() || e.Name() == in.confName() || !slices.Contains(confExtensions, filepath.Ext(e.Name())) {
			continue
		}
		return filepath.Join(in.ConfDir, e.Name()), nil
	}
	return "", nil
}

// Write brings our configuration up to date with the primary: written
// when it is missing or differs, removed when there is no primary (pods
// would otherwise get the network of a configuration that was taken
// away). It reports whether anything changed.
func (in *Installer) Write() (bool, error) {
	ours := filepath.Join(in.ConfDir, in.confName())
	primary, err := in.Primary()
	if err != nil {
		return false, fmt.Errorf("cniinstall: %w", err)
	}
	if primary == "" {
		err := os.Remove(ours)
		if errors.Is(err, os.ErrNotExist) {
			return false, nil
		}
		return err == nil, err
	}
	if filepath.Base(primary) < in.confName() {
		return false, fmt.Errorf("cniinstall: the primary configuration %s sorts before %s and would still be loaded first: choose a configuration name that sorts first", primary, in.confName())
	}
	raw, err := readlimit.File(primary, maxConf)
	if err != nil {
		return false, fmt.Errorf("cniinstall: %w", err)
	}
	want, err := Chain(raw, in.Entry)
	if err != nil {
		return false, fmt.Errorf("cniinstall: chain %s: %w", primary, err)
	}
	if have, err := readlimit.File(ours, maxConf); err == nil && bytes.Equal(have, want) {
		return false, nil
	}
	if err := atomicfile.Replace(ours, bytes.NewReader(want), 0o644); err != nil {
		return false, fmt.Errorf("cniinstall: %w", err)
	}
	return true, nil
}

// Uninstall removes our configuration, then the binary: no new pod calls
// the plugin once it returns. What is already gone is no error.
func (in *Installer) Uninstall() error {
	var errs []error
	for _, p := range []string{filepath.Join(in.ConfDir, in.confName()), filepath.Join(in.BinDir, PluginType)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// CopyBinary installs the executable src as dir/causeway-cni, replacing
// any older one atomically (a runtime executing the old binary meanwhile
// keeps its copy).
func CopyBinary(src, dir string) error {
	f, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("cniinstall: %w", err)
	}
	defer f.Close()
	if err := atomicfile.Replace(filepath.Join(dir, PluginType), f, 0o755); err != nil {
		return fmt.Errorf("cniinstall: %w", err)
	}
	return nil
}
