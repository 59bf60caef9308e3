package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"sigs.k8s.io/yaml"
)

// checkFormat refuses an output format meshctl does not write.
func checkFormat(f string) error {
	switch f {
	case "table", "json", "yaml":
		return nil
	}
	return fmt.Errorf("output format %q: want table, json or yaml", f)
}

// render writes v as JSON or YAML, or calls table for the table format.
func render(w io.Writer, format string, v any, table func(io.Writer) error) error {
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	case "table", "":
		return table(w)
	}
	return checkFormat(format)
}

// newTable is the tab writer every table of meshctl uses.
func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 8, 2, ' ', 0) }
