// Package queue provides a bounded, lock-free, generic ring queue for many producers and consumers.
package queue
