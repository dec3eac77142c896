package kvevents

import "fmt"

// Encoding is the msgpack form the events of a published batch take. The
// batch itself is an array in both ([ts, [event...], data_parallel_rank]).
type Encoding uint8

const (
	// EncodingMap writes each event as a map from field name to value, the
	// tag under "type": what vLLM publishes since it dropped array_like from
	// its event structs (vLLM 0.32 does; so does vLLM's own decoder require).
	// It is the zero value, the default.
	EncodingMap Encoding = iota
	// EncodingArray writes each event positionally, the tag first: what
	// vLLM published while its event structs were array_like, for consumers
	// that decode only that form.
	EncodingArray
)

// String is the name --kv-events-config spells the encoding with.
func (e Encoding) String() string {
	switch e {
	case EncodingMap:
		return "map"
	case EncodingArray:
		return "array"
	}
	return fmt.Sprintf("Encoding(%d)", uint8(e))
}

// MarshalText writes the encoding's name.
func (e Encoding) MarshalText() ([]byte, error) {
	if e > EncodingArray {
		return nil, fmt.Errorf("kvevents: unknown event encoding %d", uint8(e))
	}
	return []byte(e.String()), nil
}

// UnmarshalText reads "map" or "array".
func (e *Encoding) UnmarshalText(b []byte) error {
	switch string(b) {
	case "map":
		*e = EncodingMap
	case "array":
		*e = EncodingArray
	default:
		return fmt.Errorf("unknown event_encoding %q: want \"map\" (vLLM 0.32 and later, the default) or \"array\" (the positional form older vLLM published)", b)
	}
	return nil
}
