package flowhttp

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// scanPriority is BodyPriority's reading: the top-level "priority" of a JSON
// object, found without decoding the body: its top-level keys are compared
// in place, nested values skipped, and the last "priority" wins, as it
// would in a decoded map; the body is then checked whole (json.Valid: what
// is not JSON has no priority, as for json.Unmarshal).
// Linear in the body's length, it allocates nothing, so a body of many
// duplicate keys costs a scan, not a map.
func scanPriority(body []byte) (int64, bool) {
	body = bytes.TrimSpace(body)
	if len(body) == 0 || body[0] != '{' {
		return 0, false
	}
	// Cheap exit for the common request without a priority: the key is
	// written either literally or with a \u escape (no other JSON escape
	// can spell one of its letters).
	if !bytes.Contains(body, []byte("priority")) && !bytes.Contains(body, []byte(`\u`)) {
		return 0, false
	}
	var raw []byte
	i := skipSpace(body, 1)
	for i < len(body) && body[i] == '"' {
		end := skipString(body, i)
		if end < 0 {
			return 0, false // unterminated: not JSON
		}
		isPrio := keyIs(body[i+1:end-1], "priority")
		i = skipSpace(body, end)
		if i >= len(body) || body[i] != ':' {
			return 0, false // not JSON
		}
		i = skipSpace(body, i+1)
		v := i
		i = skipValue(body, i)
		if isPrio {
			raw = body[v:i]
		}
		i = skipSpace(body, i)
		if i < len(body) && body[i] == ',' {
			i = skipSpace(body, i+1)
		}
	}
	// The walk above assumes valid JSON; it is checked only once a key
	// was found (without one the answer is false either way).
	if raw == nil || !json.Valid(body) {
		return 0, false
	}
	p, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		return 0, false
	}
	return p, true
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string opening at b[i], or -1
// if it is not closed.
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return -1
}

// skipValue returns the index after the value starting at b[i] (exactly,
// for valid JSON; somewhere up to len(b) otherwise).
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return i
	}
	switch b[i] {
	case '"':
		if j := skipString(b, i); j >= 0 {
			return j
		}
		return len(b)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				if i = skipString(b, i); i < 0 {
					return len(b)
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return i
	}
	for i < len(b) {
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
		i++
	}
	return i
}

// keyIs reports whether the raw contents of a JSON string (between its
// quotes, escapes undone) equal want, which is ASCII without '"' or '\\'.
// Only a \u escape below 0x80 can stand for one of want's bytes.
func keyIs(raw []byte, want string) bool {
	j := 0
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c == '\\' {
			if i+6 > len(raw) || raw[i+1] != 'u' {
				return false
			}
			r := 0
			for _, h := range raw[i+2 : i+6] {
				switch {
				case h >= '0' && h <= '9':
					r = r<<4 | int(h-'0')
				case h >= 'a' && h <= 'f':
					r = r<<4 | int(h-'a'+10)
				case h >= 'A' && h <= 'F':
					r = r<<4 | int(h-'A'+10)
				default:
					return false
				}
			}
			if r >= 0x80 {
				return false
			}
			c = byte(r)
			i += 5
		}
		if j >= len(want) || c != want[j] {
			return false
		}
		j++
	}
	return j == len(want)
}
