//go:build tools

package tools

import _ "github.com/kubernetes-csi/external-provisioner/v5/cmd/csi-provisioner"
