package apierror

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"testing"
)

// vllmNonOpenAIShapes are the recorded vLLM answers that are not its
// OpenAI-shaped ErrorResponse, by version and file: its HTTP framework's
// own refusals. Tandem answers these cases OpenAI-shaped (and a non-JSON
// content type with 415 where vLLM says 400); the test fails when the list
// stops being true, so a change in vLLM shows.
var vllmNonOpenAIShapes = map[string][]string{
	// Invalid UTF-8 in the body: FastAPI's {"detail": "There was an error
	// parsing the body"}. Malformed JSON and text/plain: its request
	// validation's 400 with type "Bad Request" (the reason phrase), where
	// its own checks say "BadRequestError" as Tandem does.
	"0.32.0": {"bad-json.json", "invalid-utf8.json", "text-plain.json"},
}

// TestVLLMRecordedErrorsHaveTandemsShape reads the error answers recorded
// from a running vllm serve (testdata/vllm/<version>/errors, written by
// scripts/vllm/record.sh) and checks that each OpenAI-shaped one decodes
// into ErrorBody field for field, with no field Tandem lacks, and that its
// type is the one Tandem gives the same status.
func TestVLLMRecordedErrorsHaveTandemsShape(t *testing.T) {
	files, _ := filepath.Glob("../../testdata/vllm/*/errors/*.json")
	if len(files) == 0 {
		t.Fatal("no recorded vLLM errors under testdata/vllm: they are committed; re-create them with bash scripts/vllm/record.sh")
	}
	odd := map[string][]string{}
	for _, f := range files {
		version := filepath.Base(filepath.Dir(filepath.Dir(f)))
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var rec struct {
			Status int             `json:"status"`
			Body   json.RawMessage `json:"body"`
		}
		if err := json.Unmarshal(raw, &rec); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		var body ErrorBody
		dec := json.NewDecoder(bytes.NewReader(rec.Body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&body); err != nil || body.Error.Message == "" || body.Error.Type != typeForStatus(rec.Status) || body.Error.Code != rec.Status {
			odd[version] = append(odd[version], filepath.Base(f))
			t.Logf("vLLM %s, %s: %d %s (not Tandem's shape for the status: %v)", version, filepath.Base(f), rec.Status, rec.Body, err)
			continue
		}
		// The field set is exactly Tandem's: message, type, param, code.
		var m map[string]map[string]any
		json.Unmarshal(rec.Body, &m)
		var keys []string
		for k := range m["error"] {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		if want := []string{"code", "message", "param", "type"}; !reflect.DeepEqual(keys, want) {
			t.Errorf("vLLM %s, %s: error fields %v, Tandem writes %v", version, filepath.Base(f), keys, want)
		}
	}
	for v, want := range vllmNonOpenAIShapes {
		sort.Strings(odd[v])
		if !reflect.DeepEqual(odd[v], want) {
			t.Errorf("vLLM %s: answers not in Tandem's error shape %v, known %v: update vllmNonOpenAIShapes and docs/usage/vllm.md", v, odd[v], want)
		}
	}
}
