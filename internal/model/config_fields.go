package model

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// fields wraps a decoded JSON object with typed, error-reporting accessors.
type fields struct {
	file string
	m    map[string]json.RawMessage
}

func readFields(path string) (*fields, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	return parseFields(filepath.Base(path), data)
}

func parseFields(file string, data []byte) (*fields, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("model: %s: expected a JSON object: %w", file, err)
	}
	return &fields{file: file, m: m}, nil
}

func (f *fields) has(name string) bool {
	v, ok := f.m[name]
	return ok && string(v) != "null"
}

func (f *fields) typeErr(name, want string) error {
	found := strings.TrimSpace(string(f.m[name]))
	if len(found) > 60 {
		found = found[:60] + "..."
	}
	return fmt.Errorf("model: %s: field %q: expected %s, found %s", f.file, name, want, found)
}

// intField reads an integer field; def is used when it is absent and
// required makes absence an error.
func (f *fields) intField(name string, def int, required bool) (int, error) {
	return f.intWant(name, def, required, "an integer")
}

func (f *fields) intWant(name string, def int, required bool, want string) (int, error) {
	if !f.has(name) {
		if required {
			return 0, fmt.Errorf("model: %s: required field %q is missing", f.file, name)
		}
		return def, nil
	}
	var v float64
	if err := json.Unmarshal(f.m[name], &v); err != nil || v != math.Trunc(v) || math.Abs(v) > 1<<53 {
		return 0, f.typeErr(name, want)
	}
	return int(v), nil
}

func (f *fields) posInt(name string, def int, required bool) (int, error) {
	v, err := f.intWant(name, def, required, "a positive integer")
	if err == nil && v <= 0 {
		return 0, f.typeErr(name, "a positive integer")
	}
	return v, err
}

func (f *fields) floatField(name string, def float64) (float64, error) {
	if !f.has(name) {
		return def, nil
	}
	var v float64
	if err := json.Unmarshal(f.m[name], &v); err != nil {
		return 0, f.typeErr(name, "a number")
	}
	return v, nil
}

func (f *fields) boolField(name string, def bool) (bool, error) {
	if !f.has(name) {
		return def, nil
	}
	var v bool
	if err := json.Unmarshal(f.m[name], &v); err != nil {
		return false, f.typeErr(name, "true or false")
	}
	return v, nil
}

func (f *fields) stringField(name, def string) (string, error) {
	if !f.has(name) {
		return def, nil
	}
	var v string
	if err := json.Unmarshal(f.m[name], &v); err != nil {
		return "", f.typeErr(name, "a string")
	}
	return v, nil
}

// idsField reads a token id given as an integer or a list of integers.
func (f *fields) idsField(name string) ([]int32, error) {
	if !f.has(name) {
		return nil, nil
	}
	var one int64
	if err := json.Unmarshal(f.m[name], &one); err == nil {
		if one < 0 || one > math.MaxInt32 {
			return nil, f.typeErr(name, "a non-negative token id")
		}
		return []int32{int32(one)}, nil
	}
	var many []int64
	if err := json.Unmarshal(f.m[name], &many); err != nil {
		return nil, f.typeErr(name, "a token id or a list of token ids")
	}
	ids := make([]int32, len(many))
	for i, id := range many {
		if id < 0 || id > math.MaxInt32 {
			return nil, f.typeErr(name, "non-negative token ids")
		}
		ids[i] = int32(id)
	}
	return ids, nil
}
