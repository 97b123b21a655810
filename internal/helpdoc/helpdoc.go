// Package helpdoc checks that a command's documentation names every flag
// its --help lists, so the docs stay true to the code.
package helpdoc

import (
	"os"
	"regexp"
	"strings"
)

// flagLine matches a flag in the help the standard flag package prints:
// two spaces, a dash, the name.
var flagLine = regexp.MustCompile(`(?m)^  -([a-zA-Z0-9][a-zA-Z0-9-]*)`)

// Flags lists the flag names in a --help output.
func Flags(help string) []string {
	var names []string
	for _, m := range flagLine.FindAllStringSubmatch(help, -1) {
		names = append(names, m[1])
	}
	return names
}

// Missing returns the flags of help that none of the documentation files
// mention as --name or -name.
func Missing(help string, docFiles ...string) ([]string, error) {
	var docs strings.Builder
	for _, f := range docFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		docs.Write(b)
	}
	var missing []string
	for _, name := range Flags(help) {
		if !regexp.MustCompile(`(^|[^a-zA-Z0-9-])--?` + regexp.QuoteMeta(name) + `([^a-zA-Z0-9-]|$)`).MatchString(docs.String()) {
			missing = append(missing, name)
		}
	}
	return missing, nil
}
