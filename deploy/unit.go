package deploy

import (
	"bufio"
	"bytes"
	"fmt"
	"strings"
)

// Unit is a parsed systemd unit file: section, then key, then every value
// the key was given, in order (a key such as ExecStartPre or
// ReadWritePaths may repeat; an empty assignment resets the list, as
// systemd does).
type Unit map[string]map[string][]string

// ParseUnit reads a unit file: [Section] headers, Key=Value lines,
// comments (# and ;) and lines continued with a trailing backslash.
func ParseUnit(b []byte) (Unit, error) {
	u := Unit{}
	var sec map[string][]string
	sc := bufio.NewScanner(bytes.NewReader(b))
	var cont strings.Builder
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if cont.Len() == 0 && (line == "" || line[0] == '#' || line[0] == ';') {
			continue
		}
		if l, ok := strings.CutSuffix(line, `\`); ok {
			cont.WriteString(l + " ")
			continue
		}
		if cont.Len() > 0 {
			line = cont.String() + line
			cont.Reset()
		}
		if line[0] == '[' {
			if !strings.HasSuffix(line, "]") || len(line) < 3 {
				return nil, fmt.Errorf("line %d: bad section header %q", n, line)
			}
			name := line[1 : len(line)-1]
			if u[name] == nil {
				u[name] = map[string][]string{}
			}
			sec = u[name]
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" {
			return nil, fmt.Errorf("line %d: want Key=Value, got %q", n, line)
		}
		if sec == nil {
			return nil, fmt.Errorf("line %d: %s outside a section", n, k)
		}
		if v == "" {
			sec[k] = []string{}
			continue
		}
		sec[k] = append(sec[k], v)
	}
	if cont.Len() > 0 {
		return nil, fmt.Errorf("the file ends in a continued line")
	}
	return u, sc.Err()
}

// Get is the last value of section's key and whether it was set.
func (u Unit) Get(section, key string) (string, bool) {
	vs, ok := u[section][key]
	if !ok {
		return "", false
	}
	if len(vs) == 0 {
		return "", true
	}
	return vs[len(vs)-1], true
}
