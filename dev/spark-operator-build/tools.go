//go:build tools

// Package tools records spark-operator's command as a dependency so that `go mod tidy` resolves
// everything it needs; dev/install/spark-operator.sh builds it.
package tools

import _ "github.com/kubeflow/spark-operator/v2/cmd/operator"
