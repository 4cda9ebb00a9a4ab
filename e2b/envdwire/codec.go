package envdwire

import (
	"encoding/json"
	"fmt"
	"strconv"
)

// Codec is the connect-go codec for envd's JSON wire format. It registers
// under the name "json", so connect-go sends application/json for unary
// calls and application/connect+json for streams, as the E2B SDKs do.
type Codec struct{}

// Name implements connect.Codec.
func (Codec) Name() string { return "json" }

// Marshal implements connect.Codec.
func (Codec) Marshal(v any) ([]byte, error) { return json.Marshal(v) }

// Unmarshal implements connect.Codec. Unknown fields are ignored, as the
// SDKs do, so newer envd versions stay readable.
func (Codec) Unmarshal(data []byte, v any) error {
	if len(data) == 0 {
		return nil // an empty message may arrive as an empty body
	}
	return json.Unmarshal(data, v)
}

// Int64 is a protobuf int64 in JSON: written as a decimal string, read from
// a string or a number (protojson accepts both).
type Int64 int64

// MarshalJSON writes the value as a quoted decimal.
func (n Int64) MarshalJSON() ([]byte, error) {
	return []byte(strconv.Quote(strconv.FormatInt(int64(n), 10))), nil
}

// UnmarshalJSON reads a quoted or bare decimal.
func (n *Int64) UnmarshalJSON(b []byte) error {
	s := string(b)
	if s == "null" {
		return nil
	}
	if u, err := strconv.Unquote(s); err == nil {
		s = u
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return fmt.Errorf("envd: int64 %s: %w", b, err)
	}
	*n = Int64(v)
	return nil
}
