// Package policy loads runwarden's Rego policies, checks them (they must
// compile and pass their own tests), and evaluates the admission decision
// for a pod with a query prepared once per policy set.
//
// # The decision cache
//
// Runner pods of one template differ mostly where no policy looks (a
// task's labels, a generated name, its variables' values), so a set caches
// its decisions, under a key that holds only what the policies can read.
//
// The key. When a set loads, inputReads (reads.go) finds in the policies'
// syntax every part of the input they can read, as paths of keys: a
// reference's constant keys (input.pod.spec.hostPID); object.get's
// constant key or path, and whether the object it reads from is there; the
// keys read through a rule that only names a part of the input (an alias,
// aliases.go); for a list iterated element by element, its number of
// elements and the fields its elements are read by (elements.go). A path
// built at run time stops at its constant prefix, read whole. A decision's
// key is the SHA-256 of the input's values at those paths, read from the
// input's JSON (projection, cache.go), a missing value told apart from any
// present one.
//
// Why a decision may be reused. The policies decide from the input and
// their own rules, nothing else (a set loads no data documents). So two
// inputs with the same values at every path the policies read get the same
// decision, as long as: the paths cover every read; every built-in the set
// calls returns the same for the same arguments (pureBuiltins in
// builtins.go, an allow-list reviewed for this OPA version, which a new
// OPA's built-ins join only once reviewed); and every call means what its
// syntax says. The analysis may find more reads than the policies make (a
// part read whole, every element of a list), never fewer: more only
// shares decisions less. A decision is cached as the policies wrote it and
// redacted for each pod it is served to; each set has its own cache.
//
// What makes a set uncacheable. Where the analysis cannot bound a read or
// trust a call, it turns the cache off for the whole set and says where
// and why (CacheOff, one of CacheOffForms): a read of the whole input
// (input, input[k] with a key that is not a constant); a call of a
// built-in not in the allow-list, as a term or a statement; a with that
// mocks a function with such a built-in, or that replaces a built-in or a
// function named without its data. path; a rule or an import that takes a
// name a built-in's starts with (object, array, time). Nothing else does.
package policy
