// Package queue provides Ring, a bounded, lock-free, generic FIFO for many
// producers and many consumers, after Dmitry Vyukov's bounded MPMC queue.
//
// The model: a power-of-two array of cells, each with a "turn" word, and two
// positions (enqueue and dequeue) that producers and consumers claim with a
// compare-and-swap. The turn of a cell says whose move it is for the
// position the cell serves next — empty and waiting for that position's
// producer, or full and waiting for its consumer — so a producer and a
// consumer never touch the same cell at the same time, and neither ever
// blocks: TryPush reports false when the ring is full, TryPop when nothing is
// available.
//
// What callers must know:
//
//   - Capacity is rounded up to a power of two; NewRing panics (like make) on
//     a capacity outside [1, MaxCapacity], and CheckCapacity validates an
//     untrusted one without panicking.
//   - A failed TryPop means "nothing available now", not "empty": a producer
//     descheduled between claiming a cell and publishing it holds back the
//     cells behind it until it runs again (FIFO order is kept at that price).
//     Len tells the two apart. Do not spin on TryPop.
//   - Popped cells are cleared, so the ring does not keep values alive.
//   - Operations never allocate.
//
// The package knows nothing of bands, saturation or flow control; the
// flowcontrol package builds its per-band queues from it.
package queue
