package kvconnector

import (
	"errors"
	"testing"

	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/kvparams"
)

// FuzzParseKV: whatever params parse, the connector's check never panics,
// refuses only with a kv_transfer_params 400, and what it accepts as
// remote KV lists exactly the blocks of the tokens it covers.
func FuzzParseKV(f *testing.F) {
	for _, s := range []string{
		`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`,
		`{"do_remote_prefill":true,"remote_engine_id":"e","remote_request_id":"r","remote_host":"h","remote_port":1,"remote_block_ids":[[3,4]],"remote_num_tokens":20,"tp_size":1}`,
		`{"do_remote_decode":true,"remote_engine_id":"e","remote_request_id":"r","remote_host":"h","remote_port":1,"remote_block_ids":[[3]],"remote_num_tokens":5,"tandem_history":["0011223344556677"],"remote_blocks_expiry_time":1e9}`,
		`{"do_remote_prefill":true,"remote_block_ids":[[1],[2]]}`,
	} {
		f.Add([]byte(s), uint16(20), uint8(16), true)
	}
	f.Fuzz(func(t *testing.T, data []byte, promptLen uint16, blockSize uint8, history bool) {
		kv, err := kvparams.Parse(data)
		if err != nil || blockSize == 0 {
			return
		}
		k, err := parseKV(kv, int(promptLen), int(blockSize), nil, history)
		if err != nil {
			if ire, ok := errors.AsType[*engine.InvalidRequestError](err); !ok || ire.Param != kvParam {
				t.Fatalf("parseKV(%s) = %v, want a kv_transfer_params 400", data, err)
			}
			return
		}
		if k.remote == nil {
			return
		}
		if want := (k.numTokens + int(blockSize) - 1) / int(blockSize); len(k.remote.BlockIDs) != want {
			t.Fatalf("accepted %d blocks for %d tokens of %d: %s", len(k.remote.BlockIDs), k.numTokens, blockSize, data)
		}
		if !k.remoteDecode && k.numTokens != int(promptLen) {
			t.Fatalf("a decode leg's params cover %d tokens of a %d-token prompt: %s", k.numTokens, promptLen, data)
		}
	})
}
