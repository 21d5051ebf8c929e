package queue_test

import (
	"fmt"

	"github.com/flowgate/flowgate/queue"
)

func ExampleNewRing() {
	r := queue.NewRing[string](3) // rounded up to a power of two
	fmt.Println(r.Cap())
	if err := queue.CheckCapacity(0); err != nil {
		fmt.Println(err) // what NewRing(0) would panic with
	}
	// Output:
	// 4
	// queue: capacity out of range: capacity 0 is not in [1, 1073741824]
}

func ExampleRing() {
	r := queue.NewRing[int](2)
	fmt.Println(r.TryPush(1), r.TryPush(2), r.TryPush(3)) // the third does not fit
	fmt.Println(r.Len())
	v, ok := r.TryPop()
	fmt.Println(v, ok)
	v, ok = r.TryPop()
	fmt.Println(v, ok)
	v, ok = r.TryPop() // empty: zero value, false
	fmt.Println(v, ok)
	// Output:
	// true true false
	// 2
	// 1 true
	// 2 true
	// 0 false
}

func ExampleRing_TryPopN() {
	r := queue.NewRing[string](8)
	for _, s := range []string{"a", "b", "c", "d", "e"} {
		r.TryPush(s)
	}
	burst := make([]string, 3) // take at most three per call
	for n := r.TryPopN(burst); n > 0; n = r.TryPopN(burst) {
		fmt.Println(burst[:n])
	}
	// Output:
	// [a b c]
	// [d e]
}
