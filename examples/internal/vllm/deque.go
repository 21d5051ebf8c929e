package vllm

// deque is a FIFO of requests with a cheap push to the front (for preempted requests).
// It is a ring buffer that grows by doubling.
type deque struct {
	buf  []*Request
	head int
	n    int
}

func (d *deque) len() int { return d.n }

func (d *deque) grow() {
	if d.n < len(d.buf) {
		return
	}
	nb := make([]*Request, max(16, 2*len(d.buf)))
	for i := 0; i < d.n; i++ {
		nb[i] = d.buf[(d.head+i)%len(d.buf)]
	}
	d.buf, d.head = nb, 0
}

func (d *deque) pushBack(q *Request) {
	d.grow()
	d.buf[(d.head+d.n)%len(d.buf)] = q
	d.n++
}

func (d *deque) pushFront(q *Request) {
	d.grow()
	d.head = (d.head - 1 + len(d.buf)) % len(d.buf)
	d.buf[d.head] = q
	d.n++
}

func (d *deque) front() *Request { return d.buf[d.head] }

func (d *deque) popFront() *Request {
	q := d.buf[d.head]
	d.buf[d.head] = nil
	d.head = (d.head + 1) % len(d.buf)
	d.n--
	return q
}

func (d *deque) appendTo(dst []*Request) []*Request {
	for i := 0; i < d.n; i++ {
		dst = append(dst, d.buf[(d.head+i)%len(d.buf)])
	}
	return dst
}

// at returns the i-th request from the front.
func (d *deque) at(i int) *Request { return d.buf[(d.head+i)%len(d.buf)] }

// set stores q as the i-th request from the front.
func (d *deque) set(i int, q *Request) { d.buf[(d.head+i)%len(d.buf)] = q }

// insertSorted inserts q after every request that does not go after it (less(q, x)
// false), scanning from the back: arrivals usually belong near the back.
func (d *deque) insertSorted(q *Request, less func(a, b *Request) bool) {
	d.pushBack(q)
	i := d.n - 1
	for ; i > 0 && less(q, d.at(i-1)); i-- {
		d.set(i, d.at(i-1))
	}
	d.set(i, q)
}

// remove deletes q from the deque, keeping the order; it reports whether q was there.
func (d *deque) remove(q *Request) bool {
	for i := 0; i < d.n; i++ {
		if d.at(i) != q {
			continue
		}
		for ; i < d.n-1; i++ {
			d.set(i, d.at(i+1))
		}
		d.set(d.n-1, nil)
		d.n--
		return true
	}
	return false
}
