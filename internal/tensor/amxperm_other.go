//go:build !(amd64 && linux)

package tensor

import "errors"

// requestAMXPermission reports that only Linux on amd64 is asked for the
// AMX tile permission here.
func requestAMXPermission() error {
	return errors.New("the AMX tile permission is only requested on Linux/amd64")
}
