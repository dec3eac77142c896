//go:build !amd64

package tensor

// amxCPUID reports no AMX: it is an amd64 extension.
func amxCPUID() AMXSupport { return AMXSupport{} }
