//go:build tools

// Package sonobuoybuild builds Sonobuoy's published module at the version go.mod pins. The
// proxy refuses `go install ...@v0.57.5` (its version list is forbidden), so the release is
// required here instead: this file's import keeps it required through `go mod tidy`, and the
// `tools` tag keeps the import (a main package) out of every build.
package sonobuoybuild

import (
	_ "github.com/vmware-tanzu/sonobuoy"
)
