package main

import (
	"fmt"
	"os"

	"github.com/causeway-mesh/causeway/pkg/version"
)

func init() {
	register("version", "print meshctl's version (also: meshctl --version)", runVersion)
}

func runVersion(args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("takes no arguments, got %q", args)
	}
	version.Print(os.Stdout, "meshctl")
	return nil
}
