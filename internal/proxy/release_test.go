package proxy

import (
	"testing"

	"github.com/tandem-serve/tandem/internal/openai"
)

func TestReleasePathIsTheEngines(t *testing.T) {
	if kvReleasePath != openai.KVReleasePath {
		t.Errorf("kvReleasePath = %q, engines serve %q", kvReleasePath, openai.KVReleasePath)
	}
}
