//go:build tools

// Package tools records the Kubernetes commands built from this wrapper module as its dependencies
// so that `go mod tidy` resolves everything they need. dev/install/kube.sh builds kube-apiserver and
// dev/install/kube-node.sh builds the node and control-plane commands, all with one Go build cache.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
