package steps

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// stepFiles are the files a step writes its outputs ($GITHUB_OUTPUT), env
// for later steps ($GITHUB_ENV) and PATH additions ($GITHUB_PATH) to.
type stepFiles struct {
	index             int
	output, env, path string
}

func newStepFiles(dir string, i int) (*stepFiles, error) {
	f := &stepFiles{index: i}
	f.output = filepath.Join(dir, fmt.Sprintf("output-%d", i))
	f.env = filepath.Join(dir, fmt.Sprintf("env-%d", i))
	f.path = filepath.Join(dir, fmt.Sprintf("path-%d", i))
	for _, p := range []string{f.output, f.env, f.path} {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// read reads what the step wrote.
func (f *stepFiles) read() (outputs, env map[string]string, path []string, err error) {
	if outputs, err = readPairs(f.output, "$GITHUB_OUTPUT"); err != nil {
		return nil, nil, nil, err
	}
	if env, err = readPairs(f.env, "$GITHUB_ENV"); err != nil {
		return nil, nil, nil, err
	}
	b, err := os.ReadFile(f.path)
	if err != nil {
		return nil, nil, nil, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			path = append([]string{l}, path...)
		}
	}
	return outputs, env, path, nil
}

// readPairs reads a file of NAME=value lines and multi-line values written
// as NAME<<DELIMITER, the lines, then DELIMITER alone on a line.
func readPairs(file, what string) (map[string]string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64*1024), 4<<20)
	n := 0
	for sc.Scan() {
		n++
		l := strings.TrimSuffix(sc.Text(), "\r")
		if strings.TrimSpace(l) == "" {
			continue
		}
		eq, heredoc := strings.Index(l, "="), strings.Index(l, "<<")
		switch {
		case eq > 0 && (heredoc < 0 || eq < heredoc):
			out[l[:eq]] = l[eq+1:]
		case heredoc > 0:
			name, delim := l[:heredoc], l[heredoc+2:]
			if delim == "" {
				return nil, fmt.Errorf("%s line %d: %q has no delimiter after <<", what, n, l)
			}
			var lines []string
			closed := false
			for sc.Scan() {
				n++
				v := strings.TrimSuffix(sc.Text(), "\r")
				if v == delim {
					closed = true
					break
				}
				lines = append(lines, v)
			}
			if !closed {
				return nil, fmt.Errorf("%s: the value of %s is not closed by a line %q", what, name, delim)
			}
			out[name] = strings.Join(lines, "\n")
		default:
			return nil, fmt.Errorf("%s line %d: %q is neither NAME=value nor NAME<<DELIMITER", what, n, l)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}
