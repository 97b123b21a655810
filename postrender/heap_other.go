//go:build !linux

package main

// prepareHeap does nothing where transparent huge pages do not exist.
func prepareHeap(int) {}
