package main

import (
	"bufio"
	"io"
	"log"
	"os"
	"strings"
)

// dedupStderr routes what the Kustomize library prints on standard error
// (deprecation warnings, written to os.Stderr or through package log)
// through a filter that drops lines already printed: the input's groups are
// built separately, and each build would print the same warnings again
// where `kustomize build` prints them once. The returned function flushes
// and restores standard error.
func dedupStderr() func() {
	real := os.Stderr
	r, w, err := os.Pipe()
	if err != nil {
		return func() {}
	}
	os.Stderr = w
	log.SetOutput(w)
	done := make(chan struct{})
	go func() {
		defer close(done)
		copyOnce(real, r)
	}()
	return func() {
		os.Stderr = real
		log.SetOutput(real)
		_ = w.Close()
		<-done
		_ = r.Close()
	}
}

// copyOnce copies lines from r to w, each distinct line once.
func copyOnce(w io.Writer, r io.Reader) {
	seen := map[string]bool{}
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadString('\n') // any length, unlike a Scanner
		if line = strings.TrimSuffix(line, "\n"); line != "" && !seen[line] {
			seen[line] = true
			_, _ = io.WriteString(w, line+"\n")
		}
		if err != nil {
			return
		}
	}
}
