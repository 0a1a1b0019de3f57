//go:build tools

// Package tools records kube-apiserver as a dependency of this wrapper module so that
// `go mod tidy` resolves everything it needs; build it with
// `go build k8s.io/kubernetes/cmd/kube-apiserver` (see dev/install/kube.sh).
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
